"""A client library that asks the local agent where to send, then calls that Triton directly:
no proxy hop, tritonclient's own request building and results.

Two modes:

- ``watch`` (default): the agent streams each model's target weights (``WatchTargets``) to a
  background thread; each request picks locally, by power-of-two choices over the weights
  and this client's own in-flight counts, so it costs no agent round trip.  Outcomes are
  reported to the agent in batches over one ``ReportOutcomes`` stream, every
  ``REPORT_EVERY`` seconds, so the agent's latency estimates stay fed: a unary report per
  request doubled the caller's CPU and added a third of a millisecond to every call
  (``bench/router_overhead``, the client row).
- ``score``: every request asks ``ScoreTargets`` first (one loopback round trip): the agent's
  admission (RESOURCE_EXHAUSTED with retry-after), its ranking and its hedge delay.

Both fail over to the next target when a replica is unreachable::

    client = MeshClient()                   # the agent's score API on 127.0.0.1:7961
    result = client.infer("resnet", inputs) # tritonclient.grpc.InferInput objects
    client.close()
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from proto.mesh.v1 import score_pb2, score_pb2_grpc

FAILOVER = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"})
FIRST_WEIGHTS_TIMEOUT = 2.0
REPORT_EVERY = 0.005
"""Seconds between batches of outcomes sent to the agent (none sent while there are none)."""
MAX_BATCH = 1024
"""Outcomes per batch at most (the agent's limit on one message is far above)."""
RESTREAM_AFTER = 0.5
"""Seconds before a broken report stream is opened again (its batches in flight are lost:
outcomes are estimates' food, not acknowledged writes)."""


class NoTarget(InferenceServerException):
    """The agent knows no ready replica of the model, or shed the request."""


@dataclass(slots=True)
class _Weights:
    targets: list[tuple[str, str, float]] = field(default_factory=list)
    """(endpoint, replica, weight)"""
    ready: threading.Event = field(default_factory=threading.Event)
    stream: Any = None


class MeshClient:
    def __init__(self, agent: str = "127.0.0.1:7961", *, tenant: str = "",
                 slo_class: str = "", mode: str = "watch", rng: random.Random | None = None
                 ) -> None:
        if mode not in ("watch", "score"):
            raise ValueError("mode must be 'watch' or 'score'")
        self.mode = mode
        self.tenant = tenant
        self.slo_class = slo_class
        self._channel = grpc.insecure_channel(agent)
        self._stub = score_pb2_grpc.ScoreStub(self._channel)
        self._clients: dict[str, tc.InferenceServerClient] = {}
        self._weights: dict[tuple[str, str], _Weights] = {}
        self._inflight: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._closed = False
        self._pending: list[score_pb2.OutcomeReport] = []
        self._sender: threading.Thread | None = None

    # --- targets ----------------------------------------------------------------------------

    def _watch(self, model: str, version: str) -> _Weights:
        key = (model, version)
        with self._lock:
            w = self._weights.get(key)
            if w is not None:
                return w
            w = self._weights[key] = _Weights()
        w.stream = self._stub.WatchTargets(score_pb2.WatchRequest(model=model,
                                                                  revision=version))
        threading.Thread(target=self._follow, args=(w,), daemon=True,
                         name=f"meshd-watch-{model}").start()
        return w

    def _follow(self, w: _Weights) -> None:
        try:
            for msg in w.stream:
                w.targets = [(t.target.endpoint, t.target.replica, t.weight)
                             for t in msg.targets]
                w.ready.set()
        except grpc.RpcError:
            if not self._closed:
                w.targets = []
            w.ready.set()

    def _ranked(self, model: str, version: str) -> list[tuple[str, str]]:
        """Targets best first: p2c over weight / (1 + own in-flight), then the rest."""
        w = self._watch(model, version)
        w.ready.wait(FIRST_WEIGHTS_TIMEOUT)
        targets = list(w.targets)
        if not targets:
            return []
        inflight = self._inflight

        def load(t: tuple[str, str, float]) -> float:
            return (1 + inflight.get(t[1], 0)) / max(t[2], 1e-9)

        rest = sorted(targets, key=load)
        if len(targets) > 1:
            a, b = self._rng.sample(targets, 2)
            first = a if load(a) <= load(b) else b
            rest.remove(first)
            rest.insert(0, first)
        return [(e, r) for e, r, _ in rest]

    def _client(self, endpoint: str) -> tc.InferenceServerClient:
        c = self._clients.get(endpoint)
        if c is None:
            c = self._clients[endpoint] = tc.InferenceServerClient(endpoint)
        return c

    # --- inference --------------------------------------------------------------------------

    def infer(self, model_name: str, inputs: Sequence[tc.InferInput],
              outputs: Sequence[tc.InferRequestedOutput] | None = None,
              model_version: str = "", client_timeout: float | None = None,
              **kwargs: Any) -> tc.InferResult:
        """tritonclient's ``infer``, sent to the replica the agent's view favours."""
        decision = 0
        if self.mode == "score":
            payload = sum(len(i._get_content() or b"") for i in inputs)
            try:
                reply = self._stub.ScoreTargets(score_pb2.ScoreRequest(
                    model=model_name, revision=model_version, payload_bytes=payload,
                    tenant=self.tenant, slo_class=self.slo_class,
                    deadline_seconds=client_timeout or 0.0, idempotent=True), timeout=5)
            except grpc.RpcError as exc:
                raise InferenceServerException(f"score API: {exc.details()}",
                                               status=str(exc.code())) from None
            if not reply.verdict.admit:
                status = ("StatusCode.UNAVAILABLE" if reply.verdict.reason == "no_targets"
                          else "StatusCode.RESOURCE_EXHAUSTED")
                raise NoTarget(f"{model_name}: {reply.verdict.reason}, retry after "
                               f"{reply.verdict.retry_after_seconds:.3f} s", status=status)
            decision = reply.decision_id
            ranked = [(t.endpoint, t.replica) for t in reply.targets]
        else:
            ranked = self._ranked(model_name, model_version)
        if not ranked:
            raise NoTarget(f"no ready replica of model {model_name!r}",
                           status="StatusCode.UNAVAILABLE")
        last: InferenceServerException | None = None
        for i, (endpoint, replica) in enumerate(ranked):
            self._inflight[replica] = self._inflight.get(replica, 0) + 1
            t0 = time.monotonic()
            try:
                result = self._client(endpoint).infer(
                    model_name, inputs, model_version=model_version, outputs=outputs,
                    client_timeout=client_timeout, **kwargs)
            except InferenceServerException as exc:
                code = exc.status() or ""
                self._report(decision, replica, time.monotonic() - t0,
                             score_pb2.OUTCOME_UNAVAILABLE if code in FAILOVER
                             else score_pb2.OUTCOME_ERROR, last=code not in FAILOVER
                             or i == len(ranked) - 1)
                if code not in FAILOVER:
                    raise
                last = exc
                continue
            finally:
                self._inflight[replica] -= 1
            self._report(decision, replica, time.monotonic() - t0, score_pb2.OUTCOME_OK,
                         last=True)
            return result
        assert last is not None
        raise last

    def _report(self, decision: int, replica: str, latency: float,
                status: score_pb2.OutcomeStatus,
                last: bool) -> None:
        """Queued for the next batch: the caller never waits for the agent."""
        report = score_pb2.OutcomeReport(decision_id=decision, replica=replica,
                                         latency_seconds=latency, status=status, last=last)
        with self._lock:
            self._pending.append(report)
            if self._sender is None:
                self._sender = threading.Thread(target=self._send, name="meshd-client-reports",
                                                daemon=True)
                self._sender.start()

    def _send(self) -> None:
        """The report stream, opened again after a break until the client closes."""
        while not self._closed:
            try:
                self._stub.ReportOutcomes(self._batches())
            except grpc.RpcError:
                if self._closed:
                    return
                time.sleep(RESTREAM_AFTER)

    def _batches(self) -> Any:
        """What was reported since the last batch, every ``REPORT_EVERY`` (a sleep, not a
        wake-up per outcome: the caller's thread is not made to hand over the GIL per
        request); the rest at close."""
        while True:
            closing = self._closed
            if not closing:
                time.sleep(REPORT_EVERY)
            with self._lock:
                pending, self._pending = self._pending, []
            for i in range(0, len(pending), MAX_BATCH):
                yield score_pb2.OutcomeBatch(reports=pending[i:i + MAX_BATCH])
            if closing:
                return

    def close(self) -> None:
        self._closed = True
        sender = self._sender
        if sender is not None:
            sender.join(timeout=2 * REPORT_EVERY + 1.0)  # the last batch goes out
        for w in self._weights.values():
            if w.stream is not None:
                w.stream.cancel()
        for c in self._clients.values():
            c.close()
        self._channel.close()
