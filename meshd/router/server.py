"""Start the router's KServe v2 gRPC ingress (``meshd --role router``).

Plaintext only in ``--dev``.  Otherwise TLS with the node's identity; clients present a mesh
client certificate or, when a token file is configured, a per-tenant bearer token instead
(the handshake then asks for no certificate: see ``auth``).

Memory.  No request is larger than the payload limit plus headroom: gRPC refuses a larger
message (RESOURCE_EXHAUSTED) and the HTTP ingress a larger body (413, before reading any of
it when its Content-Length says so).  gRPC checks a message's size only once it has all of
it, though (measured, grpcio 1.81: a 900 MiB message is read whole, then refused), so an
oversized message costs the process that serves the port its size for as long as it takes
to arrive: a worker, never the agent; router workers give such memory back every second.

:class:`Inflight` bounds what the requests a router process holds (received, not yet
answered) weigh.  A request beyond it is shed at once (RESOURCE_EXHAUSTED with a
``retry-after-ms`` trailer; HTTP 429), counted as ``shed{reason="memory"}``, before it is
parsed (an HTTP body before it is read).  Small requests keep a quarter of the bound beyond
it to themselves, so large ones cannot crowd them out.  A request weighs its bytes, and a
large one (``WEIGH_FROM`` and up) also what parsing it will add: a message of many small
fields parses into many times its size (8 MiB of empty ``inputs`` entries take 350 MB once
parsed).  :func:`parsed_weight` walks a large ``ModelInferRequest``'s wire form without
parsing it (a few steps for a real request, whose size is in a few tensors) and refuses one
of more than ``MAX_ELEMENTS`` fields (INVALID_ARGUMENT, counted invalid); a large HTTP
body's JSON weighs ``JSON_FACTOR`` times its bytes (:func:`http_weight`), its binary tensors
their bytes.  One request alone is taken whatever it weighs, so what is held is at most the
bound (and its quarter) or the heaviest single request.
"""

from __future__ import annotations

import logging
import ssl
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import service_pb2

from certs import tls
from certs.verify import PeerVerifier
from meshd.router.auth import ClientAuth, load_tokens
from meshd.router.counters import RouterCounters
from meshd.router.gateway import MESSAGE_HEADROOM, Gateway
from meshd.router.http import INFER_HEADER, HttpService, error_response
from meshd.router.http_tensors import BadRequest, header_length
from meshd.router.kserve import KServeService
from meshd.router.scoring import Scoring
from meshd.router.shm import Regions
from meshd.router.upstream import MAX_MESSAGE
from meshd.security.audit import AuditLog
from meshd.security.front import PeerTable, front_grpc, recorder, server_context
from meshd.security.https import CountedTlsSite

log = logging.getLogger("meshd.router")

HTTP_GRACE = 5.0
"""Seconds the HTTP ingress gives requests in flight when it stops."""
MEMORY_RETRY = 0.1
"""Seconds a request shed for memory is told to wait before it is sent again."""
INFER = "/inference.GRPCInferenceService/ModelInfer"
WEIGH_FROM = 1 << 20
"""Bytes from which a request's parsed size is estimated (smaller ones weigh their bytes)."""
MAX_ELEMENTS = 1 << 16
"""Fields a large ``ModelInferRequest`` may hold (a packed array counts once): real ones hold
tens; a message of more is refused before it is parsed."""
ELEMENT = 64
"""Bytes one parsed field takes beyond its contents (a message, a string, an array slot), at
most: the weights' unit."""
JSON_FACTOR = 16
"""Bytes a byte of JSON takes once parsed, at most, about (``[0.0,0.0,...]``: a float object
and a list slot for every 4 bytes; ``[[],[],...]``: an empty list for every 3)."""


class TooManyFields(ValueError):
    """A message of more fields than the router parses."""


_MESSAGE, _STRING, _VARINT, _FIXED = range(4)
_VARINT_TYPES = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM})
_KINDS: dict[str, dict[int, tuple[int, Any]]] = {}
_HIGH = bytes(range(128, 256))


def _kinds(desc: Descriptor) -> dict[int, tuple[int, Any]]:
    """Field number -> how its length-delimited form parses (and the message's descriptor)."""
    kinds = _KINDS.get(desc.full_name)
    if kinds is None:
        kinds = _KINDS[desc.full_name] = {}
        for f in desc.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                kinds[f.number] = (_MESSAGE, f.message_type)
            elif f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
                kinds[f.number] = (_STRING, None)
            elif f.type in _VARINT_TYPES:
                kinds[f.number] = (_VARINT, None)
            else:
                kinds[f.number] = (_FIXED, None)
    return kinds


def _varint(buf: bytes, pos: int, first: int) -> tuple[int, int]:
    """The rest of a varint whose first byte (``first``, high bit set) came before ``pos``:
    its value and the position past it; ValueError past 64 bits, IndexError past the end."""
    value, shift = first & 0x7F, 7
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint")


def _walk(buf: bytes, pos: int, end: int, desc: Descriptor, left: list[int]) -> int:
    """What parsing ``buf[pos:end]`` as ``desc`` adds beyond its bytes, about; TooManyFields
    when ``left[0]`` fields run out; IndexError or ValueError at bytes that are not a
    message (the parser then refuses them)."""
    kinds = _kinds(desc)
    extra = 0
    while pos < end:
        key = buf[pos]
        pos += 1
        if key & 0x80:
            key, pos = _varint(buf, pos, key)
        left[0] -= 1
        if left[0] < 0:
            raise TooManyFields
        wire = key & 7
        if wire == 0:
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
            extra += 8
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n = buf[pos]
            pos += 1
            if n & 0x80:
                n, pos = _varint(buf, pos, n)
            stop = pos + n
            if stop > end:
                raise ValueError("length")
            kind, sub = kinds.get(key >> 3, (_STRING, None))
            if kind == _MESSAGE:
                extra += ELEMENT + _walk(buf, pos, stop, sub, left)
            elif kind == _VARINT:  # packed: an 8-byte slot for each varint (its last byte)
                extra += 8 * len(buf[pos:stop].translate(None, _HIGH))
            else:
                extra += ELEMENT
            pos = stop
        else:
            raise ValueError("wire type")
    if pos != end:
        raise ValueError("past the end")
    return extra


def parsed_weight(raw: bytes, desc: Descriptor = service_pb2.ModelInferRequest.DESCRIPTOR,
                  max_elements: int = MAX_ELEMENTS) -> int:
    """What holding ``raw`` and its parsed message takes, about: twice its bytes (the
    message, and the parsed copy of its strings) and what its fields add.  TooManyFields
    beyond ``max_elements`` fields; bytes that are not a message weigh their size (the
    parser refuses them at the first bad byte)."""
    try:
        return 2 * len(raw) + _walk(raw, 0, len(raw), desc, [max_elements])
    except TooManyFields:
        raise
    except (IndexError, ValueError):
        return len(raw)


def http_weight(size: int, header: str | None) -> int:
    """What an HTTP inference body of ``size`` bytes takes once parsed, at most, from its
    ``Inference-Header-Content-Length`` (None: all JSON): its binary part weighs its bytes,
    its JSON ``JSON_FACTOR`` times its bytes (each value of an array becomes a Python
    object)."""
    try:
        head = header_length(header, size)
    except BadRequest:  # the handler refuses it before it reads the body
        head = size
    return size + (JSON_FACTOR - 1) * head


class Inflight:
    """What the requests this router process holds (received, not yet answered) weigh,
    bounded by ``limit``: a large request (``WEIGH_FROM`` and up) is taken while the weight
    held, its own included, stays within the bound, a small one within the bound and a
    quarter more (so large requests cannot crowd small ones out), and any request when
    nothing else is held (so one of any size the receive limits let through passes; it
    counts as the bound, so the small ones keep their quarter beside it)."""

    __slots__ = ("limit", "small_limit", "held", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.small_limit = limit + limit // 4
        self.held = 0
        self.peak = 0

    def take(self, n: int) -> int | None:
        """Hold ``n`` bytes more (at most the bound), if it allows: the weight held, for
        :meth:`give`, or None."""
        held = self.held
        if held and held + n > (self.limit if n >= WEIGH_FROM else self.small_limit):
            return None
        if n > self.limit:
            n = self.limit
        self.held = held = held + n
        if held > self.peak:
            self.peak = held
        return n

    def give(self, n: int) -> None:
        self.held -= n

    def refusal(self, n: int) -> str:
        return (f"shed: memory: a request of {n} bytes while this router holds {self.held} "
                f"bytes of requests in flight (limit {self.limit}); retry after "
                f"{MEMORY_RETRY:.3f} s")


def _forget(exc: BaseException) -> None:
    """Clear the locals of the finished frames of ``exc`` and the exceptions it chains."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen or len(seen) > 16:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)  # those still running are left as they are
        todo += [e.__context__, e.__cause__]


def _shed_memory(gateway: Gateway) -> None:
    """A request refused for memory, counted as it is received and shed."""
    c = gateway.counters
    c.requests += 1
    c.shed["memory"] = c.shed.get("memory", 0) + 1


class _Budgeted(grpc.GenericRpcHandler):
    """The KServe service, ``ModelInfer`` within an :class:`Inflight` budget."""

    def __init__(self, inner: grpc.GenericRpcHandler, gateway: Gateway, infer: Any,
                 inflight: Inflight) -> None:
        self.inner = inner
        retry = ((("retry-after-ms", str(round(MEMORY_RETRY * 1000))),))

        async def model_infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            n = len(raw)
            try:
                if n >= WEIGH_FROM:
                    try:
                        n = parsed_weight(raw)
                    except TooManyFields:
                        c = gateway.counters
                        c.requests += 1
                        c.invalid += 1
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"the request holds more than {MAX_ELEMENTS} "
                                            "fields: the router does not parse it")
                held = inflight.take(n)
                if held is None:
                    _shed_memory(gateway)
                    context.set_trailing_metadata(retry)
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        inflight.refusal(n))
                    raise AssertionError("unreachable")
                try:
                    return await infer(raw, context)  # type: ignore[no-any-return]
                finally:
                    inflight.give(held)
            except BaseException as exc:
                # A refused request ends in an exception whose frames hold its bytes (and
                # its parsed message) in a reference cycle, which the settled collector
                # (meshd.collector) takes its time to reach: let them go now.
                _forget(exc)
                del raw
                raise
        self.infer = grpc.unary_unary_rpc_method_handler(model_infer)

    def service(self, handler_call_details: grpc.HandlerCallDetails
                ) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method == INFER:  # type: ignore[attr-defined]
            return self.infer
        return self.inner.service(handler_call_details)  # type: ignore[no-any-return]


class _BudgetedHttp(HttpService):
    """The HTTP ingress, inference within an :class:`Inflight` budget: a request is weighed
    by its ``Content-Length`` before its body is read (by the most it may carry when that
    does not say: chunked, or compressed).  A refused request's body is never held: aiohttp
    reads it past, a chunk at a time, to keep the connection.  A body whose Content-Length
    is over the limit is refused (413) before any of it is read."""

    inflight: Inflight

    async def infer(self, request: web.Request) -> web.StreamResponse:
        n = request.content_length
        if n is not None and n > self.max_body and request.method == "POST":
            # What reading it would end in, without reading it.
            c = self.gateway.counters
            c.requests += 1
            c.invalid += 1
            return error_response(413, f"request body exceeds the router's limit of "
                                       f"{self.max_body} bytes")
        if n is None or "Content-Encoding" in request.headers:
            n = self.max_body if request.body_exists else 0
        if n >= WEIGH_FROM:
            n = http_weight(n, request.headers.get(INFER_HEADER))
        inflight = self.inflight
        held = inflight.take(n)
        if held is None:
            _shed_memory(self.gateway)
            return error_response(429, inflight.refusal(n), headers={
                "Retry-After": "1", "Retry-After-Ms": str(round(MEMORY_RETRY * 1000))})
        try:
            return await super().infer(request)
        finally:
            inflight.give(held)


def front_context(id_dir: Path, *, tokens: bool) -> ssl.SSLContext:
    """The server context of the gRPC port's TLS front: as gRPC's own TLS does it, a client
    certificate is required, or (``tokens``: clients bring bearer tokens) not asked for."""
    ctx = server_context(lambda: tls.server_context(id_dir, require_client_cert=not tokens))
    if tokens:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _counting(counters: RouterCounters) -> Callable[[str, str, str], None]:
    """Count a refused handshake in the router's counters (the agent's metrics show them in
    ``meshd_security_refusals_total``) and log it."""

    def count(channel: str, reason: str, detail: str) -> None:
        counters.refuse(channel, reason)
        log.warning("connection refused", extra={"event": "security_refused",
                                                 "channel": channel, "reason": reason,
                                                 "detail": detail})

    return count


async def serve(scoring: Scoring, clock: Callable[[], float], addr: tuple[str, int], *,
                dev: bool, identity: Callable[[], object], tokens_file: str = "",
                reuse_port: bool = False,
                verifier: PeerVerifier | None = None, shm_dir: Path | None = None,
                inflight: Inflight | None = None, tls_front: ssl.SSLContext | None = None,
                audit: AuditLog | None = None
                ) -> tuple[grpc.aio.Server, Gateway, str]:
    """The started server, the router's gateway, and the address it is bound to.
    ``reuse_port`` lets worker processes share the port (the kernel spreads connections over
    them); ``shm_dir`` holds the system shared memory regions registered with the router, for
    all of its processes (None: this process's own); ``inflight`` bounds the bytes of
    ``ModelInfer`` requests held (None: unbounded).  ``tls_front`` (a context from
    :func:`front_context`; not with ``dev``) terminates TLS in a
    :class:`~meshd.security.front.TlsFront`, which counts (channel ``router``) and audits
    (``audit``) refused handshakes; else gRPC does TLS."""
    tokens = load_tokens(Path(tokens_file)) if tokens_file else None
    peers = PeerTable() if tls_front is not None and not dev else None
    auth = ClientAuth(dev=dev, tokens=tokens, verifier=verifier)
    if peers is not None:
        auth.certificate = peers.certificate
    router = Gateway(scoring, clock)
    router.shm = Regions(router, shm_dir)
    router.auth = auth
    service = KServeService(router, auth)
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 1 if reuse_port and peers is None else 0),
        # A larger request is refused (RESOURCE_EXHAUSTED) before it is parsed: validation
        # would refuse it anyway.  (gRPC receives the whole message first: see above.)
        ("grpc.max_receive_message_length", router.max_bytes + MESSAGE_HEADROOM),
        ("grpc.max_send_message_length", MAX_MESSAGE)])
    handler = service.handler()
    if inflight is not None:
        handler = _Budgeted(handler, router, service.model_infer, inflight)
    server.add_generic_rpc_handlers((handler,))
    host, port = addr
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if peers is not None:
        assert tls_front is not None
        try:
            fronted, bound = await front_grpc(
                server, host, port, context=tls_front, peers=peers, channel="router",
                on_refused=recorder("router", _counting(router.counters), audit),
                reuse_port=reuse_port)
        except OSError as exc:
            raise OSError(f"cannot bind the router on {target} ({exc})") from None
        return fronted, router, f"{host}:{bound}"
    try:
        if dev:
            bound = server.add_insecure_port(target)
        else:
            creds = tls.grpc_server_credentials(identity, require_client_auth=tokens is None)
            bound = server.add_secure_port(target, creds)
    except RuntimeError:  # grpcio raises instead of returning 0 on a bind failure
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind the router on {target} (address in use?)")
    await server.start()
    return server, router, f"{host}:{bound}"


async def serve_http(gateway: Gateway, addr: tuple[str, int], *,
                     ssl_context: ssl.SSLContext | None, reuse_port: bool = False,
                     auth: ClientAuth | None = None, inflight: Inflight | None = None,
                     audit: AuditLog | None = None) -> tuple[web.AppRunner, str]:
    """The router's HTTP/REST ingress (Triton's KServe v2 HTTP protocol) over ``gateway`` (as
    :func:`serve` made it: its clients' authentication and shared memory regions are the gRPC
    ingress's): the started runner (``await runner.cleanup()`` stops it) and the address it is
    bound to.  TLS with ``ssl_context`` (plaintext without: ``--dev`` only); ``reuse_port``
    lets worker processes share the port; ``inflight`` bounds the bytes of inference
    requests held (the gRPC ingress's budget: one per process).  A client that disconnects
    cancels its request.  A refused TLS handshake is counted (channel ``router_http``, in
    the gateway's counters) and audited (``audit``): see :mod:`meshd.security.https`."""
    service: HttpService
    if inflight is None:
        service = HttpService(gateway, auth or gateway.auth, shm=gateway.shm)
    else:
        service = _BudgetedHttp(gateway, auth or gateway.auth, shm=gateway.shm)
        service.inflight = inflight
    runner = web.AppRunner(service.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=HTTP_GRACE)
    await runner.setup()
    host, port = addr
    site: web.BaseSite
    if ssl_context is None:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port)
    else:
        site = CountedTlsSite(runner, host, port, ssl_context=ssl_context,
                              reuse_port=reuse_port, on_refused=recorder(
                                  "router_http", _counting(gateway.counters), audit))
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, f"{host}:{bound}"
