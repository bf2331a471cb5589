"""add_sub: the classic Triton Python-backend example.

OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, element-wise, FP32. With
``max_batch_size: 8`` and dynamic batching, one ``execute`` call may carry several requests;
each gets its own response. Kept minimal so its latency is Triton's own per-request overhead.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.shape != b.shape:
                error = pb_utils.TritonError(f"INPUT0 shape {a.shape} != INPUT1 shape {b.shape}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", a + b),
                        pb_utils.Tensor("OUTPUT1", a - b),
                    ]
                )
            )
        return responses
