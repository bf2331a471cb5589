"""Who is calling the router, and for which tenant.

Outside ``--dev`` the ingress is TLS, and a client proves itself one of two ways:

- without a token file: a mesh client certificate (mTLS), a node or operator identity, trusted
  to name the tenant it acts for in the ``x-meshd-tenant`` header;
- with a token file: a per-tenant bearer token (``authorization: Bearer <token>``) over
  server-authenticated TLS; the token decides the tenant and the header cannot override it.
  (gRPC's Python server can require client certificates or not ask for them, but not ask
  and accept either, so the file switches the ingress from one way to the other.)

The token file holds ``tenant sha256-hex-of-token`` lines (``#`` comments), never tokens, so
reading it (or a backup of it) does not let anyone in.  In ``--dev`` the port is plaintext and
the tenant comes from the header.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc

from certs.verify import PeerRejected, PeerVerifier
from meshd.security.front import CertificateOf, tls_certificate

TENANT_HEADER = "x-meshd-tenant"
SLO_HEADER = "x-meshd-slo"
MAX_TENANT = 128


class Unauthenticated(Exception):
    pass


class TokenFileError(ValueError):
    pass


def load_tokens(path: Path) -> dict[str, str]:
    """``sha256 hex -> tenant`` from a token file (TokenFileError names the bad line)."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if (len(parts) != 2 or len(parts[1]) != 64
                or any(c not in "0123456789abcdef" for c in parts[1].lower())):
            raise TokenFileError(f"{path}:{n}: expected 'TENANT SHA256-HEX'")
        if not 0 < len(parts[0]) <= MAX_TENANT or not parts[0].isprintable():
            raise TokenFileError(f"{path}:{n}: tenant must be 1-{MAX_TENANT} printable "
                                 "characters")
        out[parts[1].lower()] = parts[0]
    return out


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` value; "" for anything else (the
    caller then presents no token: its certificate, if any, speaks for it)."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ClientAuth:
    """``verifier`` checks a client certificate beyond the handshake (trust domain,
    revocation); without one, a certificate the handshake accepted is enough.
    ``certificate`` reads a gRPC call's client certificate: from gRPC's own TLS (the
    default), or from the table of the port's TLS front."""

    def __init__(self, *, dev: bool, tokens: dict[str, str] | None = None,
                 verifier: PeerVerifier | None = None,
                 certificate: CertificateOf = tls_certificate) -> None:
        self.dev = dev
        self.tokens = tokens or {}
        self.verifier = verifier
        self.certificate = certificate

    def tenant(self, metadata: dict[str, str], context: grpc.aio.ServicerContext,
               certificate: CertificateOf | None = None) -> str:
        """The caller's tenant, or Unauthenticated (the message says what is missing);
        ``certificate`` overrides how the client certificate is read (the HTTP ingress's
        comes from its own TLS connection)."""
        auth = metadata.get("authorization")
        if auth is not None:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise Unauthenticated("authorization must be 'Bearer <token>'")
            # Looked up by its SHA-256: a lookup's timing tells nothing about the token.
            tenant = self.tokens.get(token_hash(token.strip()))
            if tenant is None:
                raise Unauthenticated("unknown bearer token")
            return tenant
        header = metadata.get(TENANT_HEADER, "")
        if len(header) > MAX_TENANT or not header.isprintable():
            raise Unauthenticated(f"{TENANT_HEADER} must be at most {MAX_TENANT} printable "
                                  "characters")
        if self.dev:
            return header
        pem = (certificate or self.certificate)(context)
        if not pem:
            raise Unauthenticated(
                "present a bearer token (this router takes tokens and asks for no client "
                "certificate)" if self.tokens else "present a mesh client certificate")
        if self.verifier is not None:
            try:
                self.verifier.verify_pem(pem)
            except PeerRejected as exc:
                raise Unauthenticated(f"client certificate refused: {exc}") from None
        return header
