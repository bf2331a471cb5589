"""simple: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32, element-wise).

``auto_complete_config`` fills in the inputs and outputs when a load request overrides the
whole configuration (``simple_*_model_control`` loads it with ``{"max_batch_size": "16"}``).
"""

import triton_python_backend_utils as pb_utils

_TENSORS = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = {t["name"] for t in config.as_dict().get("input", [])}
        have |= {t["name"] for t in config.as_dict().get("output", [])}
        for name in _TENSORS:
            if name not in have:
                spec = {"name": name, "data_type": "TYPE_INT32", "dims": [16]}
                (config.add_input if name.startswith("IN") else config.add_output)(spec)
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
