"""Start the router's KServe v2 gRPC ingress (``meshd --role router``).

Plaintext only in ``--dev``.  Otherwise TLS with the node's identity; clients present a mesh
client certificate or, when a token file is configured, a per-tenant bearer token instead
(the handshake then asks for no certificate: see ``auth``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
from aiohttp import web

from certs import tls
from certs.verify import PeerVerifier
from meshd.router.auth import ClientAuth, load_tokens
from meshd.router.gateway import MESSAGE_HEADROOM, Gateway
from meshd.router.http import HttpService
from meshd.router.kserve import KServeService
from meshd.router.scoring import Scoring
from meshd.router.shm import Regions
from meshd.router.upstream import MAX_MESSAGE

HTTP_GRACE = 5.0
"""Seconds the HTTP ingress gives requests in flight when it stops."""
SHM_DIR = "router-shm"
"""The folder of the data directory holding the router's shared memory registrations."""


async def serve(scoring: Scoring, clock: Callable[[], float], addr: tuple[str, int], *,
                dev: bool, identity: Callable[[], object], tokens_file: str = "",
                reuse_port: bool = False,
                verifier: PeerVerifier | None = None, shm_dir: Path | None = None
                ) -> tuple[grpc.aio.Server, Gateway, str]:
    """The started server, the router's gateway, and the address it is bound to.
    ``reuse_port`` lets worker processes share the port (the kernel spreads connections over
    them); ``shm_dir`` holds the system shared memory regions registered with the router, for
    all of its processes (None: this process's own)."""
    tokens = load_tokens(Path(tokens_file)) if tokens_file else None
    auth = ClientAuth(dev=dev, tokens=tokens, verifier=verifier)
    router = Gateway(scoring, clock)
    router.shm = Regions(router, shm_dir)
    router.auth = auth
    service = KServeService(router, auth)
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        # A larger request is refused (RESOURCE_EXHAUSTED) as its length prefix arrives,
        # before it is buffered or parsed: validation would refuse it anyway.
        ("grpc.max_receive_message_length", router.max_bytes + MESSAGE_HEADROOM),
        ("grpc.max_send_message_length", MAX_MESSAGE)])
    server.add_generic_rpc_handlers((service.handler(),))
    host, port = addr
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
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
                     auth: ClientAuth | None = None) -> tuple[web.AppRunner, str]:
    """The router's HTTP/REST ingress (Triton's KServe v2 HTTP protocol) over ``gateway`` (as
    :func:`serve` made it: its clients' authentication and shared memory regions are the gRPC
    ingress's): the started runner (``await runner.cleanup()`` stops it) and the address it is
    bound to.  TLS with ``ssl_context`` (plaintext without: ``--dev`` only); ``reuse_port``
    lets worker processes share the port.  A client that disconnects cancels its request."""
    service = HttpService(gateway, auth or gateway.auth, shm=gateway.shm)
    runner = web.AppRunner(service.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=HTTP_GRACE)
    await runner.setup()
    host, port = addr
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, f"{host}:{bound}"
