"""An aiohttp site whose TLS handshakes are counted: the router's HTTPS port.

Why: asyncio's TLS (``create_server(ssl=...)``) logs a failed handshake only in debug mode,
so a client refused for its certificate, or plaintext on the HTTPS port, left no trace.
:class:`CountedTlsSite` accepts each TCP connection with a protocol of its own, runs the
handshake with ``loop.start_tls`` (the same TLS engine, no extra hop: after the handshake
aiohttp's request handler owns the TLS transport, so ``ssl_object`` and the client
certificate read in :mod:`meshd.router.http` are as before), and tells ``on_refused`` of
every failure, classified as the gRPC ports' fronts do (:func:`meshd.security.front.classify`).
Handshakes are bounded in time (``handshake_timeout``) and number (``max_handshakes``: a new
connection beyond them ends the oldest handshake), as there.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from aiohttp import web

from meshd.security.front import (
    HANDSHAKE_TIMEOUT,
    MAX_HANDSHAKES,
    Refusal,
    classify,
    listen_socket,
    peer_name,
)


class _Early(asyncio.Protocol):
    """Holds what arrives between the end of the handshake and aiohttp taking over (a TLS
    1.3 client sends its request right behind its Finished): one read, at most."""

    __slots__ = ("data", "eof", "lost")

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)

    def hand_over(self, handler: asyncio.Protocol) -> None:
        for chunk in self.data:
            handler.data_received(chunk)
        self.data.clear()
        if self.eof:
            handler.eof_received()
        if self.lost is not None:
            handler.connection_lost(self.lost[0])


class _Accept(asyncio.Protocol):
    """One accepted connection until its handshake is over."""

    __slots__ = ("site",)

    def __init__(self, site: CountedTlsSite) -> None:
        self.site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # not a byte to this protocol: start_tls reads them
        site = self.site
        peer = peer_name(transport.get_extra_info("peername"))
        pending = site.pending
        if len(pending) >= site.max_handshakes:
            oldest = next(iter(pending))
            old_peer = pending.pop(oldest)
            oldest.cancel()
            site.refused(Refusal(old_peer, "handshake_limit", f"the oldest of {len(pending) + 1} "
                                 "handshakes in progress, ended for a new connection"))
        task = asyncio.get_running_loop().create_task(site.handshake(transport, peer))
        pending[task] = peer
        site.tasks.add(task)
        task.add_done_callback(site.tasks.discard)


class CountedTlsSite(web.BaseSite):
    """Like aiohttp's ``TCPSite`` with an ``ssl_context``, with every refused handshake told
    to ``on_refused``."""

    __slots__ = ("_host", "_port", "_reuse_port", "refused", "handshake_timeout",
                 "max_handshakes", "pending", "tasks", "_bound_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 ssl_context: ssl.SSLContext, on_refused: Callable[[Refusal], None],
                 reuse_port: bool = False, backlog: int = 1024,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 max_handshakes: int = MAX_HANDSHAKES) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self._bound_port = port
        self.refused = on_refused
        self.handshake_timeout = handshake_timeout
        self.max_handshakes = max_handshakes
        self.pending: dict[asyncio.Task[None], str] = {}
        """Handshakes in progress (and their clients), oldest first."""
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._bound_port}"

    @property
    def port(self) -> int:
        return self._bound_port

    async def start(self) -> None:
        await super().start()
        sock = listen_socket(self._host, self._port, reuse_port=self._reuse_port)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _Accept(self), sock=sock, backlog=self._backlog)
        except BaseException:
            sock.close()
            raise
        self._bound_port = sock.getsockname()[1]

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await super().stop()

    async def handshake(self, transport: asyncio.Transport, peer: str) -> None:
        loop = asyncio.get_running_loop()
        early = _Early()
        assert self._ssl_context is not None
        task = asyncio.current_task()
        try:
            try:
                tls = await loop.start_tls(transport, early, self._ssl_context,
                                           server_side=True,
                                           ssl_handshake_timeout=self.handshake_timeout)
            finally:
                self.pending.pop(task, None)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            transport.abort()
            raise
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            if isinstance(exc, ConnectionAbortedError) and "longer than" in str(exc):
                reason, detail = "handshake_timeout", (
                    f"no TLS handshake within {self.handshake_timeout:g} s")
            else:
                reason, detail = classify(exc)
            self.refused(Refusal(peer, reason, detail))
            transport.abort()
            return
        if tls is None:  # the connection closed under it
            self.refused(Refusal(peer, "client_closed", "the connection closed"))
            return
        server = self._runner.server
        assert server is not None
        handler = server()
        handler.connection_made(tls)
        tls.set_protocol(handler)
        early.hand_over(handler)
