"""The router's gRPC ingress: Triton's ``GRPCInferenceService`` (KServe v2 gRPC), so existing
tritonclient code works unchanged when pointed at the router.

This module is the protocol's shell over :class:`~meshd.router.gateway.Gateway`, which does
the work: it authenticates the caller, parses what it must, and turns a
:class:`~meshd.router.gateway.RouterError` into the call's status.

- ``ModelInfer``: parsed once (validation, sizing, sequence affinity), then the client's bytes
  go to the chosen replica as they are.  A shed request is RESOURCE_EXHAUSTED with a
  ``retry-after-ms`` trailer, at once: never a timeout.
- ``ModelStreamInfer``: each message routed where it belongs (see ``Gateway.stream``).
- ``ModelStatistics`` is summed over the model's replicas; ``ServerMetadata`` is the fleet's
  Triton with the extensions the router serves; ``RepositoryIndex`` covers the whole mesh;
  ``ModelMetadata``/``ModelConfig`` are relayed to a ready replica.
- System shared memory is served by :mod:`meshd.router.shm` (regions on the router's host).
- ``RepositoryModelLoad`` means "at least one ready replica in the mesh" and
  ``RepositoryModelUnload`` "none": the model's ModelPin is written for the caller, whose
  credential the agent checks (meshd/models).
- CUDA shared memory, trace and log settings act on one server; through a
  router they would act on an arbitrary replica, so they are UNIMPLEMENTED, saying why.

Deadlines propagate (the client's, less the time spent here), and so does the W3C trace
context (``traceparent``, ``tracestate``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from meshd import tracing
from meshd.router.auth import SLO_HEADER, ClientAuth, Unauthenticated, bearer_token
from meshd.router.gateway import Caller, Gateway, RouterError
from meshd.router.traces import RequestTrace

PASS_HEADERS = tracing.HEADERS
NO_SERVER_METHODS = {
    "CudaSharedMemoryRegister": "CUDA shared memory lives in one GPU server's device memory; "
                                "a router cannot read or write it (use system shared memory "
                                "or send tensors in the request)",
    "TraceSetting": "trace settings act on one server; the router traces with OTLP",
    "LogSettings": "log settings act on one server",
}


def _code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status an aborted call ended with."""
    code = context.code()  # type: ignore[attr-defined]
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


async def _abort(context: grpc.aio.ServicerContext, err: RouterError) -> NoReturn:
    if err.retry_after is not None:
        context.set_trailing_metadata((("retry-after-ms",
                                        str(max(1, round(err.retry_after * 1000)))),))
    await context.abort(err.code, err.message)
    raise AssertionError("unreachable")


class KServeService:
    """The ``inference.GRPCInferenceService`` handlers over a :class:`Gateway`."""

    def __init__(self, gateway: Gateway, auth: ClientAuth) -> None:
        self.gateway = gateway
        self.auth = auth
        self._callers: dict[tuple[Any, ...], Caller] = {}
        """Callers by their metadata, where that alone decides who they are (no client
        certificate to check): a client sends the same metadata on every call."""

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
            "RepositoryModelLoad": self._typed(self.repository_load,
                                               svc.RepositoryModelLoadRequest),
            "RepositoryModelUnload": self._typed(self.repository_unload,
                                                 svc.RepositoryModelUnloadRequest),
            "ModelStatistics": self._typed(self.model_statistics, svc.ModelStatisticsRequest),
            "SystemSharedMemoryRegister": self._typed(self.shm_register,
                                                      svc.SystemSharedMemoryRegisterRequest),
            "SystemSharedMemoryUnregister": self._typed(self.shm_unregister,
                                                        svc.SystemSharedMemoryUnregisterRequest),
            "SystemSharedMemoryStatus": self._typed(self.shm_status,
                                                    svc.SystemSharedMemoryStatusRequest),
            "CudaSharedMemoryStatus": self._typed(self.cuda_status,
                                                  svc.CudaSharedMemoryStatusRequest),
            "CudaSharedMemoryUnregister": self._typed(self.cuda_unregister,
                                                      svc.CudaSharedMemoryUnregisterRequest),
        }
        for name, why in NO_SERVER_METHODS.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(_unimplemented(name, why))
        return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers)

    def _typed(self, fn: Callable[..., Any], request_type: Any) -> grpc.RpcMethodHandler:
        """A handler for a parsed request, callable only by an authenticated client; a
        :class:`RouterError` ends the call with its status."""
        async def handler(req: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._caller(context)
            try:
                return await fn(req, context)
            except RouterError as err:
                await _abort(context, err)
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString())

    async def _caller(self, context: grpc.aio.ServicerContext,
                      counted: bool = False) -> Caller:
        """Tenant, SLO class and the metadata to pass on; UNAUTHENTICATED (counted as a
        failed request when ``counted``) for a caller the router does not accept."""
        raw = context.invocation_metadata() or ()
        hit = self._callers.get(raw)
        if hit is not None:
            return hit
        md = {k: v for k, v in raw if isinstance(v, str)}
        try:
            tenant = self.auth.tenant(md, context)
        except Unauthenticated as exc:
            if counted:
                self.gateway.failed("UNAUTHENTICATED")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        passed = [(k, v) for k, v in md.items() if k in PASS_HEADERS]
        caller = Caller(tenant, md.get(SLO_HEADER, ""), passed)
        if self.auth.dev or "authorization" in md:  # no certificate in the verdict
            callers = self._callers
            if len(callers) >= 256:
                callers.clear()
            callers[raw] = caller
        return caller

    # --- inference ----------------------------------------------------------------------------

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One request.  Every path out of here counts it exactly once as completed, failed,
        shed, invalid or cancelled (so ``requests`` less those is what is in flight).

        The request is a trace when tracing is on and the sampler keeps it (its context read
        from the client's trace headers, which ``_caller`` picks out); otherwise ``rt`` is None
        and the client's context passes on as it is."""
        gw = self.gateway
        c = gw.counters
        c.requests += 1
        rt: RequestTrace | None = None
        try:
            # A caller seen before without a coroutine (the hot path); else the whole check.
            caller = self._callers.get(context.invocation_metadata() or ())
            if caller is None:
                caller = await self._caller(context, counted=True)
            tracer = gw.tracer
            if tracer is not None:
                rt = tracer.start("router ModelInfer", caller.passed)
            key, known = gw.recognise(raw)
            if known is not None:  # validated before: no parsing, no validation
                # gw.route's steps, without its coroutine in between
                now = gw.clock()
                model, version, remaining = known.model, known.version, context.time_remaining()
                scored = gw.admit_now(model, version, known.payload, None, caller, remaining,
                                      rt, now)
                if scored is None:
                    scored = await gw.admit(model, version, known.payload, None, caller,
                                            remaining, rt)
                reply = await gw.send(raw, scored, model, None, caller, remaining, rt, now)
            else:
                try:
                    req = service_pb2.ModelInferRequest.FromString(raw)
                except DecodeError:
                    c.invalid += 1
                    raise RouterError(grpc.StatusCode.INVALID_ARGUMENT,
                                      "request is not a ModelInferRequest") from None
                reply = await gw.infer(raw, req, caller, context.time_remaining(), rt,
                                       key=key)
        except RouterError as err:
            if rt is not None:
                rt.finish(err.code.name, {"rpc.grpc.status_code": err.code.value[0]})
            await _abort(context, err)
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

    async def model_stream_infer(self, requests: AsyncIterator[bytes],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Traced (when sampled) as the stream's span, its score decisions, and the Triton
        streams."""
        gw = self.gateway
        caller = await self._caller(context)
        tracer = gw.tracer
        rt = tracer.start("router ModelStreamInfer", caller.passed) if tracer is not None \
            else None
        error = ""
        try:
            async for reply in gw.stream(requests, caller, rt):
                yield reply
        except RouterError as err:
            error = err.code.name
            await _abort(context, err)
        except asyncio.CancelledError:
            error = "CANCELLED"
            raise
        finally:
            if rt is not None:
                rt.finish(error)

    # --- about models and the fleet -----------------------------------------------------------

    async def _relay(self, raw: bytes, method: str, request_type: Any,
                     context: grpc.aio.ServicerContext) -> bytes:
        await self._caller(context)
        try:
            req = request_type.FromString(raw)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request is not a {request_type.__name__}")
        try:
            return await self.gateway.relay(method, req.name, req.version, raw,
                                            context.time_remaining())
        except RouterError as err:
            await _abort(context, err)

    async def model_metadata(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._relay(raw, "ModelMetadata", service_pb2.ModelMetadataRequest,
                                 context)

    async def model_config(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._relay(raw, "ModelConfig", service_pb2.ModelConfigRequest, context)

    async def server_live(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def server_ready(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=await self.gateway.server_ready())

    async def model_ready(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = await self.gateway.model_ready(req.name, req.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def server_metadata(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.gateway.server_metadata()

    async def repository_index(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.gateway.repository_index(req.ready)

    async def repository_load(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._repository(req, context, load=True)
        return service_pb2.RepositoryModelLoadResponse()

    async def repository_unload(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._repository(req, context, load=False)
        return service_pb2.RepositoryModelUnloadResponse()

    async def _repository(self, req: Any, context: grpc.aio.ServicerContext, *,
                          load: bool) -> None:
        """Load: at least one ready replica in the mesh (with ``config``, the Triton config
        every replica loads with); unload: none (see :meth:`Gateway.repository_control`),
        for the caller's own credential.  Model files act on one server's repository:
        refused."""
        if any(key.startswith("file:") for key in req.parameters):
            raise RouterError(grpc.StatusCode.UNIMPLEMENTED,
                              "model files act on one server's repository; through the mesh "
                              "a model loads from each server's own")
        config = req.parameters["config"].string_param if "config" in req.parameters else ""
        md = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        await self.gateway.repository_control(
            req.model_name, load, self.auth.certificate(context) or b"",
            bearer_token(md.get("authorization", "")), str(context.peer()),
            context.time_remaining(), config if load else "")

    async def model_statistics(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.gateway.statistics(req.name, req.version)


    # --- system shared memory -----------------------------------------------------------------

    def _regions(self) -> Any:
        shm = self.gateway.shm
        if shm is None:
            raise RouterError(grpc.StatusCode.UNIMPLEMENTED,
                              "this router serves no system shared memory")
        return shm

    async def shm_register(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        self._regions().register(req.name, req.key, req.offset, req.byte_size, context.peer())
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def shm_unregister(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        self._regions().unregister(req.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def shm_status(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._regions().status(req.name)


    # A router holds no CUDA regions: none to list or unregister, as a server with none
    # answers; registering one is what it cannot do (NO_SERVER_METHODS).

    async def cuda_status(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        if req.name:
            raise RouterError(grpc.StatusCode.NOT_FOUND,
                              f"Unable to find cuda shared memory region: '{req.name}'")
        return service_pb2.CudaSharedMemoryStatusResponse()

    async def cuda_unregister(self, req: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.CudaSharedMemoryUnregisterResponse()


def _unimplemented(name: str, why: str) -> Callable[..., Any]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} through a meshd router: "
                                                           f"{why}")
        raise AssertionError("unreachable")
    return handler
