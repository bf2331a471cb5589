"""repeat_int32 (decoupled): one response per element of IN, then the final flag.

Response ``i`` carries OUT = [IN[i]] and IDX = [i] and is sent DELAY[i] ms after the previous
one; the final (empty) response follows WAIT ms after the last. Each request is served by its
own thread, so several streams run at once and ``execute`` returns immediately.
"""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().reshape(-1)
            sender = request.get_response_sender()
            if len(delays) != len(values) or len(wait) != 1:
                error = pb_utils.TritonError(
                    f"repeat_int32: DELAY has {len(delays)} elements for {len(values)} in IN "
                    f"and WAIT must have 1 (has {len(wait)})")
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            thread = threading.Thread(target=self._repeat, daemon=True,
                                      args=(sender, values, delays, int(wait[0])))
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def _repeat(self, sender, values, delays, wait_ms):
        try:
            for i, (value, delay_ms) in enumerate(zip(values, delays, strict=True)):
                if self.stopping.wait(int(delay_ms) / 1000) or sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
                ]))
            else:
                self.stopping.wait(wait_ms / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - the client went away: nothing to tell it
            pass
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def finalize(self):
        self.stopping.set()
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)
