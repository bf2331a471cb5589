"""Checking a peer's certificate: chain to our roots, trust domain, revocation, roles.

TLS libraries check the chain; the SPIFFE rules are ours and are enforced here, in code, for
every channel (gRPC handlers, push-pull, enrollment, Raft).  Verified leaves are cached by their
DER bytes, so a long-lived connection's calls cost a dictionary lookup plus the revocation check.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from certs.identity import mesh_of, roles_of, spiffe_id_of
from certs.revocation import Revocations, issued_at
from certs.spiffe import SpiffeId

REJECT_REASONS = ("no_certificate", "malformed", "untrusted", "expired", "not_yet_valid",
                  "revoked", "wrong_trust_domain", "bad_identity", "other_mesh")
"""Why a peer certificate is refused: the label of ``meshd_security_refusals_total``."""
CACHE_SIZE = 4096


class PeerRejected(Exception):
    """A peer certificate we refuse; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end, as its verified certificate says."""

    spiffe_id: SpiffeId
    roles: frozenset[str]
    serial: int
    not_after: dt.datetime
    issued_at: float

    @property
    def name(self) -> str:
        return self.spiffe_id.name


class PeerVerifier:
    """Verifies leaves against the mesh roots for one trust domain."""

    def __init__(self, bundle: list[x509.Certificate] | tuple[x509.Certificate, ...],
                 trust_domain: str, revocations: Revocations | None = None,
                 intermediates: list[x509.Certificate] | tuple[x509.Certificate, ...] = (),
                 mesh: str = "") -> None:
        self.trust_domain = trust_domain
        self.mesh = mesh
        """Our mesh id: a peer whose certificate names another is refused (``other_mesh``),
        even when its CA shares our root.  "" (or a peer certificate without one, from a CA
        that predates mesh ids) checks nothing."""
        self.intermediates = list(intermediates)
        """The mesh's own intermediate CAs: TLS stacks hand us only the peer's leaf."""
        self.revocations = (revocations if revocations is not None
                            else Revocations(bundle, trust_domain))
        self._store = Store(list(bundle))
        self._cache: OrderedDict[bytes, Peer] = OrderedDict()
        self.rejected: Counter[str] = Counter()

    def set_bundle(self, bundle: list[x509.Certificate] | tuple[x509.Certificate, ...]) -> None:
        self._store = Store(list(bundle))
        self._cache.clear()

    def verify_der(self, leaf_der: bytes | None, intermediates: list[bytes] | None = None,
                   now: dt.datetime | None = None) -> Peer:
        """The verified peer, or :class:`PeerRejected` (counted in ``rejected``)."""
        return self._counted(leaf_der, x509.load_der_x509_certificate, "DER",
                             intermediates or [], now)

    def verify_pem(self, pem: bytes | None, now: dt.datetime | None = None) -> Peer:
        """For gRPC's ``x509_pem_cert`` auth property (leaf only; intermediates are in it too
        only when the peer sent them, which the handshake already checked)."""
        return self._counted(pem, x509.load_pem_x509_certificate, "PEM", [], now)

    def verify_cert(self, cert: x509.Certificate, intermediates: list[x509.Certificate],
                    now: dt.datetime | None = None) -> Peer:
        try:
            return self._check(cert, intermediates, now)
        except PeerRejected as exc:
            self.rejected[exc.reason] += 1
            raise

    # --- internals ------------------------------------------------------------------------

    def _still_good(self, peer: Peer, now: dt.datetime | None) -> bool:
        when = now or dt.datetime.now(dt.UTC)
        if when > peer.not_after:
            return False
        if self.revocations.is_revoked(peer.spiffe_id, peer.issued_at):
            raise PeerRejected("revoked", f"certificate of {peer.spiffe_id} (serial "
                                          f"{peer.serial:x}) is revoked")
        return True

    def _remember(self, key: bytes, peer: Peer) -> None:
        self._cache[key] = peer
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _counted(self, data: bytes | None, load: Callable[[bytes], x509.Certificate],
                 form: str, intermediates: list[bytes], now: dt.datetime | None) -> Peer:
        """A leaf in ``form`` (cached by its bytes), with every refusal counted once."""
        try:
            if not data:
                raise PeerRejected("no_certificate", "no client certificate was presented")
            cached = self._cache.get(data)
            if cached is not None and self._still_good(cached, now):
                return cached
            try:
                cert = load(data)
                inter = [x509.load_der_x509_certificate(d) for d in intermediates]
            except ValueError:
                raise PeerRejected("malformed", f"peer certificate is not valid {form}") from None
            peer = self._check(cert, inter, now)
        except PeerRejected as exc:
            self.rejected[exc.reason] += 1
            raise
        self._remember(data, peer)
        return peer

    def _check(self, cert: x509.Certificate, intermediates: list[x509.Certificate],
               now: dt.datetime | None) -> Peer:
        when = now or dt.datetime.now(dt.UTC)
        try:
            sid = spiffe_id_of(cert)
        except ValueError as exc:
            raise PeerRejected("bad_identity", f"peer certificate: {exc}") from None
        if when > cert.not_valid_after_utc:
            raise PeerRejected("expired", f"certificate of {sid} expired at "
                                          f"{cert.not_valid_after_utc.isoformat()}")
        if when < cert.not_valid_before_utc:
            raise PeerRejected("not_yet_valid", f"certificate of {sid} is not valid before "
                                                f"{cert.not_valid_before_utc.isoformat()}")
        verifier = PolicyBuilder().store(self._store).time(when).build_client_verifier()
        try:
            verifier.verify(cert, intermediates or self.intermediates)
        except VerificationError as exc:
            raise PeerRejected("untrusted", f"certificate of {sid} does not chain to the mesh "
                                            f"CA ({exc})") from None
        if sid.trust_domain != self.trust_domain:
            raise PeerRejected("wrong_trust_domain", f"{sid} is not in trust domain "
                                                     f"{self.trust_domain}")
        theirs = mesh_of(cert)
        if self.mesh and theirs and theirs != self.mesh:
            raise PeerRejected("other_mesh", f"certificate of {sid} belongs to mesh {theirs}; "
                                             f"this is mesh {self.mesh}")
        issued = issued_at(cert)
        if self.revocations.is_revoked(sid, issued):
            raise PeerRejected("revoked", f"certificate of {sid} (serial "
                                          f"{cert.serial_number:x}) is revoked")
        try:
            roles = frozenset(roles_of(cert))
        except ValueError as exc:
            raise PeerRejected("bad_identity", f"certificate of {sid}: {exc}") from None
        return Peer(sid, roles, cert.serial_number, cert.not_valid_after_utc, issued)
