"""simple_string_dyna_sequence: OUTPUT = running sum of INPUT, plus int(id) on END.

The correlation id is ``request.correlation_id()``: a string sequence id holding a decimal
integer. (No CORRID control: Triton 2.51 rejects a STRING CORRID control in a batching model with
"unexpected number of string elements 2 for inference input 'CORRID'".) The running sum lives
in a per-sequence entry keyed by that id, set on START and dropped on END; a non-START request
of a sequence this instance did not see start fails, as a router that loses sequence affinity
would cause. READY = 0 requests are the batcher's fillers: answered, otherwise ignored.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

IDLE_S = 60.0  # forget sequences idle this long (Triton's own idle timeout is 10 s)


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor.as_numpy().reshape(-1)[0] if tensor is not None else 0


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}  # correlation id (str) -> [running sum, time of its last request]

    def execute(self, requests):
        now = time.monotonic()
        for key in [k for k, (_, t) in self.sums.items() if now - t > IDLE_S]:
            del self.sums[key]
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if not _scalar(request, "READY"):
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT", np.zeros_like(value))]))
                continue
            corrid = str(request.correlation_id())
            start, end = bool(_scalar(request, "START")), bool(_scalar(request, "END"))
            try:
                number = int(corrid)
            except ValueError:
                error = pb_utils.TritonError(
                    f"simple_string_dyna_sequence: sequence id {corrid!r} is not an integer")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if start:
                self.sums[corrid] = [0, now]
            elif corrid not in self.sums:
                error = pb_utils.TritonError(f"simple_string_dyna_sequence: sequence "
                                             f"{corrid!r} was not started on this instance")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            entry = self.sums[corrid]
            entry[0] += int(value.reshape(-1)[0])
            entry[1] = now
            out = entry[0]
            if end:
                del self.sums[corrid]
                out += number
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.full(value.shape, out, dtype=np.int32))]))
        return responses
