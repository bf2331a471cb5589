"""The agent's scorer seen from a router worker process, over the score API.

A worker shares the router port with the agent (SO_REUSEPORT) so that more than one core can
parse, validate and relay requests; the scorer stays in the agent, where the fused view,
the decisions and every target's estimates live, so all workers route on one state.

The calls every request makes go over the score link (:mod:`meshd.score.link`), one frame
each way on a Unix socket (loopback TCP where there are none): a score, and a hedge target
when one is due.  Outcomes are not a round trip each: those reported before a call go out
in the call's own write, ahead of it (the gateway reports a request's outcomes as it scores
the next one, so the agent takes both on one wake-up), and those left at the end of a turn
of the event loop as one frame (a report lost to a broken link is a decision the agent
releases at its deadline).  A call the agent has not answered in ``CALL_TIMEOUT`` fails
UNAVAILABLE; the calls are swept for that a few times a second, not timed one by one.  The
rest is the gRPC score API: weights, used only off the hot path (model configs,
``ModelReady``, relayed metadata), from a ``WatchTargets`` stream per model that is dropped
after a minute without use; the model list; the counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from meshd.router.dispatch import Outcome
from meshd.router.scoring import ScoringUnavailable
from meshd.score import link as score_link
from meshd.score.scorer import (
    Choice,
    RepositoryRefused,
    Scored,
    ScoreError,
    ScoreRequest,
    Status,
)
from meshd.score.service import choice_of, scored_of
from proto.mesh.v1 import score_pb2, score_pb2_grpc

log = logging.getLogger("meshd.router")

CALL_TIMEOUT = 2.0
"""Seconds a score API call may take before the request is answered UNAVAILABLE."""
REPOSITORY_TIMEOUT = 10.0
"""Seconds the agent may take to write a repository call's pin (a Raft write, forwarded)."""
MAX_BATCH = 1024
"""Outcomes written in one frame (the agent takes at most 4096)."""
WATCH_IDLE = 60.0
"""Seconds after its last use that a model's weights stream is closed."""
SWEEP = 0.25
"""Seconds between looks for calls past ``CALL_TIMEOUT``."""


@dataclass(slots=True)
class _Watch:
    weights: list[tuple[Choice, float]] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    used: float = 0.0
    task: asyncio.Task[None] | None = None


class _Link(asyncio.Protocol):
    """The worker's end of the score link: calls awaiting their reply, by call id."""

    def __init__(self) -> None:
        self.frames = score_link.Frames()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.frames.feed(data)
        except score_link.FrameError as exc:
            log.warning("malformed frame from the agent", extra={
                "event": "score_link_malformed", "detail": str(exc)})
            assert self.transport is not None
            self.transport.close()
            return
        for kind, call, payload in frames:
            fut = self.calls.pop(call, None)
            if fut is not None and not fut.done():
                fut.set_result((kind, payload))
            elif kind == score_link.ERROR:  # a refused report (no call waits for it)
                log.warning("the agent refused outcome reports", extra={
                    "event": "reports_refused", "detail": payload.decode(errors="replace")})

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        calls, self.calls = self.calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(ScoringUnavailable("the score link to the agent closed"))


class RemoteScoring:
    """A :class:`~meshd.router.scoring.Scoring` over the agent's score link at ``link`` (a
    Unix socket path) and its gRPC score API at ``target`` (such as
    ``unix:/var/lib/meshd/score.sock``)."""

    def __init__(self, target: str, link: str) -> None:
        """``link``: a Unix socket path, or ``tcp:HOST:PORT`` (loopback, where the platform
        has no Unix sockets for asyncio)."""
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = score_pb2_grpc.ScoreStub(self.channel)
        self.link_path = link
        self._link: _Link | None = None
        self._connecting: asyncio.Future[_Link] | None = None
        self._next_call = 0
        self._outcomes: list[score_pb2.OutcomeReport] = []
        self._pending: deque[tuple[float, int, asyncio.Future[tuple[int, bytes]], _Link]] = \
            deque()
        """Calls in the order sent, with the time each expires (the sweep's)."""
        self._sweeper: asyncio.TimerHandle | None = None
        self._watches: dict[tuple[str, str], _Watch] = {}
        self.dropped = 0
        """Outcomes dropped because the link was down when they were sent."""

    # --- the hot path -----------------------------------------------------------------------

    def _connect_soon(self) -> asyncio.Future[_Link]:
        """The connection being made (one at a time, shared by the calls that wait)."""
        if self._connecting is None:
            fut = self._connecting = asyncio.ensure_future(self._connect())
            fut.add_done_callback(self._connect_done)
        return self._connecting

    def _connect_done(self, fut: asyncio.Future[_Link]) -> None:
        if self._connecting is fut:
            self._connecting = None
        if not fut.cancelled():
            fut.exception()  # retrieved: a failed connect is retried by the next call

    async def _connect(self) -> _Link:
        loop = asyncio.get_running_loop()
        path = self.link_path
        try:
            if path.startswith("tcp:"):
                host, _, port = path[4:].rpartition(":")
                connect = loop.create_connection(_Link, host.strip("[]"), int(port))
            else:
                connect = loop.create_unix_connection(_Link, path)
            _, link = await asyncio.wait_for(connect, CALL_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ScoringUnavailable(f"cannot reach the agent's score link at "
                                     f"{self.link_path}: {exc}") from None
        self._link = link
        return link

    async def _call(self, kind: int, payload: bytes) -> tuple[int, bytes]:
        link = self._link
        if link is None or link.lost:
            link = await asyncio.shield(self._connect_soon())
        self._next_call = call = (self._next_call + 1) & 0xFFFFFFFF
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        link.calls[call] = fut
        assert link.transport is not None
        data = score_link.frame(kind, call, payload)
        if self._outcomes:  # reported before this call: ahead of it, in the same write
            data = self._report_frames() + data
        link.transport.write(data)
        self._pending.append((loop.time() + CALL_TIMEOUT, call, fut, link))
        if self._sweeper is None:
            self._sweeper = loop.call_later(SWEEP, self._sweep_calls)
        return await fut

    def _sweep_calls(self) -> None:
        """Fail the calls past their time; look again while any are pending."""
        pending = self._pending
        loop = asyncio.get_running_loop()
        now = loop.time()
        while pending:
            expires, call, fut, link = pending[0]
            if expires > now and not fut.done():
                break
            pending.popleft()
            link.calls.pop(call, None)  # answered already, or cancelled, or past its time
            if not fut.done():
                fut.set_exception(ScoringUnavailable(
                    f"the agent did not answer in {CALL_TIMEOUT} s"))
        self._sweeper = loop.call_later(SWEEP, self._sweep_calls) if pending else None

    async def score(self, req: ScoreRequest) -> Scored:
        msg = score_pb2.ScoreRequest(
            model=req.model, revision=req.revision, payload_bytes=req.payload_bytes,
            tenant=req.tenant, slo_class=req.slo_class, deadline_seconds=req.deadline,
            exclude=list(req.exclude), idempotent=req.idempotent, sequence=req.sequence,
            sequence_start=req.sequence_start, sequence_end=req.sequence_end)
        kind, payload = await self._call(score_link.SCORE, msg.SerializeToString())
        if kind == score_link.ERROR:
            field, _, message = payload.decode(errors="replace").partition(": ")
            raise ScoreError(field, message)
        return scored_of(score_pb2.ScoreReply.FromString(payload))

    def report(self, decision_id: int, replica: str, latency: float, status: Status, *,
               hedge: bool = False, last: bool = False) -> None:
        if not self._outcomes:  # the first this turn: send them all at the turn's end
            asyncio.get_running_loop().call_soon(self._flush)
        self._outcomes.append(score_pb2.OutcomeReport(
            decision_id=decision_id, replica=replica, latency_seconds=latency,
            status=int(status), hedge=hedge, last=last))  # type: ignore[arg-type]

    def report_all(self, outcomes: Sequence[Outcome]) -> None:
        for did, replica, latency, status, hedge, last in outcomes:
            self.report(did, replica, latency, status, hedge=hedge, last=last)

    def _report_frames(self) -> bytes:
        """The outcomes reported so far, as ``REPORT`` frames (taken: sent by the caller)."""
        outcomes, self._outcomes = self._outcomes, []
        if len(outcomes) <= MAX_BATCH:
            return score_link.frame(score_link.REPORT, 0, score_pb2.OutcomeBatch(
                reports=outcomes).SerializeToString())
        return b"".join(score_link.frame(score_link.REPORT, 0, score_pb2.OutcomeBatch(
            reports=outcomes[i:i + MAX_BATCH]).SerializeToString())
            for i in range(0, len(outcomes), MAX_BATCH))

    def _flush(self) -> None:
        if not self._outcomes:  # gone ahead of a call this turn
            return
        link = self._link
        if link is None or link.lost or link.transport is None:
            self.dropped += len(self._outcomes)
            self._outcomes = []
            self._connect_soon()  # for the next ones
            return
        link.transport.write(self._report_frames())

    async def hedge_target(self, decision_id: int, replica: str) -> Choice | None:
        msg = score_pb2.HedgeRequest(decision_id=decision_id, replica=replica)
        try:
            kind, payload = await self._call(score_link.HEDGE, msg.SerializeToString())
        except ScoringUnavailable:
            return None  # no hedge: the first attempt goes on, as it would without one
        if kind != score_link.HEDGED:
            return None
        reply = score_pb2.HedgeReply.FromString(payload)
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

    async def want(self, model: str, version: str) -> bool:
        try:
            reply = await self.stub.WantModel(score_pb2.WantRequest(model=model, version=version),
                                              timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None
        return bool(reply.managed)

    async def repository(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                         peer: str, config: str = "") -> str:
        try:
            reply = await self.stub.ScaleModel(score_pb2.ScaleModelRequest(
                model=model, load=load, caller_certificate_pem=certificate_pem,
                caller_bearer=bearer, peer=peer, config=config), timeout=REPOSITORY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise _failure(exc) from None
            raise RepositoryRefused(exc.code().name, exc.details() or exc.code().name) from None
        return str(reply.author)

    async def send_counters(self, msg: score_pb2.RouterCounters) -> None:
        try:
            await self.stub.ReportRouterCounters(msg, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None

    async def close(self) -> None:
        if self._outcomes:  # each report releases a decision's admission: send them
            self._flush()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        tasks = [w.task for w in self._watches.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._link is not None and self._link.transport is not None:
            self._link.transport.close()
        await self.channel.close()


def _failure(exc: grpc.aio.AioRpcError) -> ScoringUnavailable:
    return ScoringUnavailable(f"the agent's score API: {exc.code().name}: "
                              f"{exc.details() or exc.code().name}")
