"""delay: a model with a configurable service time, to make a replica slow, stall or fail.

Input ``PAYLOAD`` (FP32, any length); output ``NBYTES`` (INT64 [1]) = the payload's size in
bytes. Each request takes

    base_delay_ms + per_32kib_ms * bytes / 32 KiB            (model config parameters)
    + delay_ms + uniform(0, jitter_ms)                        (behaviour control file)
    + spike_ms, on a random spike_rate share of requests      (behaviour control file)
    + the part of any scheduled pause the request overlaps    (behaviour control file)

The behaviour control file is JSON, ``{"models": {"<model name>": {"delay_ms": 0,
"jitter_ms": 0, "spike_ms": 0, "spike_rate": 0, "pauses": [], "fail": false,
"stall": false}}, "stopping": false}``, at the path in the
environment variable
``MESHD_DEVTRITON_CONTROL`` (set by meshd.dev.triton for each server, so every server has its own
and the test process can change a running replica). The file is re-read at most every 50 ms,
when a request comes, so the per-request cost stays a clock read. ``fail`` answers each request
with an error; ``spike_ms`` / ``spike_rate`` make rare long requests (a GC pause, a page
fault storm: the tail that hedging is for); ``pauses`` (``[[start, end], ...]`` on the
machine's monotonic clock, which every process shares) freeze the replica on a schedule: a
request in service when a pause begins, or starting during one, is held until it ends, and
the queue behind it waits too - the same stalls at the same moments for every run of a
benchmark, where ``spike_rate`` draws them by chance; ``stall`` holds requests until it is cleared
(giving up with an error after 60 s). ``stopping`` (set just before the server is sent
SIGTERM) ends stalls and long delays at once, so Triton can drain and exit instead of
waiting for them. Without the variable or the file the model just uses its config
parameters.
"""

import json
import os
import random
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CONTROL_ENV = "MESHD_DEVTRITON_CONTROL"
REFRESH_S = 0.05  # re-read the control file at most this often
STALL_POLL_S = 0.01
STALL_LIMIT_S = 60.0  # a stalled request gives up (with an error) after this long


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        params = json.loads(args["model_config"]).get("parameters", {})

        def param(key, default):
            return float(params.get(key, {}).get("string_value", default))

        self.base_s = param("base_delay_ms", 2.0) / 1000.0
        self.per_byte_s = param("per_32kib_ms", 0.0) / 1000.0 / 32768.0
        self.control = os.environ.get(CONTROL_ENV)
        self.behaviour = {}
        self.stopping = False
        self.read_at = float("-inf")

    def _current(self):
        """The behaviour for this model, re-read from the control file at most every 50 ms."""
        now = time.monotonic()
        if self.control and now - self.read_at >= REFRESH_S:
            self.read_at = now
            try:
                with open(self.control, encoding="utf-8") as f:
                    doc = json.load(f)
                self.behaviour = doc.get("models", {}).get(self.name, {})
                self.stopping = bool(doc.get("stopping"))
            except FileNotFoundError:
                self.behaviour, self.stopping = {}, False
            except (OSError, ValueError):
                pass  # keep the last good one (writers replace the file atomically anyway)
        return self.behaviour

    def _serve(self, request):
        started = time.monotonic()
        behaviour = self._current()
        while behaviour.get("stall"):
            if self.stopping or time.monotonic() - started >= STALL_LIMIT_S:
                why = "server stopping" if self.stopping else f"{STALL_LIMIT_S:.0f} s"
                return pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{self.name}: stalled ({why}): model instance "
                                               "unhealthy")
                )
            time.sleep(STALL_POLL_S)
            behaviour = self._current()
        if behaviour.get("fail"):
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"{self.name}: injected failure (behaviour fail=true): "
                                           "model instance unhealthy")
            )
        nbytes = pb_utils.get_input_tensor_by_name(request, "PAYLOAD").as_numpy().nbytes
        delay = self.base_s + self.per_byte_s * nbytes + float(behaviour.get("delay_ms", 0)) / 1e3
        jitter_ms = float(behaviour.get("jitter_ms", 0))
        if jitter_ms > 0:
            delay += random.uniform(0.0, jitter_ms) / 1e3
        spike_rate = float(behaviour.get("spike_rate", 0))
        if spike_rate > 0 and random.random() < spike_rate:
            delay += float(behaviour.get("spike_ms", 0)) / 1e3
        end = started + delay
        for start, stop in behaviour.get("pauses", ()):
            if start < end and stop > started:  # the service overlaps the pause: frozen for it
                end += stop - max(start, started)
        while not self.stopping:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(remaining, REFRESH_S))  # long delays end early when stopping
            self._current()
        out = pb_utils.Tensor("NBYTES", np.array([nbytes], dtype=np.int64))
        return pb_utils.InferenceResponse(output_tensors=[out])

    def execute(self, requests):
        if self._current().get("fail"):
            # Raised, not answered with error responses: Triton counts a Python model's error
            # *responses* as successes in its statistics and metrics (triton-inference-server/
            # server#7713), so only a raised error looks like the broken backend it stands for.
            # "unhealthy": a replica's fault in the router's words (meshd/router/blame.py), as
            # a real broken backend's "Stub process ... is not healthy" is.
            raise pb_utils.TritonModelException(
                f"{self.name}: injected failure (behaviour fail=true): model instance unhealthy")
        return [self._serve(request) for request in requests]
