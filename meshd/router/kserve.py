"""The router's ingress: Triton's ``GRPCInferenceService`` (KServe v2 gRPC), so existing
tritonclient code works unchanged when pointed at the router.

- ``ModelInfer``: parsed once to validate it against the model's config (a mismatch is
  INVALID_ARGUMENT naming the tensor, and Triton is never called) and to size it for the
  scorer; then the client's bytes go to the scored target as they are, hedged and failed
  over by :mod:`meshd.router.dispatch`.  A shed request is RESOURCE_EXHAUSTED with a
  ``retry-after-ms`` trailer, at once: never a timeout.
- ``ModelStreamInfer``: one replica per stream (session stickiness), chosen when the first
  message arrives; messages pass through in both directions.
- ``ServerLive``/``ServerReady``/``ModelReady`` and ``RepositoryIndex`` are answered from the
  mesh view; ``ModelMetadata``/``ModelConfig`` are relayed to a ready replica.
- Repository control, shared memory, tracing and log settings act on one server; through a
  router they would act on an arbitrary replica, so they are UNIMPLEMENTED, saying so.

Deadlines propagate (the client's, less the time spent here), and so does the W3C trace
context (``traceparent``, ``tracestate``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from meshd import __version__, tracing
from meshd.router.auth import SLO_HEADER, ClientAuth, Unauthenticated
from meshd.router.counters import RouterCounters
from meshd.router.dispatch import Failed, Tally, attempt_span, dispatch
from meshd.router.scoring import Scoring, ScoringUnavailable
from meshd.router.traces import RequestTrace, RequestTracer
from meshd.router.upstream import Upstreams
from meshd.router.validate import InvalidRequest, ModelSchema, validate
from meshd.score.scorer import Choice, Scored, ScoreError, ScoreRequest, Status

log = logging.getLogger("meshd.router")
T = TypeVar("T")

PASS_HEADERS = tracing.HEADERS
SCHEMA_TTL = 60.0
"""Seconds a model's config is trusted before it is fetched again."""
CONFIG_TIMEOUT = 5.0
NO_SERVER_METHODS = {
    "RepositoryModelLoad": "repository control acts on one server; use that server",
    "RepositoryModelUnload": "repository control acts on one server; use that server",
    "SystemSharedMemoryStatus": "shared memory is local to one server",
    "SystemSharedMemoryRegister": "shared memory is local to one server",
    "SystemSharedMemoryUnregister": "shared memory is local to one server",
    "CudaSharedMemoryStatus": "shared memory is local to one server",
    "CudaSharedMemoryRegister": "shared memory is local to one server",
    "CudaSharedMemoryUnregister": "shared memory is local to one server",
    "TraceSetting": "trace settings act on one server; the router traces with OTLP",
    "LogSettings": "log settings act on one server",
    "ModelStatistics": "statistics are per server; read the mesh's Prometheus metrics",
}


def _code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status an aborted call ended with."""
    code = context.code()  # type: ignore[attr-defined]
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


class Schemas:
    """Model configs (as validation schemas), fetched from a ready replica and cached."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self._cache: dict[tuple[str, str], tuple[float, ModelSchema]] = {}
        self._config = service_pb2.ModelConfigRequest

    def cached(self, model: str, version: str, now: float) -> ModelSchema | None:
        hit = self._cache.get((model, version))
        return hit[1] if hit is not None and now - hit[0] < SCHEMA_TTL else None

    async def get(self, model: str, version: str, endpoints: list[str],
                  now: float) -> ModelSchema | None:
        hit = self._cache.get((model, version))
        if hit is not None and now - hit[0] < SCHEMA_TTL:
            return hit[1]
        req = self._config(name=model, version=version).SerializeToString()
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


class KServeRouter:
    """The ``inference.GRPCInferenceService`` handlers over a scorer, in this process or
    the agent's (:mod:`meshd.router.scoring`)."""

    def __init__(self, scoring: Scoring, clock: Callable[[], float], auth: ClientAuth,
                 *, node: str = "meshd", max_bytes: int = 64 << 20) -> None:
        self.scoring = scoring
        self.clock = clock
        self.auth = auth
        self.node = node
        self.max_bytes = max_bytes
        self.upstreams = Upstreams()
        self.schemas = Schemas(self.upstreams)
        self.counters = RouterCounters()
        self.tracer: RequestTracer | None = None
        """Set when tracing is on (:mod:`meshd.tracing`): each sampled request is a trace."""

    # --- wiring -------------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        svc = service_pb2
        handlers: dict[str, grpc.RpcMethodHandler] = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(self.model_infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer),
            "ModelMetadata": grpc.unary_unary_rpc_method_handler(self.model_metadata),
            "ModelConfig": grpc.unary_unary_rpc_method_handler(self.model_config),
            "ServerLive": self._typed(self.server_live, svc.ServerLiveRequest),
            "ServerReady": self._typed(self.server_ready, svc.ServerReadyRequest),
            "ModelReady": self._typed(self.model_ready, svc.ModelReadyRequest),
            "ServerMetadata": self._typed(self.server_metadata, svc.ServerMetadataRequest),
            "RepositoryIndex": self._typed(self.repository_index, svc.RepositoryIndexRequest),
        }
        for name, why in NO_SERVER_METHODS.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(_unimplemented(name, why))
        return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers)

    def _typed(self, fn: Callable[..., Any], request_type: Any) -> grpc.RpcMethodHandler:
        """A handler for a parsed request, callable only by an authenticated client."""
        async def handler(req: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._caller(context)
            return await fn(req, context)
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString())

    async def close(self) -> None:
        await self.upstreams.close()
        await self.scoring.close()

    # --- inference ----------------------------------------------------------------------------

    async def _caller(self, context: grpc.aio.ServicerContext,
                      counted: bool = False) -> tuple[str, str, list[Any]]:
        """Tenant, SLO class and the metadata to pass on; UNAUTHENTICATED (counted as a
        failed request when ``counted``) for a caller the router does not accept."""
        md = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        try:
            tenant = self.auth.tenant(md, context)
        except Unauthenticated as exc:
            if counted:
                self._failed("UNAUTHENTICATED")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        passed = [(k, v) for k, v in md.items() if k in PASS_HEADERS]
        return tenant, md.get(SLO_HEADER, ""), passed

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One request.  Every path out of here counts it exactly once as completed, failed,
        shed, invalid or cancelled (so ``requests`` less those is what is in flight).

        The request is a trace when tracing is on and the sampler keeps it (its context read
        from the client's trace headers, which ``_caller`` picks out); otherwise ``rt`` is None
        and the client's context passes on as it is."""
        c = self.counters
        c.requests += 1
        rt: RequestTrace | None = None
        try:
            caller = await self._caller(context, counted=True)
            tracer = self.tracer
            if tracer is not None:
                rt = tracer.start("router ModelInfer", caller[2])
            reply = await self._model_infer(raw, context, caller, rt)
        except grpc.aio.AbortError:
            if rt is not None:
                code = _code(context)
                rt.finish(code.name, {"rpc.grpc.status_code": code.value[0]})
            raise
        except asyncio.CancelledError:
            c.cancelled += 1
            if rt is not None:
                rt.finish("CANCELLED")
            raise
        if rt is not None:
            rt.finish()
        return reply

    async def _model_infer(self, raw: bytes, context: grpc.aio.ServicerContext,
                           caller: tuple[str, str, list[Any]],
                           rt: RequestTrace | None) -> bytes:
        c = self.counters
        tenant, slo, passed = caller
        try:
            req = service_pb2.ModelInferRequest.FromString(raw)
        except DecodeError:
            c.invalid += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "request is not a ModelInferRequest")
        now = self.clock()
        model, version = req.model_name, req.model_version
        schema = await self._schema(context, model, version, now)
        if schema is None:
            self._failed("no_targets")
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"no ready replica of model {model!r} in the mesh")
        assert schema is not None
        try:
            payload = validate(req, schema, self.max_bytes)
        except InvalidRequest as exc:
            c.invalid += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        remaining = context.time_remaining()
        request = ScoreRequest(model, version, payload, tenant, slo,
                               deadline=remaining if remaining is not None else 0.0)
        scored = await self._score(context, request, rt)
        v = scored.verdict
        if not v.admit:
            c.shed[v.reason] = c.shed.get(v.reason, 0) + 1
            code = (grpc.StatusCode.UNAVAILABLE if v.reason == "no_targets"
                    else grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_trailing_metadata((("retry-after-ms",
                                            str(max(1, round(v.retry_after * 1000)))),))
            await context.abort(code, f"shed: {v.reason}; retry after {v.retry_after:.3f} s")
        c.admitted += 1
        did = scored.decision_id
        scoring = self.scoring
        clock = self.clock

        def report(replica: str, latency: float, status: Status, hedge: bool,
                   last: bool) -> None:
            scoring.report(did, replica, latency, status, hedge=hedge, last=last)

        def hedge_to(replica: str) -> Awaitable[Choice | None]:
            return scoring.hedge_target(did, replica)

        tally = Tally()
        try:
            reply = await dispatch(raw, "ModelInfer", scored.targets, scored.hedge_after,
                                   upstreams=self.upstreams, report=report, clock=clock,
                                   deadline=None if remaining is None else now + remaining,
                                   metadata=passed, tally=tally, hedge_to=hedge_to,
                                   trace=rt)
        except Failed as exc:
            self._failed(exc.code.name)
            await context.abort(exc.code, exc.details)
        finally:
            c.hedged += tally.hedged
            c.hedge_won += tally.hedge_won
            c.failovers += tally.failovers
        c.completed += 1
        return reply

    async def _score(self, context: grpc.aio.ServicerContext, req: ScoreRequest,
                     rt: RequestTrace | None) -> Scored:
        """The scorer's decision (a "score" span of ``rt`` when traced)."""
        span = None if rt is None else rt.child("score", attributes={"meshd.model": req.model})
        try:
            scored = await self.scoring.score(req)
        except ScoreError as exc:
            self.counters.invalid += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ScoringUnavailable as exc:
            self._failed("scorer_unavailable")
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if span is not None:
            span.attributes.update({"meshd.strategy": scored.strategy,
                                    "meshd.targets": len(scored.targets)})
            if not scored.verdict.admit:
                span.attributes["meshd.shed"] = scored.verdict.reason
            span.end()
        return scored

    async def _ask(self, context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
        """A scorer call off the hot path; an unreachable scorer is UNAVAILABLE."""
        try:
            return await call
        except ScoringUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable")

    def _failed(self, why: str) -> None:
        failed = self.counters.failed
        failed[why] = failed.get(why, 0) + 1

    async def _schema(self, context: grpc.aio.ServicerContext, model: str, version: str,
                      now: float) -> ModelSchema | None:
        if not model:
            return None
        schema = self.schemas.cached(model, version, now)
        if schema is not None:
            return schema
        try:
            weights = await self.scoring.weights(model, version)
        except ScoringUnavailable as exc:
            self._failed("scorer_unavailable")
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        endpoints = [c.endpoint for c, _ in sorted(weights, key=lambda x: -x[1])][:3]
        return await self.schemas.get(model, version, endpoints, now)

    async def model_stream_infer(self, requests: AsyncIterator[bytes],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """One replica per stream, chosen by the first message's model; traced (when sampled)
        as the stream's span, its score decision, and the Triton stream."""
        self.counters.streams += 1
        caller = await self._caller(context)
        tracer = self.tracer
        rt = tracer.start("router ModelStreamInfer", caller[2]) if tracer is not None else None
        error = ""
        try:
            async for reply in self._stream(requests, context, caller, rt):
                yield reply
        except grpc.aio.AbortError:
            error = _code(context).name
            raise
        except asyncio.CancelledError:
            error = "CANCELLED"
            raise
        finally:
            if rt is not None:
                rt.finish(error)

    async def _stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                      caller: tuple[str, str, list[Any]],
                      rt: RequestTrace | None) -> AsyncIterator[bytes]:
        tenant, slo, passed = caller
        first = await anext(aiter(requests), None)
        if first is None:
            return
        try:
            req = service_pb2.ModelInferRequest.FromString(first)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "first message is not a ModelInferRequest")
        scored = await self._score(context, ScoreRequest(
            req.model_name, req.model_version, len(first), tenant, slo, idempotent=False), rt)
        v = scored.verdict
        if not v.admit:
            code = (grpc.StatusCode.UNAVAILABLE if v.reason == "no_targets"
                    else grpc.StatusCode.RESOURCE_EXHAUSTED)
            await context.abort(code, f"shed: {v.reason}; retry after {v.retry_after:.3f} s")
        target = scored.targets[0]
        span, metadata = attempt_span(rt, target, False, passed, "triton ModelStreamInfer")
        started = time.monotonic()

        async def upstream_requests() -> AsyncIterator[bytes]:
            yield first
            async for msg in requests:
                yield msg

        call = self.upstreams.stream(target.endpoint)(upstream_requests(),
                                                      metadata=metadata or None)
        status = Status.OK
        try:
            async for reply in call:
                yield reply
        except grpc.aio.AioRpcError as exc:
            status = Status.UNAVAILABLE if exc.code() == grpc.StatusCode.UNAVAILABLE \
                else Status.ERROR
            await context.abort(exc.code(), exc.details() or exc.code().name)
        except asyncio.CancelledError:
            status = Status.CANCELLED
            call.cancel()
            raise
        finally:
            self.scoring.report(scored.decision_id, target.replica,
                                time.monotonic() - started, status, last=True)
            if span is not None:
                span.end("" if status == Status.OK else status.name)

    # --- relayed metadata ---------------------------------------------------------------------

    async def _relay(self, raw: bytes, method: str, request_type: Any,
                     context: grpc.aio.ServicerContext) -> bytes:
        await self._caller(context)
        try:
            req = request_type.FromString(raw)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request is not a {request_type.__name__}")
        weights = await self._ask(context, self.scoring.weights(req.name, req.version))
        if not weights:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"no ready replica of model {req.name!r} in the mesh")
        last: grpc.aio.AioRpcError | None = None
        for choice, _ in sorted(weights, key=lambda x: -x[1])[:3]:
            try:
                return await self.upstreams.unary(choice.endpoint, method)(  # type: ignore[no-any-return]
                    raw, timeout=context.time_remaining() or CONFIG_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    await context.abort(exc.code(), exc.details() or exc.code().name)
                last = exc
        assert last is not None
        await context.abort(last.code(), last.details() or "no replica answered")
        raise AssertionError("unreachable")

    async def model_metadata(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._relay(raw, "ModelMetadata", service_pb2.ModelMetadataRequest,
                                 context)

    async def model_config(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._relay(raw, "ModelConfig", service_pb2.ModelConfigRequest, context)

    # --- answered from the mesh view ----------------------------------------------------------

    async def server_live(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def server_ready(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        """Ready when some model can be routed."""
        models = await self._ask(context, self.scoring.models())
        return service_pb2.ServerReadyResponse(ready=any(models.values()))

    async def model_ready(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        weights = await self._ask(context, self.scoring.weights(req.name, req.version))
        return service_pb2.ModelReadyResponse(ready=bool(weights))

    async def server_metadata(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerMetadataResponse(name=f"meshd-router ({self.node})",
                                                  version=__version__, extensions=[])

    async def repository_index(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        """Every model version any node serves: READY where a routable replica is."""
        seen = await self._ask(context, self.scoring.models())
        index = [service_pb2.RepositoryIndexResponse.ModelIndex(
            name=m, version=v, state="READY" if ok else "UNAVAILABLE",
            reason="" if ok else "no routable replica")
            for (m, v), ok in sorted(seen.items()) if ok or not req.ready]
        return service_pb2.RepositoryIndexResponse(models=index)


def _unimplemented(name: str, why: str) -> Callable[..., Any]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} through a meshd router: "
                                                           f"{why}")
        raise AssertionError("unreachable")
    return handler

