"""A TLS front for a gRPC server: the handshake done here, so a refused one is counted.

Why: grpcio terminates TLS in its C core and reports a refused handshake (no client
certificate, a foreign CA, an expired certificate, plaintext on a TLS port) only in its own
log.  The front listens on the public address instead, performs the handshake with Python's
``ssl`` (OpenSSL, the same library and rules as gRPC's), and tells ``on_refused`` of every
connection it refuses and why (:data:`REASONS`); the agent counts that in
``meshd_security_refusals_total`` and writes an audit record.  A good connection is spliced,
bytes both ways, to the real gRPC server, which listens in plaintext on an ephemeral port of
127.0.0.1 (the inner port).

Who the caller is.  The inner server sees every connection come from 127.0.0.1, so the front
records the caller's verified certificate under the local address of its splice connection
(:class:`PeerTable`, keyed as gRPC's ``context.peer()`` names it: ``ipv4:127.0.0.1:PORT``)
before a byte of the caller's reaches the inner server, and removes it before that connection
is closed (so a port reused later is never found with a stale identity).  A handler reads
the certificate through a :data:`CertificateOf` (:meth:`PeerTable.certificate` here,
:func:`tls_certificate` where gRPC does TLS itself).  A connection to the inner port that did
not come through the front (another local process) has no entry, hence no certificate, and
is refused as unauthenticated by the same check that refuses a caller without one.

Bounds.  A handshake must finish within ``handshake_timeout`` and at most
``max_handshakes`` run at once: a new connection beyond them ends the oldest handshake still
in progress (``handshake_limit``), so a slowloris holds a bounded number of sockets for a
bounded time, and a good client, whose handshake takes a round trip or two, is not locked
out by sockets that never finish theirs.  Nothing is buffered beyond one read of either
socket plus the transports' write buffers: reading either side pauses while the other side's
write buffer is above its high-water mark.  End of stream is passed on as a half-close each
way.

The data path is two asyncio protocols and an ``ssl.SSLObject`` over memory BIOs (the same
engine asyncio's own TLS uses, without its extra protocol layer); ``bench/tls_front.py``
measures what it costs per call.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from meshd.security.audit import AuditLog

log = logging.getLogger("meshd.security")

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a client has from connecting to finishing the TLS handshake."""
MAX_HANDSHAKES = 256
"""Handshakes in progress at once; a connection beyond them ends the oldest of them."""
READ_CHUNK = 256 * 1024
"""Bytes of plaintext taken from the TLS engine per read (it yields one record at most)."""

REASONS = ("no_client_certificate", "unknown_ca", "certificate_expired",
           "certificate_not_yet_valid", "bad_certificate", "plaintext",
           "client_refused_our_certificate", "handshake_timeout", "handshake_limit",
           "client_closed", "other")
"""Why the front refused a connection (the ``reason`` of ``meshd_security_refusals_total``
for the ``admin``, ``router`` and ``router_http`` channels); a ``verify`` hook adds
:data:`certs.verify.REJECT_REASONS` (``revoked``, ``other_mesh``, ...)."""

_VERIFY_CODES = {
    10: "certificate_expired",  # X509_V_ERR_CERT_HAS_EXPIRED
    9: "certificate_not_yet_valid",  # X509_V_ERR_CERT_NOT_YET_VALID
    2: "unknown_ca",  # UNABLE_TO_GET_ISSUER_CERT
    18: "unknown_ca",  # DEPTH_ZERO_SELF_SIGNED_CERT
    19: "unknown_ca",  # SELF_SIGNED_CERT_IN_CHAIN
    20: "unknown_ca",  # UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    21: "unknown_ca",  # UNABLE_TO_VERIFY_LEAF_SIGNATURE
    7: "unknown_ca",  # CERT_SIGNATURE_FAILURE
}
_NO_CERTIFICATE = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE",
                             "TLSV13_ALERT_CERTIFICATE_REQUIRED"})
_CERTIFICATE_ALERTS = frozenset({
    "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV1_ALERT_DECRYPT_ERROR",
    "TLSV1_ALERT_ACCESS_DENIED"})
"""Alerts a client sends when it does not accept the server's certificate."""
_NOT_TLS = frozenset({"HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "WRONG_VERSION_NUMBER",
                      "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE",
                      "UNSUPPORTED_PROTOCOL"})
"""OpenSSL's words for a first record that is no TLS record (only consulted where the first
byte was not seen: :func:`classify` without ``first``)."""
_HANDSHAKE_RECORD = 0x16


def classify(exc: BaseException, first: int | None = None) -> tuple[str, str]:
    """The refusal reason (one of :data:`REASONS`) and a detail for a failed server-side
    handshake; ``first`` is the first byte the client sent, where known (a TLS connection
    starts with a handshake record, 0x16; anything else is plaintext)."""
    if first is not None and first != _HANDSHAKE_RECORD:
        return "plaintext", f"the first byte is {first:#04x}, not a TLS handshake record"
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = exc.verify_message or str(exc.reason)
        return _VERIFY_CODES.get(exc.verify_code, "bad_certificate"), message
    if isinstance(exc, ssl.SSLEOFError | ConnectionError) or (
            isinstance(exc, ssl.SSLError) and exc.reason == "UNEXPECTED_EOF_WHILE_READING"):
        return "client_closed", "the client closed the connection during the handshake"
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or exc)
        if reason in _NO_CERTIFICATE:
            return "no_client_certificate", "the client presented no certificate"
        if reason in _CERTIFICATE_ALERTS:
            return "client_refused_our_certificate", f"the client sent {reason}"
        if first is None and reason in _NOT_TLS:
            return "plaintext", f"not TLS ({reason})"
        return "other", reason
    if isinstance(exc, TimeoutError):
        return "handshake_timeout", "the handshake did not finish in time"
    return "other", f"{type(exc).__name__}: {exc}"


def peer_name(addr: Any) -> str:
    """An address as gRPC's ``context.peer()`` writes it (``ipv4:H:P``, ``ipv6:[H]:P``)."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return f"unix:{addr}" if addr else ""
    host, port = addr[0], addr[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


CertificateOf = Callable[[Any], bytes | None]
"""How a handler reads its caller's leaf certificate (PEM, None without one) from a gRPC
servicer context: :func:`tls_certificate` where gRPC terminated TLS itself,
:meth:`PeerTable.certificate` behind a :class:`TlsFront`."""


def tls_certificate(context: Any) -> bytes | None:
    """The client certificate of gRPC's own TLS handshake (``auth_context()``)."""
    pems = context.auth_context().get("x509_pem_cert") or []
    return pems[0] if pems else None  # type: ignore[no-any-return]


class PeerTable:
    """Verified client certificates by the inner server's name for the splice connection
    that carries them (``ipv4:127.0.0.1:PORT``)."""

    __slots__ = ("_pems",)

    def __init__(self) -> None:
        self._pems: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._pems)

    def add(self, peer: str, pem: bytes) -> None:
        self._pems[peer] = pem

    def remove(self, peer: str) -> None:
        self._pems.pop(peer, None)

    def certificate(self, context: Any) -> bytes | None:
        """A :data:`CertificateOf`: the certificate the front verified for the connection
        this call came on; None for one that did not come through the front."""
        try:
            return self._pems.get(context.peer())
        except Exception:  # noqa: BLE001 - a context without a peer has no identity
            return None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A connection the front refused: who (``ipv4:H:P``), why (:data:`REASONS`), details."""

    peer: str
    reason: str
    detail: str


_HANDSHAKE, _CONNECTING, _OPEN, _CLOSED = range(4)


class _Client(asyncio.Protocol):
    """The public side of one connection: the handshake, then TLS records to and from the
    inner connection (:class:`_Inner`)."""

    __slots__ = ("front", "transport", "peer", "state", "tls", "inb", "outb", "timer", "seen",
                 "inner", "key", "client_eof", "inner_eof", "held")

    def __init__(self, front: TlsFront) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.state = _HANDSHAKE
        self.inb = ssl.MemoryBIO()
        self.outb = ssl.MemoryBIO()
        self.tls: ssl.SSLObject | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.seen: int | None = None
        self.inner: asyncio.Transport | None = None
        self.key = ""
        self.client_eof = False
        self.inner_eof = False
        self.held = False
        """Reading paused because the inner connection's write buffer is full."""

    # --- the handshake ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        front = self.front
        self.peer = peer_name(transport.get_extra_info("peername"))
        front.connections.add(self)
        pending = front.pending
        if len(pending) >= front.max_handshakes:
            oldest = next(iter(pending))
            oldest._refuse("handshake_limit", f"the oldest of {len(pending)} handshakes in "
                           "progress, ended for a new connection", abort=True)
        pending[self] = None
        self.tls = front.context().wrap_bio(self.inb, self.outb, server_side=True)
        self.timer = asyncio.get_running_loop().call_later(front.handshake_timeout,
                                                            self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self.state == _OPEN:  # the data path: decrypt, pass on
            self.inb.write(data)
            self._pump()
        elif self.state == _HANDSHAKE:
            if self.seen is None:
                self.seen = data[0]
                if data[0] != _HANDSHAKE_RECORD:
                    self._refuse(*classify(ssl.SSLError(), data[0]))
                    return
            self.inb.write(data)
            self._handshake()
        elif self.state == _CONNECTING:
            self.inb.write(data)  # read before the pause took effect: decrypted once open

    def eof_received(self) -> bool:
        if self.state == _HANDSHAKE:
            self.inb.write_eof()
            if self.seen is None:
                self._refuse("client_closed", "the client closed the connection before "
                             "sending anything")
            else:
                self._handshake()
            return False
        self.inb.write_eof()
        if self.state == _OPEN:
            self._pump()
        else:
            self.client_eof = True
        return True  # half-closed: the inner server's answers may still come back

    def _handshake(self) -> None:
        tls = self.tls
        assert tls is not None
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, ConnectionError) as exc:
            self._refuse(*classify(exc, self.seen))
            return
        self._flush()
        front = self.front
        self._handshake_over()
        der = tls.getpeercert(binary_form=True)
        if front.verify is not None:
            try:
                front.verify(der)
            except Exception as exc:  # noqa: BLE001 - the verifier says why in ``reason``
                self.state = _CLOSED
                front.connections.discard(self)
                front.refused(Refusal(self.peer, str(getattr(exc, "reason", "other")),
                                      str(exc)))
                self._close_tls()
                return
        self.state = _CONNECTING
        assert self.transport is not None
        self.transport.pause_reading()
        pem = ssl.DER_cert_to_PEM_cert(der).encode() if der else b""
        task = asyncio.get_running_loop().create_task(self._connect(pem))
        front.tasks.add(task)
        task.add_done_callback(front.tasks.discard)

    def _handshake_over(self) -> None:
        self.front.pending.pop(self, None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if self.state == _HANDSHAKE:
            self._refuse("handshake_timeout", f"no TLS handshake within "
                         f"{self.front.handshake_timeout:g} s", abort=True)

    def _refuse(self, reason: str, detail: str, abort: bool = False) -> None:
        """Count and close: the alert OpenSSL wrote (which tells the client why) goes first."""
        if self.state == _CLOSED:
            return
        self.state = _CLOSED
        self._handshake_over()
        self.front.connections.discard(self)
        self.front.refused(Refusal(self.peer, reason, detail))
        transport = self.transport
        if transport is None:
            return
        if abort:
            transport.abort()
        else:
            self._flush()
            transport.close()

    async def _connect(self, pem: bytes) -> None:
        front = self.front
        try:
            inner, _ = await asyncio.get_running_loop().create_connection(
                lambda: _Inner(self), *front.inner)
        except OSError as exc:
            log.warning("TLS front: cannot reach the inner server", extra={
                "event": "tls_front_inner_failed", "channel": front.channel,
                "detail": str(exc)})
            self._teardown(abort=True)
            return
        assert isinstance(inner, asyncio.Transport)
        if self.state != _CONNECTING:  # the client went away meanwhile
            inner.abort()
            return
        self.key = peer_name(inner.get_extra_info("sockname"))
        if pem:
            front.peers.add(self.key, pem)  # before any of the client's bytes go in
        self.inner = inner
        self.state = _OPEN
        transport = self.transport
        assert transport is not None
        if self.inner_eof:  # the inner server hung up at once
            self._inner_ended()
        self._pump()
        if self.state == _OPEN and not self.held:
            transport.resume_reading()

    # --- the data path ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Decrypted bytes to the inner server; at the client's end of stream, a half-close."""
        tls, inner = self.tls, self.inner
        assert tls is not None and inner is not None
        try:
            while True:
                chunk = tls.read(READ_CHUNK)
                if not chunk:
                    break
                inner.write(chunk)
        except ssl.SSLWantReadError:
            if self.outb.pending:  # a key update, or an answer to one
                self._flush()
            return
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            pass  # close_notify, or a TCP end of stream without one: an end either way
        except ssl.SSLError as exc:
            log.info("TLS front: %s: TLS error %s", self.peer, exc.reason or exc)
            self._teardown(abort=True)
            return
        self._client_ended()

    def _client_ended(self) -> None:
        self.client_eof = True
        inner = self.inner
        if inner is None:
            return
        if self.inner_eof:
            self._teardown()
        elif inner.can_write_eof() and not inner.is_closing():
            inner.write_eof()

    def _inner_ended(self) -> None:
        """The inner server closed its side: close_notify to the client, then a half-close."""
        self.inner_eof = True
        if self.state != _OPEN:
            return
        tls, transport = self.tls, self.transport
        assert tls is not None and transport is not None
        try:
            tls.unwrap()
        except ssl.SSLError:
            pass  # SSLWantReadError: our close_notify is out, theirs is not in yet
        self._flush()
        if self.client_eof:
            self._teardown()
        elif transport.can_write_eof():
            transport.write_eof()

    def _flush(self) -> None:
        transport = self.transport
        if self.outb.pending and transport is not None and not transport.is_closing():
            transport.write(self.outb.read())

    def _close_tls(self) -> None:
        transport = self.transport
        if transport is not None:
            self._flush()
            transport.close()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_reading()

    def resume_writing(self) -> None:
        if self.inner is not None and not self.inner.is_closing():
            self.inner.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state == _HANDSHAKE:
            self._refuse("client_closed", f"the connection ended during the handshake "
                         f"({exc or 'end of stream'})")
            return
        self._teardown(abort=exc is not None or not self.client_eof)

    def _teardown(self, abort: bool = False) -> None:
        """Both sides closed, the table entry first (no later connection inherits it)."""
        if self.state == _CLOSED and self.inner is None:
            return
        self.state = _CLOSED
        self._handshake_over()
        self.front.connections.discard(self)
        if self.key:
            self.front.peers.remove(self.key)
            self.key = ""
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.abort() if abort else inner.close()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.abort() if abort else transport.close()


class _Inner(asyncio.Protocol):
    """The splice connection to the inner server: its bytes are encrypted to the client."""

    __slots__ = ("client", "transport")

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        c = self.client
        tls, out = c.tls, c.transport
        assert tls is not None and out is not None
        tls.write(data)
        out.write(c.outb.read())

    def eof_received(self) -> bool:
        self.client._inner_ended()
        return True

    def pause_writing(self) -> None:
        c = self.client
        c.held = True
        if c.transport is not None:
            c.transport.pause_reading()

    def resume_writing(self) -> None:
        c = self.client
        c.held = False
        if c.state == _OPEN and c.transport is not None and not c.transport.is_closing():
            c.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.client
        if c.inner is self.transport:
            c._teardown(abort=exc is not None)


class TlsFront:
    """The public listener of one gRPC server (see the module's docstring).

    ``context`` returns the server context for each new handshake (the agent reloads it on
    renewal); ``inner`` is the inner server's address; ``on_refused`` is told every refused
    connection; ``verify`` (optional) may refuse a handshake that TLS accepted by raising an
    exception with a ``reason`` (:class:`certs.verify.PeerRejected`)."""

    def __init__(self, context: ssl.SSLContext | Callable[[], ssl.SSLContext],
                 inner: tuple[str, int], *, on_refused: Callable[[Refusal], None],
                 peers: PeerTable | None = None, channel: str = "",
                 verify: Callable[[bytes | None], object] | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 max_handshakes: int = MAX_HANDSHAKES) -> None:
        self.context: Callable[[], ssl.SSLContext] = (
            (lambda: context) if isinstance(context, ssl.SSLContext) else context)
        self.inner = inner
        self.refused = on_refused
        self.peers = peers if peers is not None else PeerTable()
        self.channel = channel
        self.verify = verify
        self.handshake_timeout = handshake_timeout
        self.max_handshakes = max_handshakes
        self.pending: dict[_Client, None] = {}
        """Connections in their handshake, oldest first."""
        self.connections: set[_Client] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False,
                    backlog: int = 1024) -> int:
        """Listen on ``host:port`` (0: any free port); the port bound."""
        sock = listen_socket(host, port, reuse_port=reuse_port)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _Client(self), sock=sock, backlog=backlog)
        except BaseException:
            sock.close()
            raise
        return int(sock.getsockname()[1])

    def close(self) -> None:
        """Stop accepting; connections carry on (see :meth:`abort_all`)."""
        if self._server is not None:
            self._server.close()

    def abort_all(self) -> None:
        """Drop every connection still open (after the inner server has stopped)."""
        for conn in list(self.connections):
            conn._teardown(abort=True)
        for task in list(self.tasks):
            task.cancel()


def server_context(base: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """``base()`` made fit for a gRPC front: HTTP/2 by ALPN (gRPC clients insist on it) and no
    TLS 1.3 session tickets (clients keep their connections; tickets cost two encryptions
    per handshake)."""
    ctx = base()
    ctx.set_alpn_protocols(["h2"])
    ctx.num_tickets = 0
    return ctx


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket for ``host:port`` as gRPC binds one: ``::`` (or "") takes IPv4
    too (asyncio's own listeners make IPv6 sockets IPv6-only), no SO_REUSEPORT unless asked
    (else a second agent could bind the port and take half its connections)."""
    info = socket.getaddrinfo(host or "::", port, type=socket.SOCK_STREAM,
                              flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if info[0] == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY,
                            0 if host in ("", "::") else 1)
        sock.bind(info[4])
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def recorder(channel: str, count: Callable[[str, str, str], None],
             audit: AuditLog | None) -> Callable[[Refusal], None]:
    """An ``on_refused`` that counts under ``channel`` (``count(channel, reason, detail)``:
    :meth:`meshd.security.plane.Security.refuse`, or a router's counters) and audits."""

    def record(refusal: Refusal) -> None:
        count(channel, refusal.reason, f"{refusal.peer}: {refusal.detail}")
        if audit is not None:
            audit.record(method="TLS handshake", principal=None, allowed=False,
                         code="UNAUTHENTICATED", peer=refusal.peer, detail=refusal.detail,
                         channel=channel, reason=refusal.reason)

    return record


class FrontedServer(grpc.aio.Server):
    """A gRPC server on the inner port and its :class:`TlsFront`, started and stopped as one
    (what callers of ``serve`` keep, as they kept the gRPC server)."""

    def __init__(self, inner: grpc.aio.Server, front: TlsFront) -> None:
        self.inner = inner
        self.front = front

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self.inner.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self.inner.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self.inner.add_secure_port(address, server_credentials)

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self, grace: float | None) -> None:
        """New connections are refused at once; calls in flight get ``grace`` (the inner
        server's GOAWAY reaches clients through the splice); what is left is dropped."""
        self.front.close()
        await self.inner.stop(grace)
        self.front.abort_all()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return await self.inner.wait_for_termination(timeout)


async def front_grpc(server: grpc.aio.Server, host: str, port: int, *,
                     context: ssl.SSLContext | Callable[[], ssl.SSLContext],
                     on_refused: Callable[[Refusal], None], peers: PeerTable, channel: str,
                     reuse_port: bool = False,
                     verify: Callable[[bytes | None], object] | None = None
                     ) -> tuple[FrontedServer, int]:
    """Start ``server`` (handlers added, no port yet) on an inner port of 127.0.0.1 and a
    :class:`TlsFront` for it on ``host:port``: the server to keep, and the port bound.
    ``peers`` is the table its handlers read certificates from."""
    inner_port = server.add_insecure_port("127.0.0.1:0")
    if inner_port == 0:
        raise OSError("cannot bind an inner port on 127.0.0.1")
    front = TlsFront(context, ("127.0.0.1", inner_port), on_refused=on_refused, peers=peers,
                     channel=channel, verify=verify)
    await server.start()
    try:
        bound = await front.start(host, port, reuse_port=reuse_port)
    except BaseException:
        await server.stop(0)
        raise
    return FrontedServer(server, front), bound
