"""What the router does with a Triton call, whichever protocol carried it.

The gRPC ingress (:mod:`meshd.router.kserve`) and the HTTP/REST ingress
(:mod:`meshd.router.http`) authenticate the caller and turn their protocol into a KServe v2
``ModelInferRequest`` (and back); everything between is here: the model's config (for
validation) and what it means when no replica has the model, validation, sequence affinity,
scoring and admission, dispatch with hedging and failover, streams, and the calls that
Triton answers about the whole server (statistics, metadata, repository index), answered for
the whole fleet.  A refusal is a :class:`RouterError` carrying the gRPC status Triton would use
and its message; each ingress renders it in its own protocol.

Errors follow Triton's wording where a client may look for it: an unknown model is NOT_FOUND
"Request for unknown model: 'x' is not found" (UNAVAILABLE only for a model the mesh knows
with no ready replica), and validation messages are Triton's own (:mod:`meshd.router.validate`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from meshd.router import http_dispatch, statistics
from meshd.router.counters import RouterCounters
from meshd.router.dispatch import (
    Failed,
    Outcome,
    Report,
    Tally,
    attempt_span,
    dispatch,
    dispatch_sequence,
    in_turn,
)
from meshd.router.http_dispatch import HttpReply, HttpUpstreams, http_code
from meshd.router.known import Known, KnownRequests
from meshd.router.scoring import Scoring, ScoringUnavailable
from meshd.router.traces import RequestTrace, RequestTracer
from meshd.router.upstream import Upstreams
from meshd.router.validate import InvalidRequest, ModelSchema, SharedMemoryRequest, validate
from meshd.score.scorer import (
    Choice,
    RepositoryRefused,
    Scored,
    ScoreError,
    ScoreRequest,
    Status,
)
from meshd.score.sequences import sequence_key

log = logging.getLogger("meshd.router")

SCHEMA_TTL = 60.0
"""Seconds a model's config is trusted before it is fetched again."""
CONFIG_TIMEOUT = 5.0
HOLD_MAX = 60.0
"""Seconds a request for a model placed by meshd with no ready replica waits for one (scale
from zero; the client's own deadline ends it sooner)."""
HOLD_POLL = 0.2
"""Seconds between looks for a ready replica while a request waits."""
WANT_EVERY = 5.0
"""Seconds between reminders to the placement controller while requests wait."""
MAX_HELD = 256
"""Requests one router process holds for a replica at once; more fail at once."""
REPOSITORY_WAIT = 120.0
"""Seconds a repository load (or unload) through the router waits for the mesh to show it."""
"""Seconds a call the router makes for itself (a config, statistics, metadata) may take."""
FLEET_TTL = 10.0
"""Seconds the fleet's server metadata is reused."""
EXTENSIONS = ("classification", "sequence", "model_configuration", "system_shared_memory",
              "binary_tensor_data", "parameters", "statistics", "schedule_policy")
"""Triton extensions the router serves for the fleet (repository control and CUDA shared
memory act on one server, trace and log settings too: not through a router)."""


class RouterError(Exception):
    """A call the router answers with an error: the gRPC status and message Triton would give
    (``retry_after`` seconds for a shed request)."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


@dataclass(slots=True)
class Caller:
    """Who is calling: the tenant, its SLO class and the trace headers to pass on."""

    tenant: str
    slo: str
    passed: list[tuple[str, str]]


def unknown_model(model: str, version: str) -> RouterError:
    """Triton's answer for a model no server has."""
    which = f"'{model}' version {version}" if version else f"'{model}'"
    return RouterError(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: {which} is not "
                                                  "found")


_VERSION = re.compile(r"\s*[+-]?\d+")


def check_version(version: str) -> None:
    """Triton's answer for a version string that is not a version (it reads it with
    ``std::stol``: a leading integer, then anything), or None."""
    if not version:
        return
    m = _VERSION.match(version)
    if m is None:
        raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, "failed to get model version from "
                          f"specified version string '{version}' (details: stol), version "
                          "should be an integral value > 0")
    if int(m.group()) <= 0:
        raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, "invalid model version specified "
                          f"'{version}' , version should be an integral value > 0")


def sequence_of(req: service_pb2.ModelInferRequest) -> tuple[int | str, bool, bool] | None:
    """``(sequence_id, start, end)`` of a request in a stateful sequence, or None (Triton: an
    id of 0 or "" is no sequence)."""
    params = req.parameters
    if not params or "sequence_id" not in params:
        return None
    p = params["sequence_id"]
    which = p.WhichOneof("parameter_choice")
    sid: int | str
    if which == "string_param":
        sid = p.string_param
    elif which in ("int64_param", "uint64_param"):
        sid = getattr(p, which)
    else:
        return None
    if not sid:
        return None
    start = "sequence_start" in params and params["sequence_start"].bool_param
    end = "sequence_end" in params and params["sequence_end"].bool_param
    return sid, start, end


class Schemas:
    """Model configs (as validation schemas), fetched from a ready replica and cached."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self._cache: dict[tuple[str, str], tuple[float, ModelSchema]] = {}

    def cached(self, model: str, version: str, now: float) -> ModelSchema | None:
        hit = self._cache.get((model, version))
        return hit[1] if hit is not None and now - hit[0] < SCHEMA_TTL else None

    async def get(self, model: str, version: str, endpoints: list[str],
                  now: float) -> ModelSchema | None:
        hit = self._cache.get((model, version))
        if hit is not None and now - hit[0] < SCHEMA_TTL:
            return hit[1]
        req = service_pb2.ModelConfigRequest(name=model, version=version).SerializeToString()
        for endpoint in endpoints:
            try:
                raw = await self.upstreams.unary(endpoint, "ModelConfig")(
                    req, timeout=CONFIG_TIMEOUT)
                cfg = service_pb2.ModelConfigResponse.FromString(raw).config
                schema = ModelSchema.from_config(cfg)
            except (grpc.aio.AioRpcError, DecodeError, ValueError) as exc:
                log.debug("cannot fetch model config", extra={
                    "event": "model_config_failed", "model": model, "endpoint": endpoint,
                    "detail": str(exc)})
                continue
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[(model, version)] = (now, schema)
            return schema
        return hit[1] if hit is not None else None


def _shed(scored: Scored, model: str, seq: tuple[int | str, bool, bool] | None) -> RouterError:
    v = scored.verdict
    if v.reason == "sequence_lost" and seq is not None:
        lost = scored.targets[0] if scored.targets else None
        where = f" on node {lost.node} ({lost.endpoint})" if lost is not None else ""
        return RouterError(grpc.StatusCode.ABORTED, lost_sequence(seq[0], model, where))
    if v.reason == "deadline":
        # Asking again will not make the deadline longer: no retry hint.
        return RouterError(grpc.StatusCode.DEADLINE_EXCEEDED,
                           "shed: deadline: no replica is predicted to answer within the "
                           "request's deadline")
    code = (grpc.StatusCode.UNAVAILABLE if v.reason == "no_targets"
            else grpc.StatusCode.RESOURCE_EXHAUSTED)
    return RouterError(code, f"shed: {v.reason}; retry after {v.retry_after:.3f} s",
                       v.retry_after)


def _score_request(model: str, version: str, payload: int,
                   seq: tuple[int | str, bool, bool] | None, caller: Caller,
                   remaining: float | None) -> ScoreRequest:
    request = ScoreRequest(model, version, payload, caller.tenant, caller.slo,
                           deadline=remaining if remaining is not None else 0.0)
    if seq is not None:
        request.idempotent = False
        request.sequence = sequence_key(model, version, seq[0])
        request.sequence_start, request.sequence_end = seq[1], seq[2]
    return request


FLUSH_AFTER = 0.002
"""Seconds an attempt's outcome waits at most for the next request's scoring to carry it to
the scorer (:meth:`Gateway._post`)."""


def lost_sequence(sid: int | str, model: str, where: str) -> str:
    return (f"sequence {sid!r} of model '{model}' was lost: the replica that held it{where} "
            "is no longer available; start the sequence again")


MAX_PAYLOAD = 64 << 20
"""Bytes of input tensors one request may carry through the router (``PayloadTooLarge``
beyond)."""
MESSAGE_HEADROOM = 1 << 20
"""Bytes a request may have beyond its payload (names, shapes, parameters, JSON).  The
ingresses refuse a message larger than payload + headroom before parsing it: gRPC (grpcio
1.81) still receives the whole message first, so what a huge one costs is its transfer and its
bytes for a moment, in a router worker process (never the agent's, by default), and the
HTTP ingress refuses a body by its Content-Length before reading it."""


class Gateway:
    """The router's work on Triton calls, over a scorer in this process or the agent's
    (:mod:`meshd.router.scoring`)."""

    def __init__(self, scoring: Scoring, clock: Callable[[], float], *,
                 max_bytes: int = MAX_PAYLOAD) -> None:
        self.scoring = scoring
        self.clock = clock
        self.max_bytes = max_bytes
        self.upstreams = Upstreams()
        self.http_upstreams = HttpUpstreams()
        """The replicas' HTTP endpoints, for requests the HTTP ingress forwards as they came."""
        self.schemas = Schemas(self.upstreams)
        self.counters = RouterCounters()
        self.tracer: RequestTracer | None = None
        """Set when tracing is on (:mod:`meshd.tracing`): each sampled request is a trace."""
        self._fleet: tuple[float, service_pb2.ServerMetadataResponse] | None = None
        self.auth: Any = None
        """The clients' authentication (:class:`meshd.router.auth.ClientAuth`), shared by the
        ingresses."""
        self.shm: Any = None
        """System shared memory regions on this host (:class:`meshd.router.shm.Regions`), when
        the router serves them."""
        self._outbox: list[Outcome] = []
        """Outcomes not yet reported (:meth:`_post`)."""
        self._flush_timer: asyncio.TimerHandle | None = None
        self.known = KnownRequests()
        self.held = 0
        """Requests waiting for a model's first replica (scale from zero)."""
        """Requests validated before (:mod:`meshd.router.known`)."""
        self._score_now: Callable[[ScoreRequest, float], Scored] | None = getattr(
            scoring, "score_now", None)
        """``score_now(request, now)`` of a scorer in this process (:class:`LocalScoring`),
        whose ``now`` is this gateway's clock's."""

    async def close(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._flush()
        await self.upstreams.close()
        await self.http_upstreams.close()
        await self.scoring.close()

    # --- inference ----------------------------------------------------------------------------

    def failed(self, why: str) -> None:
        failed = self.counters.failed
        failed[why] = failed.get(why, 0) + 1

    def recognise(self, raw: bytes) -> tuple[tuple[bytes, tuple[int, ...]] | None,
                                             Known | None]:
        """A serialized ``ModelInferRequest``'s key (:mod:`meshd.router.known`), and what
        validating it found when a request with that key was validated before against the
        model's config in force: the request then goes straight to :meth:`route`."""
        key, known = self.known.key(raw)
        return key, self.current(known)

    def current(self, known: Known | None, now: float | None = None) -> Known | None:
        """``known``, while the config it was validated against is the model's in force
        (``now``: the clock's, when the caller has it)."""
        if known is None or known.schema is not self.schemas.cached(
                known.model, known.version, self.clock() if now is None else now):
            return None
        return known

    async def infer(self, raw: bytes, req: service_pb2.ModelInferRequest, caller: Caller,
                    remaining: float | None, rt: RequestTrace | None,
                    shm: bool = False, key: object = None) -> bytes:
        """The reply bytes (a ``ModelInferResponse``) for one request (``raw`` is ``req``
        serialized), or :class:`RouterError`.  Counts the request as it ends: completed,
        failed, shed or invalid (the ingress counts it received, and cancelled).  A request
        naming shared memory regions goes through :attr:`shm`, which reads and writes them and
        calls back with ``shm`` set.  A valid request's ``key`` (:meth:`recognise`) is
        remembered with what validation found, unless it is part of a sequence."""
        now = self.clock()
        try:
            schema, payload = await self.validated(req, now)
        except SharedMemoryRequest:
            if self.shm is None or shm:
                self.failed("UNIMPLEMENTED")
                raise RouterError(grpc.StatusCode.UNIMPLEMENTED,
                                  "this router serves no system shared memory") from None
            return await self.shm.infer(req, caller, remaining, rt)  # type: ignore[no-any-return]
        seq = sequence_of(req)
        if key is not None and seq is None and schema.data_free:
            self.known.put(key, Known(req.model_name, req.model_version, payload, schema))
        return await self.route(raw, req.model_name, req.model_version, payload, seq, caller,
                                remaining, rt, now)

    async def validated(self, req: service_pb2.ModelInferRequest,
                        now: float) -> tuple[ModelSchema, int]:
        """The model's schema and the request's payload bytes, or :class:`RouterError` (an
        invalid request counted) or :class:`SharedMemoryRequest`."""
        schema = await self._schema(req.model_name, req.model_version, now)
        try:
            return schema, validate(req, schema, self.max_bytes)
        except SharedMemoryRequest:
            raise  # not a mistake (an InvalidRequest only where no router serves the regions)
        except InvalidRequest as exc:
            self.counters.invalid += 1
            raise RouterError(grpc.StatusCode[exc.code], str(exc)) from None

    async def route(self, raw: bytes, model: str, version: str, payload: int,
                    seq: tuple[int | str, bool, bool] | None, caller: Caller,
                    remaining: float | None, rt: RequestTrace | None, now: float) -> bytes:
        """A valid request's reply bytes: scored, admitted and dispatched (see
        :meth:`infer`)."""
        scored = self.admit_now(model, version, payload, seq, caller, remaining, rt, now)
        if scored is None:
            scored = await self.admit(model, version, payload, seq, caller, remaining, rt)
        return await self.send(raw, scored, model, seq, caller, remaining, rt, now)

    def admit_now(self, model: str, version: str, payload: int,
                  seq: tuple[int | str, bool, bool] | None, caller: Caller,
                  remaining: float | None, rt: RequestTrace | None,
                  now: float) -> Scored | None:
        """:meth:`admit` without a coroutine, for an untraced request to a scorer in this
        process (a coroutine per request costs the hot path a few microseconds in place);
        None otherwise."""
        score_now = self._score_now
        if rt is not None or score_now is None:
            return None
        if self._outbox:
            self._flush()
        try:
            scored = score_now(_score_request(model, version, payload, seq, caller,
                                              remaining), now)
        except ScoreError as exc:
            self.counters.invalid += 1
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if not scored.verdict.admit:
            return self._admitted(scored, model, seq)  # raises: shed
        self.counters.admitted += 1
        return scored

    async def admit(self, model: str, version: str, payload: int,
                    seq: tuple[int | str, bool, bool] | None, caller: Caller,
                    remaining: float | None, rt: RequestTrace | None) -> Scored:
        """The scorer's decision for a valid request, admitted (a shed request is a
        :class:`RouterError`, counted).  The decision holds admission slots until its outcome
        is reported: :meth:`send` or :meth:`send_http` does, or :meth:`abandon`."""
        if self._outbox:
            self._flush()
        request = _score_request(model, version, payload, seq, caller, remaining)
        return self._admitted(await self.score(request, rt), model, seq)

    def _admitted(self, scored: Scored, model: str,
                  seq: tuple[int | str, bool, bool] | None) -> Scored:
        c = self.counters
        if not scored.verdict.admit:
            err = _shed(scored, model, seq)
            c.shed[scored.verdict.reason] = c.shed.get(scored.verdict.reason, 0) + 1
            raise err
        c.admitted += 1
        return scored

    def abandon(self, scored: Scored, why: str) -> None:
        """An admitted request that will not be sent: its slots go back, counted failed."""
        self._post((scored.decision_id, "", 0.0, Status.ERROR, False, True))
        self.failed(why)

    def _reporter(self, scored: Scored) -> tuple[Report, Callable[[str], Awaitable[Choice | None]]]:
        """A decision's ``report`` and ``hedge_to`` for dispatch."""
        did = scored.decision_id
        scoring = self.scoring
        post = self._post

        def report(replica: str, latency: float, status: Status, hedge: bool,
                   last: bool) -> None:
            post((did, replica, latency, status, hedge, last))

        def hedge_to(replica: str) -> Awaitable[Choice | None]:
            return scoring.hedge_target(did, replica)
        return report, hedge_to

    async def send(self, raw: bytes, scored: Scored, model: str,
                   seq: tuple[int | str, bool, bool] | None, caller: Caller,
                   remaining: float | None, rt: RequestTrace | None, now: float) -> bytes:
        """Dispatch an admitted request over gRPC: the reply bytes, or :class:`RouterError`
        (counted)."""
        c = self.counters
        deadline = None if remaining is None else now + remaining
        if seq is None and (scored.hedge_after <= 0 or len(scored.targets) < 2):
            # No hedge: straight to the attempts, no closure or tally of its own.
            try:
                reply = await in_turn(raw, "ModelInfer", scored.targets, self.upstreams,
                                      scored.decision_id, self._post, self.clock, deadline,
                                      caller.passed, c, rt)
            except Failed as exc:
                self.failed(exc.code.name)
                raise RouterError(exc.code, exc.details) from None
            c.completed += 1
            return reply
        report, hedge_to = self._reporter(scored)
        tally = Tally()
        try:
            if seq is None:
                reply = await dispatch(raw, "ModelInfer", scored.targets, scored.hedge_after,
                                       upstreams=self.upstreams, report=report,
                                       clock=self.clock, deadline=deadline,
                                       metadata=caller.passed, tally=tally, hedge_to=hedge_to,
                                       trace=rt)
            else:
                reply = await dispatch_sequence(
                    raw, scored.targets, walk=scored.walk, start=seq[1],
                    upstreams=self.upstreams, report=report, clock=self.clock,
                    deadline=deadline, metadata=caller.passed, tally=tally, trace=rt,
                    lost=lambda where: lost_sequence(seq[0], model, where))
        except Failed as exc:
            self.failed(exc.code.name)
            raise RouterError(exc.code, exc.details) from None
        finally:
            self._tally(tally)
        c.completed += 1
        return reply

    async def send_http(self, path: str, body: bytes, headers: dict[str, str],
                        scored: Scored, caller: Caller, remaining: float | None,
                        rt: RequestTrace | None, now: float) -> HttpReply:
        """Dispatch an admitted request, as it came, to the targets' own HTTP endpoints
        (:mod:`meshd.router.http_dispatch`): the replica's answer, whatever its status, or
        :class:`RouterError` when no replica gave one (counted)."""
        c = self.counters
        deadline = None if remaining is None else now + remaining
        targets = scored.targets
        try:
            if scored.hedge_after <= 0 or len(targets) < 2:
                # No hedge: straight to the attempts, no closure or tally of its own.
                reply = await http_dispatch.in_turn(  # positional: the request path's call
                    path, body, headers, targets, self.http_upstreams, scored.decision_id,
                    self._post, self.clock, deadline, caller.passed, c, rt)
            else:
                report, hedge_to = self._reporter(scored)
                tally = Tally()
                try:
                    reply = await http_dispatch.hedged(
                        path, body, headers, targets, scored.hedge_after,
                        upstreams=self.http_upstreams, report=report, clock=self.clock,
                        deadline=deadline, metadata=caller.passed, tally=tally,
                        hedge_to=hedge_to, trace=rt)
                finally:
                    self._tally(tally)
        except Failed as exc:
            self.failed(exc.code.name)
            raise RouterError(exc.code, exc.details) from None
        if reply.status < 400:
            c.completed += 1
        else:
            self.failed(http_code(reply.status).name)
        return reply

    def _tally(self, tally: Tally) -> None:
        if tally.hedged or tally.failovers:
            c = self.counters
            c.hedged += tally.hedged
            c.hedge_won += tally.hedge_won
            c.failovers += tally.failovers

    def _post(self, outcome: Outcome) -> None:
        """Hold an attempt's outcome until the next request is scored, which reports it
        first (:meth:`_flush`), or until ``FLUSH_AFTER`` passes without one.  The scorer
        then counts it before the decision it bears on, and the reports reach it together,
        its code and tables warm from one to the next: reported one by one, in a callback
        each, they cost the router several times as much in place (``bench/router_overhead``,
        HTTP at concurrency 16)."""
        self._outbox.append(outcome)
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_AFTER,
                                                                      self._flush_due)

    def _flush_due(self) -> None:
        self._flush_timer = None
        if self._outbox:
            self._flush()

    def _flush(self) -> None:
        box, self._outbox = self._outbox, []
        self.scoring.report_all(box)

    async def score(self, req: ScoreRequest, rt: RequestTrace | None) -> Scored:
        """The scorer's decision (a "score" span of ``rt`` when traced)."""
        span = None if rt is None else rt.child("score", attributes={"meshd.model": req.model})
        try:
            scored = await self.scoring.score(req)
        except ScoreError as exc:
            self.counters.invalid += 1
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except ScoringUnavailable as exc:
            self.failed("scorer_unavailable")
            raise RouterError(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        if span is not None:
            span.attributes.update({"meshd.strategy": scored.strategy,
                                    "meshd.targets": len(scored.targets)})
            if not scored.verdict.admit:
                span.attributes["meshd.shed"] = scored.verdict.reason
            span.end()
        return scored

    async def ask(self, call: Awaitable[Any]) -> Any:
        """A scorer call off the hot path; an unreachable scorer is UNAVAILABLE."""
        try:
            return await call
        except ScoringUnavailable as exc:
            raise RouterError(grpc.StatusCode.UNAVAILABLE, str(exc)) from None

    async def schema(self, model: str, version: str) -> ModelSchema:
        """The model's schema (its config, fetched from a ready replica and cached), or the
        error Triton would give for a model it cannot serve."""
        now = self.clock()
        schema = self.schemas.cached(model, version, now)
        if schema is not None:
            return schema
        endpoints = await self._endpoints(model, version)
        if not endpoints and model:
            endpoints = await self._hold_for_replica(model, version)
        if endpoints:
            schema = await self.schemas.get(model, version, endpoints[:3], self.clock())
        if schema is None:
            raise await self._missing(model, version)
        return schema

    async def _hold_for_replica(self, model: str, version: str) -> list[str]:
        """Scale from zero: a request for a model with no ready replica tells the placement
        controller (through the agent); when meshd places the model, the request waits for a
        replica to be ready (``HOLD_MAX`` seconds at most, or the client's deadline, which
        cancels it) instead of failing.  ``MAX_HELD`` requests wait at once, at most: the
        rest fail at once as before.  Returns the endpoints, or [] (not placed by meshd,
        too many held, or none came)."""
        if self.held >= MAX_HELD:
            return []
        try:
            if not await self.ask(self.scoring.want(model, version)):
                return []
        except RouterError:
            return []
        self.held += 1
        loop = asyncio.get_running_loop()
        try:
            start = loop.time()
            told = start
            while loop.time() - start < HOLD_MAX:
                await asyncio.sleep(HOLD_POLL)
                endpoints = await self._endpoints(model, version)
                if endpoints:
                    return endpoints
                if loop.time() - told >= WANT_EVERY:  # still wanted: keep it published
                    told = loop.time()
                    await self.ask(self.scoring.want(model, version))
        finally:
            self.held -= 1
        return []

    async def _schema(self, model: str, version: str, now: float) -> ModelSchema:
        """:meth:`schema` for a request, whose failure is counted as a failed request."""
        schema = self.schemas.cached(model, version, now)
        if schema is not None:
            return schema
        try:
            return await self.schema(model, version)
        except RouterError as exc:
            self.failed("no_targets" if exc.code != grpc.StatusCode.UNAVAILABLE
                        or "no ready replica" in exc.message else "scorer_unavailable")
            raise

    async def _endpoints(self, model: str, version: str) -> list[str]:
        """The model's routable replicas' endpoints, best first."""
        if not model:
            return []
        weights = await self.ask(self.scoring.weights(model, version))
        return [c.endpoint for c, _ in sorted(weights, key=lambda x: -x[1])]

    async def _missing(self, model: str, version: str) -> RouterError:
        """NOT_FOUND for a model (version) no node reports; UNAVAILABLE for one that is known
        with no ready replica; Triton's INVALID_ARGUMENT for a version string that is none."""
        try:
            check_version(version)
        except RouterError as exc:
            return exc
        known = await self.ask(self.scoring.models())
        if any(m == model and (not version or v == version) for m, v in known):
            return RouterError(grpc.StatusCode.UNAVAILABLE,
                               f"no ready replica of model '{model}' in the mesh")
        return unknown_model(model, version)

    # --- streams ------------------------------------------------------------------------------

    async def stream(self, requests: AsyncIterator[bytes], caller: Caller,
                     rt: RequestTrace | None) -> AsyncIterator[bytes]:
        """``ModelStreamInfer``: each message goes where it belongs - a sequence's to the
        replica that holds it, the others to the replica this stream chose for their model
        at its first message - over one upstream stream per replica; the replies come back
        merged as they arrive.  A message the router refuses (invalid, unknown model, shed)
        gets an error reply on the stream, as Triton answers one it refuses; an upstream
        stream that fails ends the stream with its status."""
        self.counters.streams += 1
        relay = _StreamRelay(self, caller, rt)
        async for reply in relay.run(requests):
            yield reply

    # --- about the fleet ----------------------------------------------------------------------

    async def relay(self, method: str, name: str, version: str, raw: bytes,
                    timeout: float | None) -> bytes:
        """A per-model call (``ModelMetadata``, ``ModelConfig``) relayed to a ready
        replica."""
        endpoints = await self._endpoints(name, version)
        if not endpoints:
            raise await self._missing(name, version)
        last: grpc.aio.AioRpcError | None = None
        for endpoint in endpoints[:3]:
            try:
                return await self.upstreams.unary(endpoint, method)(  # type: ignore[no-any-return]
                    raw, timeout=timeout or CONFIG_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise RouterError(exc.code(), exc.details() or exc.code().name) from None
                last = exc
        assert last is not None
        raise RouterError(last.code(), last.details() or "no replica answered")

    async def statistics(self, name: str, version: str) -> service_pb2.ModelStatisticsResponse:
        """Triton's statistics summed over the replicas (of ``name``, or of every model when
        it is empty): they are cumulative counters, so the sum is the fleet's."""
        if name:
            endpoints = await self._endpoints(name, version)
            if not endpoints:
                check_version(version)
                known = await self.ask(self.scoring.models())
                if version and any(m == name for m, _ in known):
                    raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, "requested model version "
                                      f"is not available for model '{name}'")
                raise RouterError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"requested model '{name}' is not available")
        else:
            models = await self.ask(self.scoring.models())
            seen: dict[str, None] = {}
            for m, v in models:
                for endpoint in await self._endpoints(m, v):
                    seen[endpoint] = None
            endpoints = list(seen)
        raw = service_pb2.ModelStatisticsRequest(name=name, version=version).SerializeToString()
        replies = await asyncio.gather(*(self.upstreams.unary(e, "ModelStatistics")(
            raw, timeout=CONFIG_TIMEOUT) for e in dict.fromkeys(endpoints)),
            return_exceptions=True)
        good = [service_pb2.ModelStatisticsResponse.FromString(r) for r in replies
                if isinstance(r, bytes)]
        if not good:
            err = next((r for r in replies if isinstance(r, grpc.aio.AioRpcError)), None)
            if err is not None and err.code() != grpc.StatusCode.UNAVAILABLE:
                raise RouterError(err.code(), err.details() or err.code().name)
            if name:
                raise RouterError(grpc.StatusCode.UNAVAILABLE,
                                  f"no replica of model '{name}' answered for its statistics")
        return statistics.combine(good)

    async def server_metadata(self) -> service_pb2.ServerMetadataResponse:
        """The fleet's Triton name and version (from a replica, cached a few seconds) with the
        extensions the router serves; without any replica, the router's own."""
        now = self.clock()
        fleet = self._fleet
        if fleet is not None and now - fleet[0] < FLEET_TTL:
            return fleet[1]
        models = await self.ask(self.scoring.models())
        answer: service_pb2.ServerMetadataResponse | None = None
        for m, v in sorted(models, key=lambda mv: not models[mv]):
            for endpoint in (await self._endpoints(m, v))[:2]:
                try:
                    raw = await self.upstreams.unary(endpoint, "ServerMetadata")(
                        service_pb2.ServerMetadataRequest().SerializeToString(),
                        timeout=CONFIG_TIMEOUT)
                    answer = service_pb2.ServerMetadataResponse.FromString(raw)
                    break
                except (grpc.aio.AioRpcError, DecodeError):
                    continue
            if answer is not None:
                break
        if answer is None:
            return service_pb2.ServerMetadataResponse(name="triton", version="",
                                                      extensions=list(EXTENSIONS))
        theirs = set(answer.extensions)
        out = service_pb2.ServerMetadataResponse(
            name=answer.name, version=answer.version,
            extensions=[e for e in EXTENSIONS if e in theirs])
        self._fleet = (now, out)
        return out

    async def repository_index(self, ready: bool) -> service_pb2.RepositoryIndexResponse:
        """Every model version any node serves: READY where a routable replica is."""
        seen = await self.ask(self.scoring.models())
        index = [service_pb2.RepositoryIndexResponse.ModelIndex(
            name=m, version=v, state="READY" if ok else "UNAVAILABLE",
            reason="" if ok else "no routable replica")
            for (m, v), ok in sorted(seen.items()) if ok or not ready]
        return service_pb2.RepositoryIndexResponse(models=index)

    async def repository_control(self, model: str, load: bool, certificate_pem: bytes,
                                 bearer: str, peer: str, timeout: float | None,
                                 config: str = "") -> None:
        """Triton's ``RepositoryModelLoad``/``Unload`` for the mesh: load means at least one
        ready replica, unload means none.  The agent writes the model's ModelPin for the
        caller (checking their credential: RBAC ``PolicyApply``); this returns once the
        routers see it so (a replica routable, or none), as Triton returns once the model is
        loaded or unloaded: at most ``REPOSITORY_WAIT`` seconds, or the client's deadline.
        ``config`` (load only): the Triton config (JSON) every replica loads with, those
        loaded already reloaded with it."""
        if not model:
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, "a model name is required")
        try:
            await self.ask(self.scoring.repository(model, load, certificate_pem, bearer, peer,
                                                   config))
        except RepositoryRefused as exc:
            raise RouterError(getattr(grpc.StatusCode, exc.code, grpc.StatusCode.UNKNOWN),
                              str(exc)) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout or REPOSITORY_WAIT, REPOSITORY_WAIT)
        while bool(await self._endpoints(model, "")) != load:
            if loop.time() >= deadline:
                raise RouterError(grpc.StatusCode.DEADLINE_EXCEEDED, (
                    f"no replica of '{model}' is ready yet" if load else
                    f"'{model}' is still routable") + f" ('meshctl models get {model}' says why)")
            await asyncio.sleep(HOLD_POLL)

    async def server_ready(self) -> bool:
        """Ready when some model can be routed."""
        models = await self.ask(self.scoring.models())
        return any(models.values())

    async def model_ready(self, name: str, version: str) -> bool:
        if await self._endpoints(name, version):
            return True
        check_version(version)
        return False


class _StreamRelay:
    """One ``ModelStreamInfer`` stream: the messages routed one by one, the replies of every
    upstream stream merged (see :meth:`Gateway.stream`)."""

    def __init__(self, gateway: Gateway, caller: Caller, rt: RequestTrace | None) -> None:
        self.gw = gateway
        self.caller = caller
        self.rt = rt
        self.out: asyncio.Queue[bytes | RouterError | None] = asyncio.Queue()
        self.upstreams: dict[str, _Upstream] = {}
        self.homes: dict[tuple[str, str], tuple[Choice, int]] = {}
        """(model, version) -> the replica this stream sends that model to, and its
        decision (reported when the stream ends)."""
        self.started = time.monotonic()
        self.status = Status.OK

    async def run(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        pump = asyncio.ensure_future(self._pump(requests))
        try:
            while True:
                item = await self.out.get()
                if item is None:
                    break
                if isinstance(item, RouterError):
                    self.status = Status.ERROR
                    raise item
                yield item
            await pump
        except asyncio.CancelledError:
            self.status = Status.CANCELLED
            raise
        finally:
            pump.cancel()
            for up in self.upstreams.values():
                up.close(cancel=self.status != Status.OK)
            await asyncio.gather(pump, *(u.task for u in self.upstreams.values()),
                                 return_exceptions=True)
            latency = time.monotonic() - self.started
            for choice, did in self.homes.values():
                self.gw.scoring.report(did, choice.replica, latency, self.status, last=True)

    async def _pump(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                await self._route(raw)
        except RouterError as exc:
            await self.out.put(exc)
            return
        for up in self.upstreams.values():
            up.close(cancel=False)
        await asyncio.gather(*(u.task for u in self.upstreams.values()),
                             return_exceptions=True)
        await self.out.put(None)

    async def _route(self, raw: bytes) -> None:
        gw = self.gw
        try:
            req = service_pb2.ModelInferRequest.FromString(raw)
        except DecodeError:
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT,
                              "a stream message is not a ModelInferRequest") from None
        model, version = req.model_name, req.model_version
        try:
            schema = await gw._schema(model, version, gw.clock())
            payload = validate(req, schema, gw.max_bytes)
        except InvalidRequest as exc:
            gw.counters.invalid += 1
            await self.out.put(_error_reply(req, str(exc)))
            return
        except RouterError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE and "no ready replica" not in \
                    exc.message:
                raise  # the scorer is gone: nothing can be routed
            await self.out.put(_error_reply(req, exc.message))
            return
        seq = sequence_of(req)
        target: Choice
        if seq is None:
            home = self.homes.get((model, version))
            if home is None:
                scored = await gw.score(ScoreRequest(
                    model, version, payload, self.caller.tenant, self.caller.slo,
                    idempotent=False), self.rt)
                if not scored.verdict.admit:
                    await self.out.put(_error_reply(req, _shed(scored, model, None).message))
                    return
                home = self.homes[(model, version)] = (scored.targets[0], scored.decision_id)
            target = home[0]
        else:
            scored = await gw.score(ScoreRequest(
                model, version, payload, self.caller.tenant, self.caller.slo,
                idempotent=False, sequence=sequence_key(model, version, seq[0]),
                sequence_start=seq[1], sequence_end=seq[2]), self.rt)
            if not scored.verdict.admit:
                await self.out.put(_error_reply(req, _shed(scored, model, seq).message))
                return
            target = scored.targets[0]
            # Answered on the stream, not timed here: the decision only takes its admission
            # slot while the message is handed on (a START was recorded when decided).
            gw.scoring.report(scored.decision_id, target.replica, 0.0,
                              Status.CANCELLED, last=True)
        up = self.upstreams.get(target.endpoint)
        if up is None:
            up = self.upstreams[target.endpoint] = _Upstream(self, target)
        up.send(raw)


class _Upstream:
    """One upstream ``ModelStreamInfer`` call of a relayed stream."""

    def __init__(self, relay: _StreamRelay, target: Choice) -> None:
        self.relay = relay
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.span, metadata = attempt_span(relay.rt, target, False, relay.caller.passed,
                                           "triton ModelStreamInfer")
        self.call = relay.gw.upstreams.stream(target.endpoint)(self._messages(),
                                                               metadata=metadata or None)
        self.task = asyncio.ensure_future(self._replies())
        self.closed = False

    def send(self, raw: bytes) -> None:
        self.queue.put_nowait(raw)

    def close(self, cancel: bool) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)
        if cancel:
            self.call.cancel()

    async def _messages(self) -> AsyncIterator[bytes]:
        while True:
            raw = await self.queue.get()
            if raw is None:
                return
            yield raw

    async def _replies(self) -> None:
        out = self.relay.out
        error = ""
        try:
            async for reply in self.call:
                await out.put(reply)
        except grpc.aio.AioRpcError as exc:
            error = exc.code().name
            if exc.code() != grpc.StatusCode.CANCELLED:
                await out.put(RouterError(exc.code(), exc.details() or exc.code().name))
        except asyncio.CancelledError:
            error = "CANCELLED"
            raise
        finally:
            if self.span is not None:
                self.span.end(error)


def _error_reply(req: service_pb2.ModelInferRequest, message: str) -> bytes:
    """A stream's reply for a message that was refused (Triton answers so and goes on)."""
    return service_pb2.ModelStreamInferResponse(
        error_message=message,
        infer_response=service_pb2.ModelInferResponse(
            model_name=req.model_name, model_version=req.model_version, id=req.id),
    ).SerializeToString()
