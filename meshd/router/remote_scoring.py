"""The agent's scorer seen from a router worker process, over the score API.

A worker shares the router port with the agent (SO_REUSEPORT) so that more than one core can
parse, validate and relay requests; the scorer stays in the agent, where the fused view,
the decisions and every target's estimates live, so all workers route on one state.

Per request this costs one ``ScoreTargets`` round trip on the agent's Unix socket.
Outcomes are not a round trip each: they are queued and written in batches on one
long-lived ``ReportOutcomes`` stream, reopened if it breaks (a report lost then is a decision
the agent releases at its deadline).  Weights, used only off the hot path (model configs,
``ModelReady``, relayed metadata), come from a ``WatchTargets`` stream per model that is
dropped after a minute without use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from meshd.router.scoring import ScoringUnavailable
from meshd.score.admission import Verdict
from meshd.score.scorer import Choice, Scored, ScoreError, ScoreRequest, Status
from meshd.score_api import choice_of
from proto.mesh.v1 import score_pb2, score_pb2_grpc

log = logging.getLogger("meshd.router")

CALL_TIMEOUT = 2.0
"""Seconds a score API call may take before the request is answered UNAVAILABLE."""
MAX_BATCH = 1024
"""Outcomes written in one message (the agent takes at most 4096)."""
MAX_QUEUED = 65536
"""Outcomes held while the stream is down; beyond this the oldest are dropped."""
REOPEN_DELAY = 0.2
WATCH_IDLE = 60.0
"""Seconds after its last use that a model's weights stream is closed."""


@dataclass(slots=True)
class _Watch:
    weights: list[tuple[Choice, float]] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    used: float = 0.0
    task: asyncio.Task[None] | None = None


class RemoteScoring:
    """A :class:`~meshd.router.scoring.Scoring` over the agent's score API at ``target``
    (a gRPC target such as ``unix:/var/lib/meshd/score.sock``)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = score_pb2_grpc.ScoreStub(self.channel)
        self._outcomes: list[score_pb2.OutcomeReport] = []
        self._wake = asyncio.Event()
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._reporter: asyncio.Task[None] | None = None
        self.dropped = 0
        """Outcomes dropped because the stream stayed down while they piled up."""

    # --- the hot path -----------------------------------------------------------------------

    async def score(self, req: ScoreRequest) -> Scored:
        msg = score_pb2.ScoreRequest(
            model=req.model, revision=req.revision, payload_bytes=req.payload_bytes,
            tenant=req.tenant, slo_class=req.slo_class, deadline_seconds=req.deadline,
            exclude=list(req.exclude), idempotent=req.idempotent)
        try:
            reply = await self.stub.ScoreTargets(msg, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None
        v = reply.verdict
        return Scored([choice_of(t) for t in reply.targets],
                      Verdict(v.admit, v.reason, v.retry_after_seconds),
                      reply.hedge_after_seconds, reply.decision_id, reply.strategy,
                      reply.degraded)

    def report(self, decision_id: int, replica: str, latency: float, status: Status, *,
               hedge: bool = False, last: bool = False) -> None:
        if self._reporter is None:
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())
        queued = self._outcomes
        queued.append(score_pb2.OutcomeReport(
            decision_id=decision_id, replica=replica, latency_seconds=latency,
            status=int(status), hedge=hedge, last=last))  # type: ignore[arg-type]
        if len(queued) > MAX_QUEUED:
            del queued[:len(queued) - MAX_QUEUED]
            self.dropped += 1
        self._wake.set()

    async def _batches(self) -> AsyncIterator[score_pb2.OutcomeBatch]:
        while True:
            if not self._outcomes:
                self._wake.clear()
                await self._wake.wait()
            batch = self._outcomes[:MAX_BATCH]
            del self._outcomes[:MAX_BATCH]
            yield score_pb2.OutcomeBatch(reports=batch)

    async def _report_loop(self) -> None:
        while True:
            try:
                await self.stub.ReportOutcomes(self._batches())
            except grpc.aio.AioRpcError as exc:
                log.warning("outcome stream to the agent broke", extra={
                    "event": "outcome_stream_broken", "code": exc.code().name,
                    "detail": exc.details() or ""})
            await asyncio.sleep(REOPEN_DELAY)

    async def hedge_target(self, decision_id: int, replica: str) -> Choice | None:
        try:
            reply = await self.stub.HedgeTarget(score_pb2.HedgeRequest(
                decision_id=decision_id, replica=replica), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError:
            return None  # no hedge: the first attempt goes on, as it would without one
        return choice_of(reply.target) if reply.found else None

    # --- off the hot path -------------------------------------------------------------------

    async def weights(self, model: str, version: str) -> list[tuple[Choice, float]]:
        now = time.monotonic()
        key = (model, version)
        w = self._watches.get(key)
        if w is None:
            self._sweep(now)
            w = self._watches[key] = _Watch()
            w.task = asyncio.get_running_loop().create_task(self._follow(key, w))
        w.used = now
        if not w.ready.is_set():
            try:
                await asyncio.wait_for(w.ready.wait(), CALL_TIMEOUT)
            except TimeoutError:
                raise ScoringUnavailable("the agent sent no weights for "
                                         f"{model!r} in {CALL_TIMEOUT} s") from None
        return w.weights

    async def _follow(self, key: tuple[str, str], w: _Watch) -> None:
        try:
            async for msg in self.stub.WatchTargets(score_pb2.WatchRequest(
                    model=key[0], revision=key[1])):
                w.weights = [(choice_of(t.target), t.weight) for t in msg.targets]
                w.ready.set()
        except grpc.aio.AioRpcError:
            pass
        w.weights = []
        w.ready.set()
        if self._watches.get(key) is w:  # the next use starts a new watch
            del self._watches[key]

    def _sweep(self, now: float) -> None:
        for key, w in list(self._watches.items()):
            if now - w.used > WATCH_IDLE and w.task is not None:
                w.task.cancel()
                del self._watches[key]

    async def models(self) -> dict[tuple[str, str], bool]:
        try:
            reply = await self.stub.ListModels(score_pb2.ListModelsRequest(),
                                               timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None
        return {(m.model, m.version): m.ready for m in reply.models}

    async def send_counters(self, msg: score_pb2.RouterCounters) -> None:
        try:
            await self.stub.ReportRouterCounters(msg, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None

    async def close(self) -> None:
        tasks = [w.task for w in self._watches.values() if w.task is not None]
        if self._reporter is not None:
            # What is queued goes out first: each report releases a decision's admission.
            deadline = time.monotonic() + 1.0
            while self._outcomes and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            tasks.append(self._reporter)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.channel.close()


def _failure(exc: grpc.aio.AioRpcError) -> Exception:
    details = exc.details() or exc.code().name
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, message = details.partition(": ")
        return ScoreError(field, message or details)
    return ScoringUnavailable(f"the agent's score API: {exc.code().name}: {details}")
