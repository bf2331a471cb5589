"""TLS settings for every channel, from one identity directory.

The TLS libraries verify the chain to the mesh roots; who the peer is (SPIFFE ID, roles,
revocation) is then read from its certificate by :class:`certs.verify.PeerVerifier`.  Hostname
checks are off for the stdlib contexts for that reason: peers are dialled by address, and the
identity check that matters happens in code, the same way for every transport.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from certs.identity import BUNDLE_FILE, CERT_FILE, KEY_FILE, Identity
from certs.spiffe import any_node_dns


def server_context(directory: Path, *, require_client_cert: bool = True) -> ssl.SSLContext:
    """A server context from ``directory``'s identity files.

    ``require_client_cert=False`` asks for a certificate but accepts a connection without one:
    the enrollment exchange is the only thing such a connection may do.  A certificate that is
    presented must still chain to the mesh roots or the handshake fails.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(directory / CERT_FILE, directory / KEY_FILE)
    ctx.load_verify_locations(cafile=str(directory / BUNDLE_FILE))
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(directory: Path | None, *, bundle_pem: bytes | None = None) -> ssl.SSLContext:
    """A client context presenting ``directory``'s identity (None: no client certificate, as
    an enrolling node) and trusting its bundle or ``bundle_pem``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    if directory is not None:
        ctx.load_cert_chain(directory / CERT_FILE, directory / KEY_FILE)
        ctx.load_verify_locations(cafile=str(directory / BUNDLE_FILE))
    if bundle_pem is not None:
        ctx.load_verify_locations(cadata=bundle_pem.decode("ascii"))
    return ctx


def unverified_client_context() -> ssl.SSLContext:
    """For the first contact of an enrolling node, which has no roots yet: it checks the
    server's chain against the fingerprint in its join token itself before sending anything."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def reload(ctx: ssl.SSLContext, directory: Path) -> None:
    """Swap in a renewed certificate: new handshakes use it, open connections keep going."""
    ctx.load_cert_chain(directory / CERT_FILE, directory / KEY_FILE)


def grpc_server_credentials(current: object,
                            require_client_auth: bool = True) -> grpc.ServerCredentials:
    """mTLS for a gRPC server whose identity can be renewed without a restart.

    ``current`` is a zero-argument callable returning the :class:`Identity` to present; gRPC
    asks on each new handshake, so a renewal takes effect for new connections while existing
    ones carry on.  ``require_client_auth=False`` (the router with bearer tokens) does not
    ask for a client certificate at all (grpcio has no ask-but-accept-either mode), so the
    server's clients authenticate otherwise.
    """
    state: dict[str, object] = {}

    def config() -> grpc.ServerCertificateConfiguration:
        ident: Identity = current()  # type: ignore[operator]
        state["ident"] = ident
        return grpc.ssl_server_certificate_configuration(
            [(ident.key_pem(), ident.chain_pem())], root_certificates=ident.bundle_pem())

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        ident = current()  # type: ignore[operator]
        if ident is state.get("ident"):
            return None
        return config()

    return grpc.dynamic_ssl_server_credentials(
        config(), fetch, require_client_authentication=require_client_auth)


def grpc_channel(target: str, ident: Identity, *, server_name: str = "",
                 options: list[tuple[str, object]] | None = None,
                 aio: bool = False) -> grpc.Channel:
    """An mTLS channel presenting ``ident``; the server must hold a mesh node certificate for
    ``server_name`` (default: any node of the trust domain)."""
    creds = grpc.ssl_channel_credentials(root_certificates=ident.bundle_pem(),
                                         private_key=ident.key_pem(),
                                         certificate_chain=ident.chain_pem())
    name = server_name or any_node_dns(ident.spiffe_id.trust_domain)
    opts = [("grpc.ssl_target_name_override", name), *(options or [])]
    if aio:
        return grpc.aio.secure_channel(target, creds, options=opts)  # type: ignore[return-value]
    return grpc.secure_channel(target, creds, options=opts)
