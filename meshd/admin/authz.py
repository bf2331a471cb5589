"""Authentication and RBAC for the admin gRPC API, applied to every method in one place.

gRPC interceptors never see the peer certificate, but the handler they return does: the
interceptor wraps each unary handler so that, inside the call, the caller's certificate is read
(:attr:`Authorizer.certificate`: from the table of the TLS front that terminates the admin
port's TLS, :mod:`meshd.security.front`, or from ``context.auth_context()`` where gRPC does
TLS itself), checked by the mesh verifier (trust domain, revocation), an
optional ``authorization: Bearer <JWT>`` names a person instead, the policy decides, and the
decision is written to the audit log.  Handlers read the caller from :data:`CALLER`.

A write that a node forwards to a coordinator (``Consensus.Propose``) carries the credential
its caller presented (:data:`CREDENTIAL` on the entry node); the coordinator checks that caller
again with :meth:`Authorizer.forwarded`, with the same verifier, JWT keys, policy and audit
log (:data:`AUTHORIZER`), so a node certificate alone cannot write what only people may.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc

from certs.verify import PeerRejected, PeerVerifier
from meshd.admin.rbac import AuditLog, AuthError, JwtVerifier, Policy, Principal
from meshd.control.plane import Credential
from meshd.security.front import CertificateOf, tls_certificate

CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("caller", default=None)
CREDENTIAL: contextvars.ContextVar[Credential | None] = contextvars.ContextVar(
    "credential", default=None)
"""What the current caller presented (certificate, bearer token) and for which method: a write
forwarded to a coordinator carries it, so the coordinator can verify the caller itself."""
AUTHORIZER: contextvars.ContextVar[Authorizer | None] = contextvars.ContextVar(
    "authorizer", default=None)
"""The authorizer that admitted the current call, for handlers that must judge a second
principal the same way (the original caller of a forwarded write)."""

FORWARDED = "forwarded"
"""The refusal channel of forwarded writes whose original caller the coordinator refused."""


class Authorizer:
    """Who is calling and may they: shared by the interceptor and the tests."""

    def __init__(self, verifier: PeerVerifier, policy: Policy, *, jwt: JwtVerifier | None,
                 audit: AuditLog, refuse: Callable[[str, str, str], None],
                 certificate: CertificateOf = tls_certificate) -> None:
        self.verifier = verifier
        self.policy = policy
        self.jwt = jwt
        self.audit = audit
        self.refuse = refuse
        """(channel, reason, detail): counts and logs a refusal."""
        self.certificate = certificate
        """The caller's leaf certificate (PEM) from a servicer context: where the port's TLS
        was terminated (by gRPC, or by the TLS front) decides how it is read."""

    def authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller, or raises (UNAUTHENTICATED, message) as a ``Refused``."""
        return self.identify(self.certificate(context), _bearer(context))

    def identify(self, certificate_pem: bytes | None, bearer: str | None,
                 channel: str = "admin") -> Principal:
        """Who a client certificate (PEM) and optional bearer token name; refusals are counted
        under ``channel`` and raised as (UNAUTHENTICATED, message) ``Refused``."""
        try:
            peer = self.verifier.verify_pem(certificate_pem)
        except PeerRejected as exc:
            self.refuse(channel, exc.reason, str(exc))
            raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                          f"client certificate refused: {exc}") from None
        if bearer is None:
            return Principal(peer.spiffe_id.kind, peer.spiffe_id.name, peer.roles,
                             spiffe_id=str(peer.spiffe_id))
        if self.jwt is None:
            self.refuse(channel, "jwt_not_configured", "bearer token sent; none configured")
            raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                          "bearer tokens are not accepted by this node (no --jwt-jwks or "
                          "--jwt-key configured)")
        try:
            return self.jwt.verify(bearer)
        except AuthError as exc:
            self.refuse(channel, f"jwt_{exc.reason}", str(exc))
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"bearer token refused: {exc}"
                          ) from None

    def forwarded(self, credential: Credential, *, claimed: str, via: str, peer: str,
                  misfit: str = "") -> Principal:
        """The original caller of a write node ``via`` forwarded, checked here as if they had
        called this node: their certificate (chain, trust domain, revocation) or bearer token,
        then this node's policy for ``credential.method``; ``misfit`` says why the command is
        not what that method writes ("" when it is).

        Every refusal is counted (channel :data:`FORWARDED`), audited under the original
        method and caller, and raised as :class:`Refused` (PERMISSION_DENIED naming both):
        the entry node's client is told who was refused what, not that a node was.
        """
        method = credential.method or "Propose"
        try:
            principal = self.identify(credential.certificate_pem or None,
                                      credential.bearer or None, FORWARDED)
        except Refused as exc:
            raise self.refuse_forwarded(
                method, None, peer, f"{method} (forwarded by {via}) on behalf of "
                f"{claimed or '?'}: the caller's credential is refused here: {exc}") from None
        if claimed and claimed != principal.label:
            raise self.refuse_forwarded(
                method, principal, peer, f"{method} (forwarded by {via}): it names "
                f"{claimed} as the caller but carries the credential of {principal.label}",
                "forged_caller")
        if not self.policy.allows(principal, method):
            need = ", ".join(self.policy.roles_for(method)) or "none"
            raise self.refuse_forwarded(
                method, principal, peer, f"{method} (forwarded by {via}): permission denied "
                f"for {principal.label} (roles: {', '.join(sorted(principal.roles)) or 'none'}"
                f"; requires one of: {need})", "permission_denied")
        if misfit:
            raise self.refuse_forwarded(
                method, principal, peer, f"{method} (forwarded by {via}) for "
                f"{principal.label}: {misfit}", "wrong_method")
        self.audit.record(method=method, principal=principal, allowed=True, code="OK",
                          peer=peer, detail=f"forwarded by {via}")
        return principal

    def refuse_forwarded(self, method: str, principal: Principal | None, peer: str,
                         message: str, reason: str = "") -> Refused:
        """Count (when ``reason`` is given: a credential refused by :meth:`identify` is counted
        already) and audit a refused forwarded write; the error to raise."""
        if reason:
            self.refuse(FORWARDED, reason, message)
        self.audit.record(method=method, principal=principal, allowed=False,
                          code="PERMISSION_DENIED", peer=peer, detail=message)
        return Refused(grpc.StatusCode.PERMISSION_DENIED, message)


class Refused(Exception):
    """A call (or a forwarded write) refused: the gRPC code and message to abort with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _bearer(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _peer(context: grpc.aio.ServicerContext) -> str:
    try:
        return str(context.peer())
    except Exception:  # noqa: BLE001 - best effort, for the audit log only
        return ""


class AuthzInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, authorizer: Authorizer) -> None:
        self.authz = authorizer

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]  # type: ignore[attr-defined]
        authz = self.authz
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
                principal, peer = await _admit(authz, method, context)
                with _acting(authz, method, principal, peer, context):
                    return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def guarded_stream(request: Any, context: grpc.aio.ServicerContext
                                     ) -> AsyncIterator[Any]:
                principal, peer = await _admit(authz, method, context)
                with _acting(authz, method, principal, peer, context):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                guarded_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            inner_client_stream = handler.stream_unary

            async def guarded_client_stream(requests: AsyncIterator[Any],
                                            context: grpc.aio.ServicerContext) -> Any:
                principal, peer = await _admit(authz, method, context)
                with _acting(authz, method, principal, peer, context):
                    return await inner_client_stream(requests, context)

            return grpc.stream_unary_rpc_method_handler(
                guarded_client_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        # Bidirectional streaming methods are refused until one needs the same guard.
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{method}: streaming requests are not served")

        return grpc.unary_unary_rpc_method_handler(refuse)


@contextlib.contextmanager
def _acting(authz: Authorizer, method: str, principal: Principal, peer: str,
            context: grpc.aio.ServicerContext) -> Iterator[None]:
    """Run an admitted call as ``principal`` (:data:`CALLER`, with what it presented in
    :data:`CREDENTIAL` and this authorizer in :data:`AUTHORIZER`) and audit how it ended."""
    token = CALLER.set(principal)
    presented = CREDENTIAL.set(Credential(method, authz.certificate(context) or b"",
                                          _bearer(context) or ""))
    judge = AUTHORIZER.set(authz)
    code = "OK"
    try:
        yield
    except BaseException:
        code = _code_of(context)
        raise
    finally:
        AUTHORIZER.reset(judge)
        CREDENTIAL.reset(presented)
        CALLER.reset(token)
        authz.audit.record(method=method, principal=principal, allowed=True, code=code,
                           peer=peer)


def _code_of(context: grpc.aio.ServicerContext) -> str:
    got = context.code()
    return got.name if isinstance(got, grpc.StatusCode) else "UNKNOWN"


async def _admit(authz: Authorizer, method: str, context: grpc.aio.ServicerContext
                 ) -> tuple[Principal, str]:
    """Authenticate and authorize the caller of ``method`` or abort the call."""
    peer = _peer(context)
    try:
        principal = authz.authenticate(context)
    except Refused as exc:
        authz.audit.record(method=method, principal=None, allowed=False,
                           code=exc.code.name, peer=peer, detail=str(exc))
        await context.abort(exc.code, str(exc))
        raise AssertionError("unreachable") from None
    if not authz.policy.allows(principal, method):
        need = ", ".join(authz.policy.roles_for(method)) or "none"
        msg = (f"{method}: permission denied for {principal.label} (roles: "
               f"{', '.join(sorted(principal.roles)) or 'none'}; requires one of: {need})")
        authz.refuse("admin", "permission_denied", msg)
        authz.audit.record(method=method, principal=principal, allowed=False,
                           code="PERMISSION_DENIED", peer=peer, detail=msg)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, msg)
    return principal, peer
