"""simple_sequence: OUTPUT = INPUT, plus 1 on a sequence's START request.

The output itself needs no state, but the model keeps one entry per live sequence (keyed by
``request.correlation_id()``, an int or a str) and fails any non-START request of a sequence it
did not see start - which is what a router that loses sequence affinity would cause. Requests
with READY = 0 are the direct batcher's fillers for empty slots: answered, otherwise ignored.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

IDLE_S = 60.0  # forget sequences idle this long (Triton's own idle timeout is 10 s)


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False


class TritonPythonModel:
    def initialize(self, args):
        self.live = {}  # correlation id -> time of its last request

    def execute(self, requests):
        now = time.monotonic()
        for key in [k for k, t in self.live.items() if now - t > IDLE_S]:
            del self.live[key]
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if not _flag(request, "READY"):
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT", np.zeros_like(value))]))
                continue
            corrid = request.correlation_id()
            start, end = _flag(request, "START"), _flag(request, "END")
            if not start and corrid not in self.live:
                error = pb_utils.TritonError(
                    f"simple_sequence: sequence {corrid!r} was not started on this instance")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if end:
                self.live.pop(corrid, None)
            else:
                self.live[corrid] = now
            out = (value + (1 if start else 0)).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
