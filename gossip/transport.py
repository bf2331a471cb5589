"""The asyncio shell around :class:`gossip.protocol.Swim`.

It owns the sockets and the clock and nothing else: UDP datagrams in and out, TCP for push-pull,
and one timer set to ``Swim.next_timer()``.  IPv4 and IPv6 each get their own socket
(``IPV6_V6ONLY``) so the same code runs on Linux, macOS and Windows.  Push-pull streams are framed
as a 4-byte big-endian length followed by the sealed payload.

With :class:`StreamSecurity` every TCP stream is TLS: the server side upgrades each accepted
connection itself (so a failed handshake is counted, not just logged by asyncio), push-pull
needs a peer certificate the owner accepts, and streams that start with a registered 4-byte
prefix (enrollment) are handed to their handler instead.  gossip knows nothing of certificates:
the owner decides who is acceptable.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gossip.events import MemberEvent
from gossip.protocol import StreamRequest, Swim
from gossip.state import Addr

log = logging.getLogger("meshd.gossip")

_LEN = struct.Struct(">I")
UDP_BUFFER_BYTES = 2 * 1024 * 1024

EventHandler = Callable[[list[MemberEvent]], None]
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "bytes | None"],
                         Awaitable[None]]


@dataclass
class StreamSecurity:
    """TLS for push-pull streams, and who may use them.

    ``authorize(peer_cert_der, outgoing)`` is asked after every handshake, on both sides; it
    returns False (after counting and logging) to drop the stream before a byte of it reaches
    the protocol core.  ``handlers`` maps a 4-byte stream prefix (>= 0xff000000, which no frame
    length can be) to a handler for other kinds of stream on the same port; a handler may be
    reached without a peer certificate.  Contexts can be reloaded in place on renewal.
    """

    server: ssl.SSLContext
    client: ssl.SSLContext
    authorize: Callable[[bytes | None, bool], bool]
    handlers: dict[bytes, StreamHandler] = field(default_factory=dict)
    handshake_timeout: float = 5.0
    on_handshake_failed: Callable[[str], None] | None = None


def peer_cert(writer: asyncio.StreamWriter) -> bytes | None:
    """The DER certificate the TLS peer presented, if any."""
    obj = writer.get_extra_info("ssl_object")
    return obj.getpeercert(binary_form=True) if obj is not None else None
RttHandler = Callable[[list[float]], None]


def family_of(host: str) -> socket.AddressFamily:
    """The address family of an IP literal (names resolve to IPv4 first)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, owner: GossipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple) -> None:  # type: ignore[type-arg]
        self.owner._on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: the probe timeout handles the peer.
        self.owner.send_errors += 1


class GossipTransport:
    """Binds the gossip sockets, then drives a ``Swim`` core from the event loop."""

    def __init__(self, binds: list[Addr], *, tcp_timeout: float = 10.0,
                 max_stream_bytes: int = 32 * 1024 * 1024,
                 on_events: EventHandler | None = None, on_rtts: RttHandler | None = None,
                 required: bool = True, security: StreamSecurity | None = None) -> None:
        self.binds = binds
        self.security = security
        self.tcp_timeout = tcp_timeout
        self.max_stream_bytes = max_stream_bytes
        self.on_events = on_events
        self.on_rtts = on_rtts
        self.required = required
        self.port = 0
        self.swim: Swim | None = None
        self.send_errors = 0
        self._udp: dict[socket.AddressFamily, asyncio.DatagramTransport] = {}
        self._servers: list[asyncio.base_events.Server] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._join_waiters: list[tuple[StreamRequest, asyncio.Future[bool]]] = []
        self.send_delay: Callable[[Addr], float] | None = None
        """Test-only: seconds to hold each datagram to a peer before sending it, to give
        loopback tests WAN-like RTTs (these machines have no netem).  None in production."""

    # --- lifecycle -------------------------------------------------------------------------

    async def bind(self) -> int:
        """Open UDP and TCP sockets on every bind address; returns the (shared) port.

        With port 0 the first socket picks a free port and the rest reuse it.  A bind address
        that fails is an error unless other addresses bound and ``required`` is False (used for
        the default dual-stack bind on hosts without IPv6).
        """
        self._loop = asyncio.get_running_loop()
        errors: list[str] = []
        for host, port in self.binds:
            port = self.port or port
            try:
                await self._bind_one(host, port)
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc.strerror or exc}")
        if not self._udp or (errors and self.required):
            await self.close()
            raise OSError(f"cannot bind gossip sockets: {'; '.join(errors)}")
        for err in errors:
            log.warning("gossip bind skipped", extra={"event": "bind_skipped", "detail": err})
        return self.port

    async def _bind_one(self, host: str, port: int) -> None:
        assert self._loop is not None
        fam = family_of(host)
        udp = socket.socket(fam, socket.SOCK_DGRAM)
        tcp = socket.socket(fam, socket.SOCK_STREAM)
        try:
            for s in (udp, tcp):
                if fam == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if sys.platform != "win32":
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    udp.setsockopt(socket.SOL_SOCKET, opt, UDP_BUFFER_BYTES)
            udp.bind((host, port))
            port = udp.getsockname()[1]
            tcp.bind((host, port))
            tcp.listen(128)
            tcp.setblocking(False)
        except OSError:
            udp.close()
            tcp.close()
            raise
        transport, _ = await self._loop.create_datagram_endpoint(lambda: _Datagrams(self),
                                                                 sock=udp)
        self._udp[fam] = transport  # type: ignore[assignment]
        self._servers.append(await asyncio.start_server(self._serve_stream, sock=tcp))
        self.port = port

    def attach(self, swim: Swim) -> None:
        """Start driving ``swim`` (after :meth:`bind`)."""
        self.swim = swim
        self._after()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        for server in self._servers:
            server.close()
        for udp in self._udp.values():
            udp.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        self._udp.clear()

    # --- commands --------------------------------------------------------------------------

    async def join(self, seeds: list[Addr]) -> int:
        """Push-pull with each seed; returns how many answered."""
        assert self.swim is not None and self._loop is not None
        self.swim.join(seeds)
        waiters: list[asyncio.Future[bool]] = []
        for req in self.swim.streams_to_open():
            fut: asyncio.Future[bool] = self._loop.create_future()
            waiters.append(fut)
            self._spawn(self._open_stream(req, fut))
        results = await asyncio.gather(*waiters)
        return sum(results)

    async def leave(self) -> None:
        """Announce a graceful leave and keep gossiping until it has propagated."""
        assert self.swim is not None
        self.swim.leave(self.now())
        self._after()
        await asyncio.sleep(self.swim.config.leave_propagate_delay)

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def poke(self) -> None:
        """Flush outputs after the owner changed the core directly (meta, state)."""
        self._after()

    # --- inputs ----------------------------------------------------------------------------

    def _on_datagram(self, data: bytes, addr: Addr) -> None:
        if self.swim is None:
            return
        self.swim.receive(data, addr, self.now())
        self._after()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self.swim is not None:
            self.swim.tick(self.now())
            self._after()

    async def _upgrade(self, writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> bool:
        """TLS on an open stream (the side follows from how it was opened); False (counted)
        when the handshake fails."""
        assert self.security is not None
        try:
            await writer.start_tls(ctx, ssl_handshake_timeout=self.security.handshake_timeout)
            return True
        except (ssl.SSLError, OSError, TimeoutError, ConnectionError) as exc:
            if self.security.on_handshake_failed is not None:
                self.security.on_handshake_failed(
                    getattr(exc, "reason", None) or type(exc).__name__)
            return False

    async def _serve_stream(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        sec = self.security
        try:
            if sec is not None:
                if not await self._upgrade(writer, sec.server):
                    return
                head = await asyncio.wait_for(reader.readexactly(_LEN.size), self.tcp_timeout)
                cert = peer_cert(writer)
                handler = sec.handlers.get(head)
                if handler is not None:
                    await handler(reader, writer, cert)
                    return
                if not sec.authorize(cert, False):
                    if self.swim is not None:
                        self.swim.stats.drop("unauthenticated", stream=True)
                    return
                data = await asyncio.wait_for(self._read_body(reader, head), self.tcp_timeout)
            else:
                data = await asyncio.wait_for(self._read_frame(reader), self.tcp_timeout)
            if data is None or self.swim is None:
                return
            reply = self.swim.handle_stream(data, (peer[0], peer[1]), self.now())
            self._after()
            if reply is not None:
                writer.write(_LEN.pack(len(reply)) + reply)
                await asyncio.wait_for(writer.drain(), self.tcp_timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            if self.swim is not None:
                self.swim.stats.drop("truncated", stream=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_frame(self, reader: asyncio.StreamReader) -> bytes | None:
        return await self._read_body(reader, await reader.readexactly(_LEN.size))

    async def _read_body(self, reader: asyncio.StreamReader, head: bytes) -> bytes | None:
        (length,) = _LEN.unpack(head)
        if length > self.max_stream_bytes:
            if self.swim is not None:
                self.swim.stats.drop("oversized", stream=True)
            return None
        return await reader.readexactly(length)

    async def _open_stream(self, req: StreamRequest,
                           done: asyncio.Future[bool] | None = None) -> None:
        assert self.swim is not None
        ok = False
        writer = None
        try:
            async with asyncio.timeout(self.tcp_timeout):
                reader, writer = await asyncio.open_connection(req.addr[0], req.addr[1])
                sec = self.security
                if sec is not None:
                    if not await self._upgrade(writer, sec.client):
                        raise ConnectionError("TLS handshake failed")
                    if not sec.authorize(peer_cert(writer), True):
                        self.swim.stats.drop("unauthenticated", stream=True)
                        raise ConnectionError("peer certificate refused")
                writer.write(_LEN.pack(len(req.payload)) + req.payload)
                await writer.drain()
                data = await self._read_frame(reader)
            if data is not None:
                ok = self.swim.stream_reply(data, req, self.now())
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("push-pull failed", extra={"event": "push_pull_failed",
                                                 "peer": f"{req.addr[0]}:{req.addr[1]}",
                                                 "detail": repr(exc)})
        finally:
            if writer is not None:
                writer.close()
        if not ok:
            self.swim.stream_failed(req, self.now())
        self._after()
        if done is not None and not done.done():
            done.set_result(ok)

    # --- outputs ---------------------------------------------------------------------------

    def _after(self) -> None:
        swim = self.swim
        if swim is None or self._loop is None:
            return
        delay_of = self.send_delay
        for data, addr in swim.datagrams_to_send():
            delay = delay_of(addr) if delay_of is not None else 0.0
            if delay > 0:
                self._loop.call_later(delay, self._sendto, data, addr)
            else:
                self._sendto(data, addr)
        for req in swim.streams_to_open():
            self._spawn(self._open_stream(req))
        if self.on_events is not None:
            events = swim.events()
            if events:
                self.on_events(events)
        if self.on_rtts is not None and swim.stats.probe_rtts:
            rtts = list(swim.stats.probe_rtts)
            swim.stats.probe_rtts.clear()
            self.on_rtts(rtts)
        when = swim.next_timer()
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = self._loop.call_at(when, self._on_timer)

    def _sendto(self, data: bytes, addr: Addr) -> None:
        udp = self._udp.get(family_of(addr[0]))
        if udp is None or udp.is_closing():
            self.send_errors += 1
            return
        try:
            udp.sendto(data, addr)
        except OSError:
            self.send_errors += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
