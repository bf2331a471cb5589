"""A stateful sequence model: OUTPUT is the running sum of INPUT over the sequence so far.

The state lives in this server alone (keyed by the CORRID control), which is the point: a
request that reaches a replica other than the one that took its sequence's START gets a wrong
sum or an error, so a test can tell whether every request of a sequence arrived at one place.
``accumulate`` takes integer sequence ids, ``accumulate_str`` string ids (its CORRID is a
STRING); both share this file.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            corrid = _scalar(request, "CORRID")
            if bool(_scalar(request, "START")):
                self.sums[corrid] = np.zeros_like(value, dtype=np.int64)
            if corrid not in self.sums:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"accumulate: no state for sequence {corrid!r} on this server")))
                continue
            total = self.sums[corrid] + value
            if bool(_scalar(request, "END")):
                del self.sums[corrid]
            else:
                self.sums[corrid] = total
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", total.astype(np.int64))]))
        return responses
