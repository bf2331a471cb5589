"""The router's HTTP/REST ingress: Triton's KServe v2 HTTP protocol, so tritonclient.http,
curl and any KServe v2 HTTP client work unchanged when pointed at the router.

Like :mod:`meshd.router.kserve` (the gRPC ingress) this is the protocol's shell over
:class:`~meshd.router.gateway.Gateway`: it authenticates the caller, turns each call into the
gateway's (which sends it on to a replica's own HTTP port when its agent names one, through
:mod:`meshd.router.http_dispatch`, and otherwise over gRPC, converted), and renders the
answer, or a :class:`~meshd.router.gateway.RouterError`, the way Triton's HTTP server does
(``server/src/http_server.cc``, 2.51).  Tensor conversion is in
:mod:`meshd.router.http_tensors`.

Endpoints (Triton's paths, matched on the raw path with Triton's own patterns):

- ``GET /v2/health/live|ready``, ``GET /v2/models/{m}[/versions/{v}]/ready``: 200, or 400
  (not ready), with empty bodies (model: ``{"error":"Model version not ready"}``).
- ``GET /v2``: the fleet's server metadata; ``GET /v2/models/{m}[/versions/{v}]`` and
  ``.../config``: relayed to a ready replica and written as Triton writes them;
  ``GET /v2/models[/{m}[/versions/{v}]]/stats``: summed over the replicas;
  ``POST /v2/repository/index``: the whole mesh.
- ``POST .../infer``: JSON tensors and the binary tensor data extension, classification,
  request parameters, raw binary requests (:mod:`~meshd.router.http_tensors`).
- ``POST .../generate`` and ``.../generate_stream`` (the generate extension): a decoupled
  model's responses come over one upstream stream (``Gateway.stream``), written as
  ``data: {...}\\n\\n`` server-sent events; the others go through ``Gateway.infer``.
- System shared memory (``/v2/systemsharedmemory[/region/{r}]/status|register|unregister``)
  through the ``shm`` hook (:class:`meshd.router.shm.Regions`); without one, 501.
- CUDA shared memory, repository load/unload, trace and log settings act on one server: 501
  with the reason (``kserve.NO_SERVER_METHODS``).

Status codes are Triton's for the gRPC code (INVALID_ARGUMENT and most others 400,
NOT_FOUND 404, UNAVAILABLE 503, UNIMPLEMENTED 501, INTERNAL 500) plus the router's own: a shed
request is 429 with ``Retry-After`` (whole seconds) and ``Retry-After-Ms``, a lost sequence
(ABORTED) 409, an expired deadline 504, a refused caller 401 (403 for PERMISSION_DENIED).
Triton answers a malformed body with 500; the router with 400 and Triton's message.

Auth is the gRPC ingress's :class:`~meshd.router.auth.ClientAuth`, unchanged: a bearer token
(``Authorization``) or the mesh client certificate of the TLS connection; trace context
(``traceparent``/``tracestate``), ``x-meshd-tenant`` and ``x-meshd-slo`` are read from the
headers.  Infer requests are counted as gRPC ``ModelInfer`` ones are: received on entry, then
exactly one of completed / failed / shed / invalid / cancelled (a client that disconnects
cancels its request).  Triton's ``timeout`` parameter (microseconds) is the request's
deadline; without it there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import ssl
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from meshd import tracing
from meshd.router import http_tensors as tensors
from meshd.router.auth import (
    SLO_HEADER,
    TENANT_HEADER,
    ClientAuth,
    Unauthenticated,
    bearer_token,
)
from meshd.router.gateway import MESSAGE_HEADROOM, Caller, Gateway, RouterError, sequence_of
from meshd.router.http_dispatch import http_code, picked
from meshd.router.http_tensors import BadRequest, OutputError
from meshd.router.known import Known
from meshd.router.kserve import NO_SERVER_METHODS
from meshd.router.traces import RequestTrace
from meshd.score.scorer import Choice
from meshd.security.front import tls_certificate

INFER_HEADER = "Inference-Header-Content-Length"
_JSON = "application/json"
_PLAIN = "text/plain"
_SSE = "text/event-stream; charset=utf-8"
_HEADERS = ("authorization", TENANT_HEADER, SLO_HEADER, *sorted(tracing.HEADERS))
"""The headers that say who a caller is (authorization first: :meth:`HttpService._caller`)."""
_PASS = frozenset(tracing.HEADERS)

_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SYSTEM_SHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|"
                         r"unregister)")
_CUDA_SHM = re.compile(r"/v2/cudasharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
}
"""gRPC code -> HTTP status: Triton's mapping (its ``HttpCodeFromError``: anything else is
400), and the router's own codes."""

NO_SHM = "this router serves no system shared memory"
DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
GENERATE_ONE = ("generate expects model to produce exactly 1 response, use generate stream for "
                "model that generates various number of responses")


def http_status(code: grpc.StatusCode) -> int:
    return _STATUS.get(code, 400)


def error_response(status: int, message: str, *, plain: bool = False,
                   headers: dict[str, str] | None = None) -> web.Response:
    """Triton's error: ``{"error": message}`` (as text/plain where Triton answers before it has
    set a content type)."""
    body = json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogateescape")
    out = {"Content-Type": _PLAIN if plain else _JSON}
    if headers:
        out.update(headers)
    return web.Response(status=status, body=body, headers=out)


def _router_error(err: RouterError, *, plain_pre_parse: bool = False) -> web.Response:
    """The HTTP answer for a refusal; ``plain_pre_parse`` for the infer endpoint, where Triton
    answers an unknown model (and a decoupled one) before it reads the body, as text/plain."""
    status = http_status(err.code)
    message = err.message
    plain = False
    if plain_pre_parse:
        if err.code == grpc.StatusCode.UNIMPLEMENTED and "decoupled transaction policy" in \
                message:
            message, plain = DECOUPLED, True
        elif err.code == grpc.StatusCode.NOT_FOUND and message.startswith(
                "Request for unknown model"):
            plain = True
    headers = None
    if err.retry_after is not None:
        headers = {"Retry-After": str(max(1, math.ceil(err.retry_after))),
                   "Retry-After-Ms": str(max(1, round(err.retry_after * 1000)))}
    return error_response(status, message, plain=plain, headers=headers)


def _empty(status: int) -> web.Response:
    return web.Response(status=status, headers={"Content-Type": _PLAIN})


def _json_body(doc: Any) -> web.Response:
    return web.Response(body=json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogateescape"), headers={"Content-Type": _JSON})


def _not_allowed(plain: bool) -> web.Response:
    return error_response(405, "Method Not Allowed", plain=plain)


class PeerCertificate:
    """``ClientAuth`` reads the client's certificate from a gRPC context's ``auth_context()``;
    this gives it the certificate of an HTTP request's TLS connection the same way."""

    __slots__ = ("request",)

    def __init__(self, request: web.BaseRequest) -> None:
        self.request = request

    def auth_context(self) -> dict[str, list[bytes]]:
        transport = self.request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        return {"x509_pem_cert": [ssl.DER_cert_to_PEM_cert(der).encode()]} if der else {}


class _Unauthenticated(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


class HttpService:
    """The KServe v2 HTTP endpoints over a :class:`Gateway`.

    ``shm`` serves system shared memory (an object like :class:`meshd.router.shm.Regions`:
    ``register(name, key, offset, byte_size, peer)``, ``unregister(name)``, ``status(name)``,
    and ``infer(req, caller, remaining, rt)``); None answers those endpoints,
    and requests that name a region, with 501."""

    def __init__(self, gateway: Gateway, auth: ClientAuth, shm: Any = None) -> None:
        self.gateway = gateway
        self.auth = auth
        self.shm = shm
        self.max_body = gateway.max_bytes + MESSAGE_HEADROOM
        self._callers: dict[tuple[str | None, ...], Caller] = {}
        """Callers by the headers that decide who they are, where no client certificate
        does (see :meth:`_caller`)."""

    def app(self) -> web.Application:
        """An aiohttp application serving every path (Triton's routing, its 404 included)."""
        app = web.Application(client_max_size=self.max_body)
        # Inference straight to its handler, a coroutine fewer on the hot path; it hands
        # what is not Triton's infer path after all (it reads the raw path) to handle.
        app.router.add_route("*", "/{path:.*/infer}", self.infer)
        app.router.add_route("*", "/{path:.*}", self.handle)
        return app

    # --- routing ------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path
        if path.endswith("/infer"):
            m = _MODEL.fullmatch(path)
            if m is not None and m[3] == "infer":
                return await self.infer(request)
        try:
            caller = self._caller(request)
        except _Unauthenticated as exc:
            return exc.response
        try:
            return await self._route(request, path, caller)
        except RouterError as err:
            return _router_error(err)
        except BadRequest as exc:
            return error_response(exc.status, exc.message, plain=exc.plain, headers=exc.headers)

    async def _route(self, request: web.Request, path: str,
                     caller: Caller) -> web.StreamResponse:
        method = request.method
        if path == "/v2/models/stats":
            return await self.model_stats(request, "", "")
        if path == "/v2/logging":
            return self._no_server(request, "LogSettings", ("GET", "POST"))
        m = _MODEL.fullmatch(path)
        if m is not None:
            model, version, kind = m[1], m[2] or "", m[3] or ""
            if kind == "ready":
                if method != "GET":
                    return _not_allowed(True)
                if await self.gateway.model_ready(model, version):
                    return _empty(200)
                return error_response(400, "Model version not ready", plain=True)
            if kind in ("generate", "generate_stream"):
                return await self.generate(request, model, version, caller,
                                           kind == "generate_stream")
            if kind == "config":
                return await self.model_config(request, model, version)
            if kind == "stats":
                return await self.model_stats(request, model, version)
            if kind == "trace/setting":
                if not version:
                    return self._no_server(request, "TraceSetting", ("GET", "POST"))
            elif kind == "":
                return await self.model_metadata(request, model, version)
        if path == "/v2":
            if method != "GET":
                return _not_allowed(False)
            meta = await self.gateway.server_metadata()
            return _json_body({"name": meta.name, "version": meta.version,
                               "extensions": list(meta.extensions)})
        m = _SERVER.fullmatch(path)
        if m is not None:
            if method != "GET":
                return _not_allowed(True)
            ready = m[1] == "live" or await self.gateway.server_ready()
            return _empty(200 if ready else 400)
        m = _SYSTEM_SHM.fullmatch(path)
        if m is not None:
            return await self.system_shm(request, m[1] or "", m[2])
        m = _CUDA_SHM.fullmatch(path)
        if m is not None:
            # A router holds no CUDA regions: none to list or unregister, as a server with none
            # answers; registering one is what it cannot do.
            action = m[2]
            if action == "register":
                return self._no_server(request, "CudaSharedMemoryRegister", ("POST",))
            if request.method != ("GET" if action == "status" else "POST"):
                return _not_allowed(False)
            if action == "unregister":
                return web.Response(headers={"Content-Type": _JSON})
            if m[1]:
                return error_response(404, f"Unable to find cuda shared memory region: "
                                           f"'{m[1]}'")
            return _json_body([])
        m = _REPOSITORY.fullmatch(path)
        if m is not None:
            if m[2] == "index":
                return await self.repository_index(request)
            return await self.repository_control(request, m[3], m[4] == "load")
        if path == "/v2/trace/setting":
            return self._no_server(request, "TraceSetting", ("GET", "POST"))
        return error_response(404, "Not Found", plain=True)

    def _no_server(self, request: web.Request, name: str,
                   methods: tuple[str, ...]) -> web.Response:
        if request.method not in methods:
            return _not_allowed(False)
        return error_response(501, f"{name} through a meshd router: {NO_SERVER_METHODS[name]}")

    # --- callers ------------------------------------------------------------------------------

    def _caller(self, request: web.Request, counted: bool = False) -> Caller:
        """Tenant, SLO class and trace headers; a 401 answer (counted as a failed request when
        ``counted``) for a caller the router does not accept."""
        seen = tuple(map(request.headers.get, _HEADERS))  # one C loop, no dict per request
        cacheable = self.auth.dev or seen[0] is not None  # no certificate in the verdict
        if cacheable:
            hit = self._callers.get(seen)
            if hit is not None:
                return hit
        md = {k: v for k, v in zip(_HEADERS, seen, strict=True) if v is not None}
        try:
            tenant = self.auth.tenant(md, PeerCertificate(request),  # type: ignore[arg-type]
                                      tls_certificate)
        except Unauthenticated as exc:
            if counted:
                self.gateway.failed("UNAUTHENTICATED")
            extra = {"WWW-Authenticate": "Bearer"} if self.auth.tokens else None
            raise _Unauthenticated(error_response(401, str(exc), headers=extra)) from None
        passed = [(k, v) for k, v in md.items() if k in _PASS]
        caller = Caller(tenant, md.get(SLO_HEADER, ""), passed)
        if cacheable:
            if len(self._callers) >= 256:
                self._callers.clear()
            self._callers[seen] = caller
        return caller

    # --- inference ----------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> bytes:
        """The request body (decompressed: aiohttp undoes gzip and deflate), or BadRequest."""
        try:
            body = await self._read(request)
        except (web.HTTPRequestEntityTooLarge, RequestPayloadError) as exc:
            raise self._unreadable(exc) from None
        if not body:
            _check_empty(request)
        return body

    def _read(self, request: web.Request) -> Awaitable[bytes]:
        """:meth:`_body` as an awaitable that is not a coroutine of its own (one fewer on
        the inference path): what it raises is for :meth:`_unreadable`, and an empty body
        for :func:`_check_empty`."""
        encoding = request.headers.get("Content-Encoding")
        if encoding is not None and encoding not in _DECODED:
            return _refuse_encoding(request)
        return request.read()

    def _unreadable(self, exc: Exception) -> BadRequest:
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            return BadRequest(f"request body exceeds the router's limit of {self.max_body} "
                              "bytes", 413)
        return BadRequest("encountered inconsistent stream state during decompression",
                          plain=True)

    async def infer(self, request: web.Request) -> web.StreamResponse:
        """One inference request.  Every path out of here (once it is counted) counts it
        exactly once as completed, failed, shed, invalid or cancelled."""
        m = _MODEL.fullmatch(request.rel_url.raw_path)
        if m is None or m[3] != "infer":
            return await self.handle(request)  # a path the infer route took that is not one
        model, version = m[1], m[2] or ""
        if request.method != "POST":
            return _not_allowed(True)
        gw = self.gateway
        c = gw.counters
        c.requests += 1
        rt: RequestTrace | None = None
        try:
            try:
                caller = self._caller(request, counted=True)
            except _Unauthenticated as exc:
                return exc.response
            tracer = gw.tracer
            if tracer is not None:
                rt = tracer.start("router HTTP infer", caller.passed)
            try:
                try:  # self._body(request), one coroutine fewer
                    body = await self._read(request)
                except (web.HTTPRequestEntityTooLarge, RequestPayloadError) as exc:
                    raise self._unreadable(exc) from None
                if not body:
                    _check_empty(request)
                head = tensors.header_length(request.headers.get(INFER_HEADER), len(body))
            except BadRequest as exc:
                c.invalid += 1
                if rt is not None:
                    rt.finish("INVALID_ARGUMENT", {"http.response.status_code": exc.status})
                return error_response(exc.status, exc.message, plain=exc.plain,
                                      headers=exc.headers)
            now = gw.clock()
            # A binary request's JSON header, its body's length and the model decide its
            # validation (meshd.router.known): seen before, neither parsed nor validated.
            # (A JSON-only body carries its data in the header: never the same twice.)
            size = len(body)
            key = (model, version, body[:head], size) if 0 < head < size else None
            known = gw.current(gw.known.get(key), now) if key is not None else None
            if known is not None:
                payload, remaining = known.payload, known.timeout
                raw: bytes | None = None
            else:
                try:
                    raw, req, plan = await self._converted(model, version, body, head)
                except BadRequest as exc:
                    c.invalid += 1
                    if rt is not None:
                        rt.finish("INVALID_ARGUMENT",
                                  {"http.response.status_code": exc.status})
                    return error_response(exc.status, exc.message, plain=exc.plain,
                                          headers=exc.headers)
                remaining = plan.timeout
                if plan.uses_shm:
                    if self.shm is None:
                        gw.failed("UNIMPLEMENTED")
                    reply = await self._regions().infer(req, caller, remaining, rt)
                    return self._rendered(reply, plan, rt)
                schema, payload = await gw.validated(req, now)
                seq = sequence_of(req)
                if seq is not None:  # sequences keep to gRPC (meshd.router.http_dispatch)
                    reply = await gw.route(raw, model, version, payload, seq, caller,
                                           remaining, rt, now)
                    return self._rendered(reply, plan, rt)
                if key is not None and schema.data_free:
                    gw.known.put(key, Known(model, version, payload, schema, remaining))
            scored = gw.admit_now(model, version, payload, None, caller, remaining, rt, now)
            if scored is None:
                scored = await gw.admit(model, version, payload, None, caller, remaining, rt)
            if _all_http(scored.targets):
                got = await gw.send_http(request.rel_url.raw_path, body,
                                         picked(request.headers, FORWARDED), scored, caller,
                                         remaining, rt, now)
                if rt is not None:
                    rt.finish("" if got.status < 400 else http_code(got.status).name,
                              {"http.response.status_code": got.status})
                return web.Response(status=got.status, body=got.body, headers=got.headers)
            # A replica without an HTTP endpoint: the request goes over gRPC, converted.
            if raw is None:
                try:
                    raw, req, plan = await self._converted(model, version, body, head)
                except BaseException:
                    gw.abandon(scored, "INTERNAL")
                    raise
            reply = await gw.send(raw, scored, model, None, caller, remaining, rt, now)
            return self._rendered(reply, plan, rt)
        except RouterError as err:
            refused = _router_error(err, plain_pre_parse=True)
            if rt is not None:
                rt.finish(err.code.name, {"http.response.status_code": refused.status})
            return refused
        except OutputError as exc:
            # Triton ran the request; the protocol cannot carry its answer as asked.
            if rt is not None:
                rt.finish("OUTPUT", {"http.response.status_code": exc.status})
            return error_response(exc.status, exc.message)
        except DecodeError:  # Triton's gRPC answered what is no ModelInferResponse
            if rt is not None:
                rt.finish("INTERNAL", {"http.response.status_code": 500})
            return error_response(500, "the replica's reply is not a ModelInferResponse")
        except asyncio.CancelledError:
            c.cancelled += 1
            if rt is not None:
                rt.finish("CANCELLED")
            raise

    @staticmethod
    def _rendered(reply: bytes, plan: tensors.OutputPlan, rt: RequestTrace | None
                  ) -> web.Response:
        """A gRPC reply (``ModelInferResponse`` bytes) as Triton's HTTP answer, as ``plan``
        asks (binary outputs, classification)."""
        resp, raws = tensors.split_response(reply)
        body, out_head = tensors.render_infer(resp, raws, plan)
        if rt is not None:
            rt.finish()
        if out_head:
            return web.Response(body=body, headers={
                "Content-Type": "application/octet-stream", INFER_HEADER: str(out_head)})
        return web.Response(body=body, headers={"Content-Type": _JSON})

    async def _converted(self, model: str, version: str, body: bytes, head: int
                         ) -> tuple[bytes, service_pb2.ModelInferRequest, tensors.OutputPlan]:
        """The body as a gRPC request (BadRequest when it is not one): a JSON header
        (``head`` bytes) and its binary data, or Triton's raw binary request (``head`` 0)."""
        if head:
            return tensors.infer_request(model, version, body, head)
        return await self._raw_request(model, version, body)

    async def _raw_request(self, model: str, version: str, body: bytes
                           ) -> tuple[bytes, service_pb2.ModelInferRequest, tensors.OutputPlan]:
        """Triton's raw binary request: the body is the model's one input."""
        gw = self.gateway
        schema = await gw._schema(model, version, gw.clock())  # a request: counted
        inputs = [(spec.name, spec.datatype, spec.dims) for spec in schema.inputs.values()]
        return tensors.raw_request(model, version, body, schema.max_batch_size, inputs)

    # --- generate -----------------------------------------------------------------------------

    async def generate(self, request: web.Request, model: str, version: str, caller: Caller,
                       streaming: bool) -> web.StreamResponse:
        """Triton's generate extension: JSON fields are the model's inputs (or request
        parameters); the answer is every output as a field, one JSON object, or one
        server-sent event per response for ``generate_stream``."""
        if request.method != "POST":
            return _not_allowed(False)
        schema = await self.gateway.schema(model, version)
        batch = [-1] if schema.max_batch_size > 0 else []
        inputs = {name: tensors.GenerateInput(spec.datatype, (*batch, *spec.dims))
                  for name, spec in schema.inputs.items()}
        encoding = request.headers.get("Content-Encoding")
        if encoding is not None and encoding not in ("", "identity"):
            await _drain(request)
            raise BadRequest("Unsupported content-encoding, only 'identity' is supported.")
        body = await self._body(request)
        raw, req = tensors.generate_request(model, version, body, inputs)
        tracer = self.gateway.tracer
        rt = tracer.start("router HTTP generate", caller.passed) if tracer is not None else None
        error = ""
        try:
            if schema.decoupled:
                return await self._generate_stream(request, raw, caller, rt, streaming)
            return await self._generate_one(request, raw, req, caller, rt, streaming)
        except RouterError as err:
            error = err.code.name
            raise
        except asyncio.CancelledError:
            error = "CANCELLED"
            raise
        finally:
            if rt is not None:
                rt.finish(error)

    async def _generate_one(self, request: web.Request, raw: bytes,
                            req: service_pb2.ModelInferRequest, caller: Caller,
                            rt: RequestTrace | None, streaming: bool) -> web.StreamResponse:
        """A model with one response per request: through ``Gateway.infer`` (counted as an
        inference request)."""
        c = self.gateway.counters
        c.requests += 1
        try:
            reply = await self.gateway.infer(raw, req, caller, None, rt)
        except asyncio.CancelledError:
            c.cancelled += 1
            raise
        try:
            body = tensors.render_generate(*tensors.split_response(reply))
        except OutputError as exc:
            return error_response(exc.status, exc.message)
        except DecodeError:
            return error_response(500, "the replica's reply is not a ModelInferResponse")
        if not streaming:
            return web.Response(body=body, headers={"Content-Type": _JSON})
        return web.Response(body=b"data: " + body + b"\n\n", headers={"Content-Type": _SSE})

    async def _generate_stream(self, request: web.Request, raw: bytes, caller: Caller,
                               rt: RequestTrace | None,
                               streaming: bool) -> web.StreamResponse:
        """A decoupled model: its responses come over one upstream stream; each is an event of
        ``generate_stream``, and ``generate`` wants exactly one.  The status is the first
        response's (an error's code is not carried on a stream: 400, 429 for a shed one)."""
        async def one() -> AsyncIterator[bytes]:
            yield raw
        replies = self.gateway.stream(one(), caller, rt)
        events: list[tuple[int, bytes]] = []
        response: web.StreamResponse | None = None
        try:
            async for reply in replies:
                event = _stream_event(reply)
                if not streaming:
                    events.append(event)
                    continue
                if response is None:
                    if event[0] != 200:
                        # Refused before it ran (the router's or Triton's checks): Triton
                        # answers such a request with a JSON error, not a stream.
                        return web.Response(status=event[0], body=event[1],
                                            headers={"Content-Type": _JSON})
                    response = web.StreamResponse(headers={"Content-Type": _SSE})
                    await response.prepare(request)
                await response.write(b"data: " + event[1] + b"\n\n")
        except RouterError as err:
            if response is None and (streaming or not events):
                raise
            failed = (http_status(err.code), _error_body(err.message))
            if response is None:
                events.append(failed)
            else:
                await response.write(b"data: " + failed[1] + b"\n\n")
        finally:
            await replies.aclose()  # type: ignore[attr-defined]
        if streaming:
            if response is None:
                return web.Response(status=200, headers={"Content-Type": _SSE})
            await response.write_eof()
            return response
        if len(events) != 1:
            status = events[0][0] if events else 200
            return web.Response(status=status, body=_error_body(GENERATE_ONE),
                                headers={"Content-Type": _JSON})
        return web.Response(status=events[0][0], body=events[0][1],
                            headers={"Content-Type": _JSON})

    # --- about models and the fleet -----------------------------------------------------------

    async def model_metadata(self, request: web.Request, model: str,
                             version: str) -> web.Response:
        if request.method != "GET":
            return _not_allowed(False)
        raw = await self.gateway.relay("ModelMetadata", model, version,
                                       service_pb2.ModelMetadataRequest(
                                           name=model, version=version).SerializeToString(),
                                       None)
        meta = service_pb2.ModelMetadataResponse.FromString(raw)
        return _json_body(tensors.message_json(meta))

    async def model_config(self, request: web.Request, model: str,
                           version: str) -> web.Response:
        if request.method != "GET":
            return _not_allowed(False)
        raw = await self.gateway.relay("ModelConfig", model, version,
                                       service_pb2.ModelConfigRequest(
                                           name=model, version=version).SerializeToString(),
                                       None)
        config = service_pb2.ModelConfigResponse.FromString(raw).config
        return _json_body(tensors.config_json(config))

    async def model_stats(self, request: web.Request, model: str, version: str) -> web.Response:
        if request.method != "GET":
            return _not_allowed(False)
        stats = await self.gateway.statistics(model, version)
        return _json_body(tensors.message_json(stats, every_message=True))

    async def repository_control(self, request: web.Request, model: str,
                                 load: bool) -> web.Response:
        """``POST /v2/repository/models/{name}/load|unload``: at least one ready replica in
        the mesh, or none (:meth:`Gateway.repository_control`), for the caller's credential;
        parameters that act on one server's repository (a config, model files) are
        refused."""
        if request.method != "POST":
            return _not_allowed(False)
        body = await request.read()
        config = ""
        if body:
            doc = tensors.load_json(body)
            params = doc.get("parameters") if isinstance(doc, dict) else None
            if isinstance(params, dict):
                if any(k.startswith("file:") for k in params):
                    return error_response(501, "model files act on one server's repository; "
                                               "through the mesh a model loads from each "
                                               "server's own")
                if "config" in params:
                    if not isinstance(params["config"], str):
                        raise BadRequest("parameters.config must be a JSON string")
                    config = params["config"]
        pems = PeerCertificate(request).auth_context().get("x509_pem_cert") or [b""]
        await self.gateway.repository_control(
            model, load, pems[0], bearer_token(request.headers.get("Authorization", "")),
            request.remote or "", None, config if load else "")
        return _empty(200)

    async def repository_index(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return _not_allowed(False)
        body = await request.read()
        ready = False
        if body:
            doc = tensors.load_json(body)
            if isinstance(doc, dict) and "ready" in doc:
                if type(doc["ready"]) is not bool:
                    raise BadRequest("attempt to access JSON non-boolean as boolean")
                ready = doc["ready"]
        index = await self.gateway.repository_index(ready)
        out = []
        for m in index.models:
            entry = {"name": m.name}
            if m.version:
                entry["version"] = m.version
            entry["state"] = m.state
            if m.reason:
                entry["reason"] = m.reason
            out.append(entry)
        return _json_body(out)

    # --- system shared memory -----------------------------------------------------------------

    def _regions(self) -> Any:
        if self.shm is None:
            raise RouterError(grpc.StatusCode.UNIMPLEMENTED, NO_SHM)
        return self.shm

    async def system_shm(self, request: web.Request, region: str, action: str) -> web.Response:
        if request.method != ("GET" if action == "status" else "POST"):
            return _not_allowed(False)
        shm = self._regions()
        if action == "status":
            status = shm.status(region)
            return _json_body([{"name": r.name, "key": r.key, "offset": r.offset,
                                "byte_size": r.byte_size} for r in status.regions.values()])
        if action == "unregister":
            shm.unregister(region)
            return web.Response(headers={"Content-Type": _JSON})
        if not region:
            raise BadRequest("'region name' is necessary to register system shared memory "
                             "region")
        doc = tensors.load_json(await request.read())
        doc = doc if isinstance(doc, dict) else {}
        if "key" not in doc:
            raise BadRequest("Shared memory register request has no 'key' field")
        key = doc["key"]
        if type(key) is not str:
            raise BadRequest("attempt to access JSON non-string as string")
        offset = doc.get("offset", 0)
        if "byte_size" not in doc:
            raise BadRequest("Shared memory register request has no 'byte_size' field")
        byte_size = doc["byte_size"]
        for value in (offset, byte_size):
            if type(value) is not int or value < 0:
                raise BadRequest("attempt to access JSON non-unsigned-integer as "
                                 "unsigned-integer")
        shm.register(region, key, offset, byte_size, request.remote or "")
        return web.Response(headers={"Content-Type": _JSON})


FORWARDED = ("Content-Type", INFER_HEADER, "Accept-Encoding")
"""The client's headers a replica's HTTP endpoint gets with a forwarded request (the body
is forwarded decompressed; trace headers are added per attempt)."""


def _all_http(targets: list[Choice]) -> bool:
    """Whether every target serves HTTP (the request is forwarded as it came)."""
    for t in targets:  # not all(): no generator per request
        if not t.http:
            return False
    return True


_DECODED = frozenset(("gzip", "deflate", "", "identity"))
"""Request Content-Encodings a body may come in (aiohttp undoes gzip and deflate)."""


async def _refuse_encoding(request: web.Request) -> bytes:
    await _drain(request)
    raise BadRequest("Unsupported compression type", 501, plain=True,
                     headers={"Accept-Encoding": "gzip, deflate"})


def _check_empty(request: web.Request) -> None:
    """An empty body said to be compressed is Triton's error."""
    if request.headers.get("Content-Encoding") in ("gzip", "deflate"):
        raise BadRequest("nothing to be decompressed", plain=True)


async def _drain(request: web.Request) -> None:
    """Read a body that will not be used (left unread, aiohttp reads it after the answer, and
    logs its failure to decode one that is not in its declared encoding)."""
    with contextlib.suppress(RequestPayloadError, web.HTTPException):
        await request.read()


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogateescape")


def _stream_event(reply: bytes) -> tuple[int, bytes]:
    """(status, JSON) of one ``ModelStreamInferResponse`` of a generate stream."""
    try:
        msg = service_pb2.ModelStreamInferResponse.FromString(reply)
    except DecodeError:
        return 500, _error_body("the replica's reply is not a ModelStreamInferResponse")
    if msg.error_message:
        status = 429 if msg.error_message.startswith("shed: ") else 400
        return status, _error_body(msg.error_message)
    try:
        resp, raws = tensors.split_response(msg.infer_response.SerializeToString())
        return 200, tensors.render_generate(resp, raws)
    except OutputError as exc:
        return exc.status, _error_body(exc.message)

