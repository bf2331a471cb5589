"""The Score gRPC service (``mesh.v1.Score``): the scorer for routers in other processes.

Served on loopback (or a Unix socket) in plaintext, since only processes on the host can
reach it and the call must be cheap; on any other address only with mTLS, client
certificates required (a remote router is a mesh node with an identity of its own).

Every field is checked before it reaches the scorer: a bad request gets INVALID_ARGUMENT
naming the field, and nothing is half-applied.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import grpc

from certs import tls
from meshd.score.admission import Verdict
from meshd.score.scorer import (
    Choice,
    RepositoryRefused,
    Scored,
    ScoreError,
    Scorer,
    ScoreRequest,
    Status,
)
from meshd.settings import is_loopback
from proto.mesh.v1 import score_pb2, score_pb2_grpc

MAX_TEXT = 256
MAX_EXCLUDE = 64
MAX_SEQUENCE = 1024
"""Characters of a sequence key (model, version and a string sequence id)."""
MAX_PAYLOAD = 1 << 40
MAX_BATCH = 4096
"""Reports in one ``OutcomeBatch``."""
MAX_COUNT = 1 << 62
"""Any router counter above this is not a count."""
WATCH_POLL = 0.1
"""Seconds between looks at a watched model's weights."""
WATCH_REFRESH = 5.0
"""Seconds after which weights are sent again even if unchanged (a liveness signal)."""
WATCH_CHANGE = 0.05
"""A weight moving by more than this (absolute share) is worth a push."""


class FieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")


def _text(value: str, field: str, required: bool = False) -> str:
    if (required and not value) or len(value) > MAX_TEXT or not value.isprintable():
        raise FieldError(field, f"must be {'1' if required else '0'}-{MAX_TEXT} printable "
                                "characters")
    return value


def _sequence(value: str) -> str:
    if len(value) > MAX_SEQUENCE:
        raise FieldError("sequence", f"must be at most {MAX_SEQUENCE} characters")
    return value


def _seconds(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0 or value > 86400:
        raise FieldError(field, "must be a number of seconds in [0, 86400]")
    return value


def score_request(msg: score_pb2.ScoreRequest) -> ScoreRequest:
    """The scorer's request for a wire one (FieldError names a bad field)."""
    if len(msg.exclude) > MAX_EXCLUDE:
        raise FieldError("exclude", f"at most {MAX_EXCLUDE} entries")
    if msg.payload_bytes > MAX_PAYLOAD:
        raise FieldError("payload_bytes", f"must be at most {MAX_PAYLOAD}")
    return ScoreRequest(model=_text(msg.model, "model", required=True),
                        revision=_text(msg.revision, "revision"),
                        payload_bytes=msg.payload_bytes, tenant=_text(msg.tenant, "tenant"),
                        slo_class=_text(msg.slo_class, "slo_class"),
                        deadline=_seconds(msg.deadline_seconds, "deadline_seconds"),
                        exclude=frozenset(_text(e, "exclude") for e in msg.exclude),
                        idempotent=msg.idempotent,
                        sequence=_sequence(msg.sequence),
                        sequence_start=msg.sequence_start, sequence_end=msg.sequence_end)


def target_pb(c: Choice) -> score_pb2.Target:
    return score_pb2.Target(node=c.node, endpoint=c.endpoint, replica=c.replica,
                            version=c.version, predicted_seconds=c.predicted,
                            rtt_seconds=c.rtt, queue_seconds=c.queue,
                            service_seconds=c.service, zone=c.zone, http_endpoint=c.http)


def score_reply(scored: Scored) -> score_pb2.ScoreReply:
    v = scored.verdict
    return score_pb2.ScoreReply(
        targets=[target_pb(c) for c in scored.targets],
        verdict=score_pb2.Verdict(admit=v.admit, reason=v.reason,
                                  retry_after_seconds=v.retry_after),
        hedge_after_seconds=scored.hedge_after, decision_id=scored.decision_id,
        strategy=scored.strategy, degraded=scored.degraded, walk=scored.walk)


def scored_of(reply: score_pb2.ScoreReply) -> Scored:
    """The scorer's result for a wire reply (the inverse of :func:`score_reply`)."""
    v = reply.verdict
    return Scored([choice_of(t) for t in reply.targets],
                  Verdict(v.admit, v.reason, v.retry_after_seconds), reply.hedge_after_seconds,
                  reply.decision_id, reply.strategy, reply.degraded, reply.walk)


def choice_of(t: score_pb2.Target) -> Choice:
    """The scorer's choice for a wire target (the inverse of :func:`target_pb`)."""
    return Choice(t.node, t.endpoint, t.replica, t.version, t.zone, t.predicted_seconds,
                  t.rtt_seconds, t.queue_seconds, t.service_seconds, http=t.http_endpoint)


def outcome(msg: score_pb2.OutcomeReport, field: str = "") -> tuple[str, float, Status]:
    """A report's replica, latency and status, checked (FieldError names a bad field)."""
    try:
        status = Status(msg.status)
    except ValueError:
        raise FieldError(f"{field}status", f"unknown outcome status {msg.status}") from None
    return (_text(msg.replica, f"{field}replica"),
            _seconds(msg.latency_seconds, f"{field}latency_seconds"), status)


def apply_outcomes(scorer: Scorer, batch: score_pb2.OutcomeBatch, now: float
                   ) -> tuple[int, int]:
    """Check a batch of reports whole, then apply it: (applied, unknown decisions).
    FieldError names a bad field, and then nothing of the batch is applied."""
    if len(batch.reports) > MAX_BATCH:
        raise FieldError("reports", f"at most {MAX_BATCH} in one batch")
    checked = [(r, *outcome(r, f"reports[{i}].")) for i, r in enumerate(batch.reports)]
    applied = 0
    report = scorer.report
    for r, replica, latency, status in checked:
        applied += report(r.decision_id, replica, latency, status, now, hedge=r.hedge,
                          last=r.last)
    return applied, len(checked) - applied


def hedge_reply(scorer: Scorer, msg: score_pb2.HedgeRequest, now: float
                ) -> score_pb2.HedgeReply:
    """Where a decision's hedge should go now (FieldError names a bad field)."""
    choice = scorer.hedge_target(msg.decision_id, _text(msg.replica, "replica", required=True),
                                 now)
    if choice is None:
        return score_pb2.HedgeReply(found=False)
    return score_pb2.HedgeReply(found=True, target=target_pb(choice))


class WorkerReports(Protocol):
    """Where the router's worker processes' counters go (the agent's
    :class:`meshd.router.counters.WorkerCounters`, which its metrics sum)."""

    def report(self, worker: str, msg: score_pb2.RouterCounters) -> None:
        """Take one worker life's latest counters, already checked."""
        ...


class _Dropped:
    """A score API that serves no router workers checks their reports and keeps nothing."""

    def report(self, worker: str, msg: score_pb2.RouterCounters) -> None:
        return None


def _counts(msg: score_pb2.RouterCounters) -> Iterator[int]:
    """Every count a report holds, scalar and keyed."""
    for fd, value in msg.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            yield from value.values()
        elif isinstance(value, int):
            yield value


def router_counters(msg: score_pb2.RouterCounters) -> tuple[str, score_pb2.RouterCounters]:
    """A worker's life name and counters, checked (FieldError names a bad field)."""
    worker = _text(msg.worker, "worker", required=True)
    for name, values in (("failed", msg.failed), ("shed", msg.shed), ("refused", msg.refused)):
        if len(values) > MAX_EXCLUDE:
            raise FieldError(name, f"at most {MAX_EXCLUDE} keys")
        for key in values:
            _text(key, f"{name} key")
    if any(v > MAX_COUNT for v in _counts(msg)):
        raise FieldError("counters", f"a count above {MAX_COUNT}")
    return worker, msg


class ScoreService(score_pb2_grpc.ScoreServicer):
    def __init__(self, scorer: Scorer, clock: Callable[[], float],
                 workers: WorkerReports | None = None) -> None:
        self.scorer = scorer
        self.clock = clock
        self.workers: WorkerReports = workers if workers is not None else _Dropped()

    async def ScoreTargets(self, request: score_pb2.ScoreRequest,
                           context: grpc.aio.ServicerContext) -> score_pb2.ScoreReply:
        try:
            scored = self.scorer.score(score_request(request), self.clock())
        except (FieldError, ScoreError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return score_reply(scored)

    async def ReportOutcome(self, request: score_pb2.OutcomeReport,
                            context: grpc.aio.ServicerContext) -> score_pb2.OutcomeAck:
        try:
            replica, latency, status = outcome(request)
        except FieldError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        known = self.scorer.report(request.decision_id, replica, latency, status, self.clock(),
                                   hedge=request.hedge, last=request.last)
        return score_pb2.OutcomeAck(known=known)

    async def ReportOutcomes(self, request_iterator: AsyncIterator[score_pb2.OutcomeBatch],
                             context: grpc.aio.ServicerContext) -> score_pb2.OutcomesAck:
        """Each batch is checked whole before any of it is applied."""
        applied = unknown = 0
        async for batch in request_iterator:
            try:
                a, u = apply_outcomes(self.scorer, batch, self.clock())
            except FieldError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            applied += a
            unknown += u
        return score_pb2.OutcomesAck(applied=applied, unknown=unknown)

    async def HedgeTarget(self, request: score_pb2.HedgeRequest,
                          context: grpc.aio.ServicerContext) -> score_pb2.HedgeReply:
        try:
            return hedge_reply(self.scorer, request, self.clock())
        except FieldError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable")

    async def ListModels(self, request: score_pb2.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> score_pb2.ListModelsReply:
        return score_pb2.ListModelsReply(models=[
            score_pb2.ModelEntry(model=m, version=v, ready=ready)
            for (m, v), ready in sorted(self.scorer.models(self.clock()).items())])

    async def WantModel(self, request: score_pb2.WantRequest,
                        context: grpc.aio.ServicerContext) -> score_pb2.WantReply:
        if not 0 < len(request.model) <= 256 or len(request.version) > 64:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "model: 1..256 characters; version: at most 64")
        return score_pb2.WantReply(managed=self.scorer.wanted(request.model, request.version))

    async def ScaleModel(self, request: score_pb2.ScaleModelRequest,
                         context: grpc.aio.ServicerContext) -> score_pb2.ScaleModelReply:
        repository = self.scorer.repository
        if repository is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "repository control through the mesh is model placement "
                                "(meshd/models), which this agent does not serve")
            raise AssertionError("unreachable")
        if not 0 < len(request.model) <= 256:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model: 1..256 characters")
        try:
            author = await repository(request.model, request.load,
                                      bytes(request.caller_certificate_pem),
                                      request.caller_bearer, request.peer[:256],
                                      request.config)
        except RepositoryRefused as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code, grpc.StatusCode.UNKNOWN),
                                str(exc))
        return score_pb2.ScaleModelReply(author=author)

    async def ReportRouterCounters(self, request: score_pb2.RouterCounters,
                                   context: grpc.aio.ServicerContext
                                   ) -> score_pb2.RouterCountersAck:
        try:
            worker, counters = router_counters(request)
        except FieldError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.workers.report(worker, counters)
        return score_pb2.RouterCountersAck()

    async def Admit(self, request: score_pb2.AdmitRequest,
                    context: grpc.aio.ServicerContext) -> score_pb2.AdmitReply:
        try:
            if request.payload_bytes > MAX_PAYLOAD:
                raise FieldError("payload_bytes", f"must be at most {MAX_PAYLOAD}")
            verdict, did = self.scorer.admit(
                _text(request.model, "model", required=True), self.clock(),
                revision=_text(request.revision, "revision"),
                payload_bytes=request.payload_bytes, tenant=_text(request.tenant, "tenant"),
                slo_class=_text(request.slo_class, "slo_class"))
        except (FieldError, ScoreError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return score_pb2.AdmitReply(
            verdict=score_pb2.Verdict(admit=verdict.admit, reason=verdict.reason,
                                      retry_after_seconds=verdict.retry_after),
            decision_id=did)

    async def WatchTargets(self, request: score_pb2.WatchRequest,
                           context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[score_pb2.TargetWeights]:
        try:
            model = _text(request.model, "model", required=True)
            revision = _text(request.revision, "revision")
        except FieldError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        sent: dict[str, float] | None = None
        sent_at = 0.0
        while True:
            now = self.clock()
            weights, degraded = self.scorer.weights(model, revision, now)
            current = {c.replica: w for c, w in weights}
            if sent is None or now - sent_at >= WATCH_REFRESH or changed(sent, current):
                yield score_pb2.TargetWeights(model=model, degraded=degraded, targets=[
                    score_pb2.WeightedTarget(target=target_pb(c), weight=w)
                    for c, w in weights])
                sent, sent_at = current, now
            await asyncio.sleep(WATCH_POLL)


def changed(old: dict[str, float], new: dict[str, float]) -> bool:
    if old.keys() != new.keys():
        return True
    return any(abs(new[k] - w) > WATCH_CHANGE for k, w in old.items())


async def serve(scorer: Scorer, clock: Callable[[], float], addr: tuple[str, int] | str,
                identity: Callable[[], object], workers: WorkerReports | None = None
                ) -> tuple[grpc.aio.Server, str]:
    """Start the Score service on ``addr`` (``(host, port)`` or a Unix socket path); returns
    the server and the address it is bound to.  Plaintext only on loopback or a Unix socket,
    else mTLS presenting ``identity()`` and requiring a mesh client certificate."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    score_pb2_grpc.add_ScoreServicer_to_server(ScoreService(scorer, clock, workers), server)
    if isinstance(addr, str):
        target = f"unix:{addr}"
        bound = server.add_insecure_port(target)
        where = target
    else:
        host, port = addr
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if is_loopback(host):
                bound = server.add_insecure_port(target)
            else:
                bound = server.add_secure_port(target, tls.grpc_server_credentials(identity))
        except RuntimeError:  # grpcio raises instead of returning 0 on a bind failure
            bound = 0
        where = f"{host}:{bound}"
    if bound == 0:
        raise OSError(f"cannot bind the score API on {target} (address in use?)")
    await server.start()
    return server, where
