"""simple_dyna_sequence: OUTPUT = INPUT, plus 1 on START, plus the correlation id on END.

The correlation id comes from the CORRID control (UINT64). One entry per live sequence (keyed
by that id) lets the model fail a non-START request of a sequence it did not see start, as a
router that loses sequence affinity would cause. READY = 0 requests are ignored fillers.
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
        self.live = {}  # correlation id -> time of its last request

    def execute(self, requests):
        now = time.monotonic()
        for key in [k for k, t in self.live.items() if now - t > IDLE_S]:
            del self.live[key]
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if not _scalar(request, "READY"):
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT", np.zeros_like(value))]))
                continue
            corrid = int(_scalar(request, "CORRID"))
            start, end = bool(_scalar(request, "START")), bool(_scalar(request, "END"))
            if not start and corrid not in self.live:
                error = pb_utils.TritonError(
                    f"simple_dyna_sequence: sequence {corrid} was not started on this instance")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = value.astype(np.int64) + (1 if start else 0)
            if end:
                self.live.pop(corrid, None)
                out = out + corrid
            else:
                self.live[corrid] = now
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", out.astype(np.int32))]))
        return responses
