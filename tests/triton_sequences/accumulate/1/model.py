"""A stateful sequence model: OUTPUT is the running sum of INPUT over the sequence so far.

The state lives in this server alone (keyed by the request's correlation id), which is the
point: a request that reaches a replica other than the one that took its sequence's START gets
a wrong sum or an error, so a test can tell whether every request of a sequence arrived at one
place.
``accumulate`` and ``accumulate_str`` (the same file) are used with integer and string sequence
ids.  (The id comes from ``request.correlation_id()``, not a CORRID control: Triton 2.51 fails a
STRING CORRID control in a batch of two.)
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
            corrid = request.correlation_id()
            if bool(_scalar(request, "START")):
                self.sums[corrid] = np.zeros(value.shape[1:], dtype=np.int64)
            if corrid not in self.sums:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"accumulate: no state for sequence {corrid!r} on this server")))
                continue
            total = self.sums[corrid] + value[0]
            if bool(_scalar(request, "END")):
                del self.sums[corrid]
            else:
                self.sums[corrid] = total
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", total.reshape(1, -1).astype(np.int64))]))
        return responses
