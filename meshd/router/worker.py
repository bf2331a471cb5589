"""A router worker process: it serves the router's ports, so that no request shares a thread
of execution with the agent's gossip, Raft and admin API.

The agent starts ``--router-workers N`` of these (default 1; see :mod:`meshd.router.pool`)
and serves no router port itself.  A request, however large, malformed or slow, can stall
only the worker that took it: the agent's event loop sees only the worker's small, bounded
score-link frames.  More than one worker binds the same ports with SO_REUSEPORT (Linux), and
the kernel spreads new client connections over them; one HTTP/2 connection stays with one
process, so a single client uses one core however many workers there are.

A worker holds no routing state of its own: it scores through the agent's score link and
score API on Unix sockets (loopback TCP where asyncio has none; see
:class:`~meshd.router.remote_scoring.RemoteScoring`), so every process routes on the
agent's one view and its admission limits hold across processes.  It presents the node's
identity from the agent's data directory and picks up a renewed certificate and new
revocations from there.  It exits when the agent does (at once on Linux: the parent's death
signal).  The request bytes it holds are bounded (``--inflight-mib``:
:class:`~meshd.router.server.Inflight`), and freed memory of large requests goes back to
the system (glibc: buffers of 1 MiB and more are mapped, not kept on the heap, and the heap
is trimmed every second).

    python -m meshd.router.worker --score unix:PATH --link PATH --router HOST:PORT \
        --data DIR --node N
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

from certs import tls
from certs.identity import Identity, IdentityError
from certs.revocation import Revocations
from certs.verify import PeerVerifier
from meshd import collector, logs, tracing
from meshd.router import server as router_server
from meshd.router.auth import TokenFileError
from meshd.router.pool import SHM_DIR
from meshd.router.remote_scoring import RemoteScoring
from meshd.router.scoring import ScoringUnavailable
from meshd.router.traces import request_tracer
from meshd.security.audit import AuditLog
from meshd.settings import (
    DEFAULT_ROUTER_INFLIGHT_MIB,
    DEFAULT_ROUTER_NICE,
    SettingsError,
    parse_hostport,
)

log = logging.getLogger("meshd.router")

REFRESH = 1.0
"""Seconds between looks at the agent (alive?), the identity files and revocations, and
between counter reports."""
GRACE = 5.0
"""Seconds in-flight requests get to finish when the worker is told to stop."""
REUSE_PORT = sys.platform.startswith("linux")
"""Bind with SO_REUSEPORT: workers share the ports (Linux balances connections over them;
elsewhere a single worker binds them alone)."""
MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc maps an allocation of its own (and unmaps it when freed), instead
of the heap keeping it: a large request's buffers go back to the system when it ends."""


def _linux_process_setup() -> Callable[[], object] | None:
    """Die with the agent (PR_SET_PDEATHSIG), and give large buffers back (M_MMAP_THRESHOLD,
    which also stops glibc raising the threshold as large blocks are freed).  Returns glibc's
    ``malloc_trim(0)``, or None (not glibc): freed memory goes back to the system only when
    it is called (gRPC's threads allocate a whole request message in small pieces, in their
    own arenas, which glibc otherwise keeps: measured, a worker that had received a few
    900 MiB messages held 1.4 GB, 35 MB once trimmed)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return lambda: trim(0)


class Files:
    """The node's identity and revocations as the agent keeps them on disk, reloaded when
    they change (a renewal, a revocation)."""

    def __init__(self, data: Path) -> None:
        self.id_dir = data / "identity"
        self.revocations_file = data / "revocations.json"
        self.identity = Identity.load(self.id_dir)
        td = self.identity.spiffe_id.trust_domain
        self.verifier = PeerVerifier(
            self.identity.bundle, td, Revocations(self.identity.bundle, td,
                                                  self.revocations_file),
            intermediates=self.identity.chain[1:], mesh=self.identity.mesh)
        self._stamps = self._stat()
        self.contexts: list[ssl.SSLContext] = []
        """TLS contexts (the HTTP ingress's) given the renewed certificate on a reload."""

    def _stat(self) -> tuple[float, ...]:
        out = []
        for path in (self.id_dir / "cert.pem", self.id_dir / "key.pem", self.revocations_file):
            try:
                out.append(path.stat().st_mtime)
            except OSError:
                out.append(0.0)
        return tuple(out)

    def refresh(self) -> None:
        stamps = self._stat()
        if stamps == self._stamps:
            return
        self._stamps = stamps
        try:
            ident = Identity.load(self.id_dir)
        except IdentityError as exc:  # files broken by hand: keep the identity we have
            log.warning("cannot reload identity", extra={"event": "identity_reload_failed",
                                                         "detail": str(exc)})
            return
        if ident.chain != self.identity.chain:
            self.identity = ident
            self.verifier.set_bundle(ident.bundle)
            for ctx in self.contexts:
                tls.reload(ctx, self.id_dir)
        td = ident.spiffe_id.trust_domain
        self.verifier.revocations.cutoffs = Revocations(ident.bundle, td,
                                                        self.revocations_file).cutoffs


async def run(args: argparse.Namespace, trim: Callable[[], object] | None = None) -> int:
    """Serve until told to stop or the agent is gone; ``trim`` gives freed memory back to
    the system (every ``REFRESH``)."""
    loop = asyncio.get_running_loop()
    files = None if args.dev else Files(Path(args.data))
    scoring = RemoteScoring(args.score, args.link)
    addr = parse_hostport(args.router, 0, "router")
    inflight = router_server.Inflight(args.inflight_mib << 20)
    audit = AuditLog(None if args.dev or args.audit_log == "off"
                     else args.audit_log or Path(args.data) / "audit.log")
    front = None
    if files is not None and args.tls_front:
        front = router_server.front_context(files.id_dir, tokens=bool(args.tokens))
        files.contexts.append(front)
    server, router, where = await router_server.serve(
        scoring, loop.time, addr, dev=args.dev,
        identity=lambda: files.identity if files is not None else None,
        tokens_file=args.tokens, reuse_port=REUSE_PORT,
        verifier=files.verifier if files is not None else None,
        shm_dir=Path(args.data) / SHM_DIR, inflight=inflight, tls_front=front, audit=audit)
    http = None
    if args.router_http:
        ctx = None
        if files is not None:  # HTTPS: a client certificate is asked for, a token will do
            ctx = tls.server_context(files.id_dir, require_client_cert=False)
            files.contexts.append(ctx)
        http, _ = await router_server.serve_http(
            router, parse_hostport(args.router_http, 0, "router_http"), ssl_context=ctx,
            reuse_port=REUSE_PORT, inflight=inflight, audit=audit)
    traces = tracing.setup("meshd", args.node)
    router.tracer = request_tracer(traces)
    life = f"{args.node}/{os.getpid()}/{int(loop.time() * 1000)}"
    collector.settle()
    log.info("router worker started", extra={"event": "router_worker_started",
                                              "router": where, "worker": life})
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not on this platform's loop
            pass
    parent = os.getppid()
    try:
        try:  # at once: the agent's metrics show this worker from its start
            await scoring.send_counters(router.counters.to_pb(life))
        except ScoringUnavailable:
            pass
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), REFRESH)
            except TimeoutError:
                pass
            if os.getppid() != parent:
                log.warning("the agent is gone; stopping", extra={"event": "agent_gone"})
                break
            if files is not None:
                files.refresh()
            if trim is not None:
                trim()
            try:
                await scoring.send_counters(router.counters.to_pb(life))
            except ScoringUnavailable as exc:
                log.warning("cannot report counters", extra={
                    "event": "router_counters_failed", "detail": str(exc)})
    finally:
        stops = [server.stop(GRACE)]
        if http is not None:
            stops.append(http.cleanup())
        await asyncio.gather(*stops)
        try:
            await scoring.send_counters(router.counters.to_pb(life))
        except ScoringUnavailable:
            pass
        await router.close()
        audit.close()
        if traces is not None:
            await loop.run_in_executor(None, traces.shutdown)
    log.info("router worker stopped", extra={"event": "router_worker_stopped"})
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m meshd.router.worker",
                                description="A router worker process (started by meshd).")
    p.add_argument("--score", required=True,
                   help="the agent's score API (unix:PATH, or a loopback HOST:PORT)")
    p.add_argument("--link", required=True,
                   help="the agent's score link (a socket path, or tcp:127.0.0.1:PORT)")
    p.add_argument("--router", required=True, help="the router address to share, HOST:PORT")
    p.add_argument("--data", required=True, help="the agent's data directory")
    p.add_argument("--node", required=True)
    p.add_argument("--router-http", default="",
                   help="the router's HTTP/REST address to share, HOST:PORT")
    p.add_argument("--tokens", default="", help="per-tenant bearer token file")
    p.add_argument("--tls-front", action="store_true",
                   help="terminate the gRPC port's TLS in meshd's TLS front")
    p.add_argument("--audit-log", default="",
                   help="the agent's audit log (default <data>/audit.log; off: none)")
    p.add_argument("--dev", action="store_true", help="plaintext port (dev mode)")
    p.add_argument("--inflight-mib", type=int, default=DEFAULT_ROUTER_INFLIGHT_MIB,
                   help="MiB of requests held in flight at most (beyond: shed)")
    p.add_argument("--nice", type=int, default=DEFAULT_ROUTER_NICE,
                   help="niceness added to this process's: under saturation the agent's "
                        f"gossip, Raft and admin API run first (default {DEFAULT_ROUTER_NICE})")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    trim = _linux_process_setup()
    logs.setup(args.node, args.log_level)
    if args.nice and hasattr(os, "nice"):  # POSIX
        os.nice(args.nice)
    try:
        return asyncio.run(run(args, trim))
    except (IdentityError, TokenFileError, SettingsError, OSError) as exc:
        log.error("router worker cannot start", extra={"event": "router_worker_failed",
                                                       "detail": str(exc)})
        return 1


if __name__ == "__main__":
    sys.exit(main())
