"""Enrollment and renewal: the messages, and what a CA holder does with them.

Carried over TLS on the gossip TCP port (the only address a new node knows is its seed's)::

    joining node                                   seed / CA holder
      HELLO                                  ->
                                             <-    chain + bundle (+ CA holders, if not one)
      (checks: the root's fingerprint is the one in its token, the TLS peer is that chain's leaf)
      ENROLL {token, CSR}                    ->
                                             <-    certificate chain, bundle, gossip keys

A node renewing its certificate sends RENEW {CSR} on a connection where it presented its current
certificate.  The private key never leaves the node; the keys travel inside TLS only.  This
module is sans-I/O: :class:`Authority` maps a request to a reply.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.ca import CaError, CertificateAuthority, CsrRejected
from certs.identity import Identity, spiffe_id_of
from certs.names import HostName
from certs.spiffe import SpiffeId
from certs.tokens import TokenError, TokenLedger, check, der_fingerprint
from certs.verify import Peer, PeerRejected, PeerVerifier

MAGIC = b"\xffMJ1"
"""First bytes of an enrollment stream.  A push-pull stream starts with a frame length, which
is far below 0xff000000, so the two never look alike on the shared port."""
MAX_MESSAGE = 64 * 1024
HELLO, ENROLL, RENEW = "hello", "enroll", "renew"
REFUSAL_REASONS = ("malformed", "not_ca_holder", "name_in_use", "not_authenticated",
                   "bad_signature", "bad_key", "bad_identity", "wrong_trust_domain",
                   "wrong_identity", "bad_name", "bad_mac", "expired", "exhausted",
                   "wrong_mesh", "revoked", "ca_unusable")


class EnrollError(Exception):
    """Enrollment did not succeed; ``reason`` is a short label, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def pack(msg: dict[str, object]) -> bytes:
    return bytes(msgpack.packb(msg))


def unpack(data: bytes) -> dict[str, object]:
    if len(data) > MAX_MESSAGE:
        raise EnrollError("malformed", f"message of {len(data)} bytes, limit {MAX_MESSAGE}")
    try:
        msg = msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise EnrollError("malformed", "message is not msgpack") from None
    if not isinstance(msg, dict):
        raise EnrollError("malformed", "message is not a map")
    return msg


def refusal(reason: str, message: str) -> dict[str, object]:
    return {"ok": False, "reason": reason, "error": message}


@dataclass
class Authority:
    """The CA holder's side.  ``ca`` None means this node holds no CA key: it answers HELLO
    (so a joining node can pin the mesh) and points at the CA holders it knows."""

    identity: Callable[[], Identity]
    verifier: PeerVerifier
    ca: CertificateAuthority | None
    ledger: TokenLedger
    gossip_keys: Callable[[], list[bytes]]
    ca_holders: Callable[[], list[str]]
    name_in_use: Callable[[str], bool]
    lifetime_s: float = 24 * 3600.0
    refused: Counter[str] = field(default_factory=Counter)
    issued: int = 0

    def handle(self, msg: dict[str, object], peer: Peer | None,
               now: float | None = None) -> dict[str, object]:
        """The reply to one request; refusals are counted by reason and never raise."""
        now = time.time() if now is None else now
        op = msg.get("op")
        try:
            if op == HELLO:
                return self._hello()
            if op == ENROLL:
                return self._enroll(msg, now)
            if op == RENEW:
                return self._renew(msg, peer, now)
            raise EnrollError("malformed", f"unknown op {op!r}")
        except EnrollError as exc:
            self.refused[exc.reason] += 1
            return refusal(exc.reason, str(exc))

    def _hello(self) -> dict[str, object]:
        ident = self.identity()
        return {"ok": True, "chain": [_der(c) for c in ident.chain],
                "bundle": [_der(c) for c in ident.bundle],
                "ca_holders": [] if self.ca is not None else self.ca_holders()}

    def _csr(self, msg: dict[str, object]) -> x509.CertificateSigningRequest:
        data = msg.get("csr")
        if not isinstance(data, bytes):
            raise EnrollError("malformed", "csr: DER bytes required")
        try:
            return x509.load_der_x509_csr(data)
        except ValueError:
            raise EnrollError("malformed", "csr: not a DER certificate signing request") from None

    def _need_ca(self) -> CertificateAuthority:
        if self.ca is None:
            holders = self.ca_holders()
            raise EnrollError("not_ca_holder", "this node holds no CA key; CA holders: "
                              + (", ".join(holders) or "none known"))
        return self.ca

    def _enroll(self, msg: dict[str, object], now: float) -> dict[str, object]:
        ca = self._need_ca()
        token = msg.get("token")
        if not isinstance(token, str):
            raise EnrollError("malformed", "token: a string is required")
        try:
            claims = check(ca, token, now)
        except TokenError as exc:
            raise EnrollError(exc.reason, str(exc)) from None
        csr = self._csr(msg)
        sid, names = self._checked(ca, csr)
        if sid.kind != "node":
            raise EnrollError("bad_identity", f"enrollment is for nodes, not {sid}")
        if self.name_in_use(sid.name):
            raise EnrollError("name_in_use", f"a live member is already named {sid.name!r}")
        if str(sid) in self.verifier.revocations.cutoffs:
            raise EnrollError("revoked", f"{sid} is revoked; re-admit it under a new name or "
                                         "after its revocation has expired")
        try:
            self.ledger.consume(claims)
        except TokenError as exc:
            raise EnrollError(exc.reason, str(exc)) from None
        return self._issue(ca, csr, sid, names, ("node",), now)

    def _renew(self, msg: dict[str, object], peer: Peer | None, now: float
               ) -> dict[str, object]:
        ca = self._need_ca()
        if peer is None:
            raise EnrollError("not_authenticated", "renewal needs the current certificate")
        csr = self._csr(msg)
        sid, names = self._checked(ca, csr, expect=peer.spiffe_id)
        return self._issue(ca, csr, sid, names, tuple(sorted(peer.roles)), now)

    @staticmethod
    def _checked(ca: CertificateAuthority, csr: x509.CertificateSigningRequest,
                 expect: SpiffeId | None = None) -> tuple[SpiffeId, list[HostName]]:
        """The identity and host names a CSR asks for (:meth:`CertificateAuthority.check_request`:
        a renewal gets the names its CSR asks for, which the node derives from its settings)."""
        try:
            return ca.check_request(csr, expect)
        except CsrRejected as exc:
            raise EnrollError(exc.reason, str(exc)) from None

    def _issue(self, ca: CertificateAuthority, csr: x509.CertificateSigningRequest,
               sid: SpiffeId, names: list[HostName], roles: tuple[str, ...], now: float
               ) -> dict[str, object]:
        """Sign a CSR :meth:`_checked` already accepted (not checking its signature again)."""
        try:
            leaf = ca.sign(csr.public_key(), sid, roles,  # type: ignore[arg-type]
                           lifetime=dt.timedelta(seconds=self.lifetime_s), now=now,
                           names=names)
        except (CaError, ValueError) as exc:
            raise EnrollError("ca_unusable" if "expired" in str(exc) else "bad_identity",
                              str(exc)) from None
        self.issued += 1
        return {"ok": True, "chain": [_der(c) for c in ca.chain_for(leaf)],
                "bundle": [_der(c) for c in ca.bundle], "keys": self.gossip_keys()}


def check_hello(reply: dict[str, object], server_leaf_der: bytes | None, ca_fingerprint: str
                ) -> tuple[list[x509.Certificate], str]:
    """What a joining node checks before it sends its token: the server's TLS certificate is a
    mesh node certificate chaining to the root its token pins.  Returns (bundle, trust domain)."""
    try:
        chain = [x509.load_der_x509_certificate(d) for d in reply["chain"]]  # type: ignore[attr-defined]
        bundle_der = list(reply["bundle"])  # type: ignore[call-overload]
        bundle = [x509.load_der_x509_certificate(d) for d in bundle_der]
    except (KeyError, TypeError, ValueError):
        raise EnrollError("malformed", "seed's hello is malformed") from None
    pinned = [c for c, d in zip(bundle, bundle_der, strict=True)
              if der_fingerprint(d) == ca_fingerprint]
    if not pinned:
        raise EnrollError("wrong_mesh", "the seed's CA is not the one the join token names "
                                        "(wrong seed, or a man in the middle)")
    if not chain or server_leaf_der is None or _der(chain[0]) != server_leaf_der:
        raise EnrollError("wrong_mesh", "the seed's TLS certificate is not the one it claims")
    try:
        sid = spiffe_id_of(chain[0])
    except ValueError:
        raise EnrollError("wrong_mesh", "the seed's certificate has no SPIFFE ID") from None
    verifier = PeerVerifier(pinned, sid.trust_domain)
    try:
        verifier.verify_cert(chain[0], chain[1:])
    except PeerRejected as exc:
        raise EnrollError("wrong_mesh", f"the seed's certificate: {exc}") from None
    return pinned, sid.trust_domain
