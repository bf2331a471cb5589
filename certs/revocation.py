"""Revocation by identity: "every certificate of spiffe://D/node/X issued before T is void".

Revoking an identity rather than a serial also voids a renewal that raced the revocation, and
nodes need no issuance log to know which serials a name had.  The list is signed by a CA key
and gossiped in the CA holders' node state; every node merges every valid list it sees (the
latest cut-off per identity wins) and keeps the result in its data dir, so one gossip round
after ``meshctl revoke`` the identity is refused everywhere, also after restarts.  Entries drop
out once every certificate they could void has expired.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs.ca import CLOCK_SKEW, MAX_LEAF_LIFETIME, CertificateAuthority, issued_by
from certs.identity import write_public
from certs.spiffe import SpiffeError, SpiffeId

FORMAT = 1
MAX_BLOB = 32 * 1024


class RevocationError(ValueError):
    """A revocation list that is malformed or not signed by a mesh CA."""


def issued_at(cert: x509.Certificate) -> float:
    """When the CA signed ``cert`` (it back-dates ``not_before`` by the clock-skew margin)."""
    return (cert.not_valid_before_utc + CLOCK_SKEW).timestamp()


def sign_list(ca: CertificateAuthority, entries: dict[str, float], now: float) -> bytes:
    """``entries`` maps SPIFFE ID -> cut-off (epoch seconds)."""
    body = msgpack.packb({"v": FORMAT, "td": ca.trust_domain, "at": now,
                          "e": sorted(entries.items())})
    sig = ca.key.sign(body, ec.ECDSA(hashes.SHA256()))
    # A root signer is in everyone's bundle already; leaving it out keeps the list small enough
    # to ride gossip broadcasts (node state up to 1 KiB) instead of waiting for push-pull.
    signers = ([] if ca.cert in ca.bundle else
               [c.public_bytes(serialization.Encoding.DER) for c in (ca.cert, *ca.chain)])
    return bytes(msgpack.packb([body, sig, signers]))


def _is_ca(cert: x509.Certificate) -> bool:
    """Only a CA may sign revocations: a node's own key must not void other identities."""
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return bool(bc.ca and (ku.key_cert_sign or ku.crl_sign))


def _signed_by(cert: x509.Certificate, body: bytes, sig: bytes) -> bool:
    pub = cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        return False
    try:
        pub.verify(sig, body, ec.ECDSA(hashes.SHA256()))
        return True
    except InvalidSignature:
        return False


class Revocations:
    """The merged view: identity -> cut-off.  ``is_revoked`` is on every handshake's path."""

    def __init__(self, bundle: list[x509.Certificate] | tuple[x509.Certificate, ...],
                 trust_domain: str = "", path: Path | None = None) -> None:
        self.bundle = list(bundle)
        self.trust_domain = trust_domain
        self.path = path
        self.cutoffs: dict[str, float] = {}
        self.version = 0
        """Bumped on every change, so caches and publishers can tell something moved."""
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                self.cutoffs = {str(k): float(v) for k, v in data.items()}
            except (OSError, ValueError, TypeError, AttributeError):
                self.cutoffs = {}

    def is_revoked(self, sid: SpiffeId | str, issued: float) -> bool:
        cutoff = self.cutoffs.get(str(sid))
        return cutoff is not None and issued <= cutoff

    def revoke(self, sid: SpiffeId, cutoff: float) -> bool:
        """Record a revocation made here (on a CA holder); True when it changed anything."""
        return self.merge({str(sid): cutoff})

    def merge(self, entries: dict[str, float]) -> bool:
        changed = False
        for sid, cutoff in entries.items():
            if cutoff > self.cutoffs.get(sid, float("-inf")):
                self.cutoffs[sid] = cutoff
                changed = True
        if changed:
            self.version += 1
            self._save()
        return changed

    def prune(self, now: float) -> None:
        """Forget identities whose voided certificates have all expired."""
        limit = (MAX_LEAF_LIFETIME + CLOCK_SKEW).total_seconds()
        old = [sid for sid, cutoff in self.cutoffs.items() if cutoff + limit < now]
        for sid in old:
            del self.cutoffs[sid]
        if old:
            self.version += 1
            self._save()

    def update(self, blob: bytes) -> bool:
        """Merge a signed list from gossip; RevocationError when it is not one of ours."""
        return self.merge(self.open(blob))

    def open(self, blob: bytes) -> dict[str, float]:
        if len(blob) > MAX_BLOB:
            raise RevocationError(f"revocation list is {len(blob)} bytes, limit {MAX_BLOB}")
        try:
            body, sig, signers = msgpack.unpackb(blob, raw=False)
            chain = [x509.load_der_x509_certificate(d) for d in signers]
            doc = msgpack.unpackb(body, raw=False)
            if not all(isinstance(k, str) for k, _ in doc["e"]):
                raise TypeError("revocation entry names no identity")
            entries = {str(SpiffeId.parse(k)): float(v) for k, v in doc["e"]}
            td = doc["td"]
        except (ValueError, TypeError, KeyError, AttributeError, SpiffeError,
                msgpack.UnpackException) as exc:
            raise RevocationError(f"malformed revocation list ({type(exc).__name__})") from None
        if not isinstance(body, bytes) or not isinstance(sig, bytes):
            raise RevocationError("malformed revocation list")
        if self.trust_domain and td != self.trust_domain:
            raise RevocationError(f"revocation list is for trust domain {td!r}")
        if not chain:  # signed by a root
            if not any(_signed_by(root, body, sig) for root in self.bundle):
                raise RevocationError("revocation list is not signed by a mesh CA")
            return entries
        if not _is_ca(chain[0]):
            raise RevocationError("revocation list signer is not a CA certificate")
        if not _signed_by(chain[0], body, sig):
            raise RevocationError("revocation list signature does not verify")
        for child, parent in zip(chain, chain[1:], strict=False):
            if not issued_by(child, parent):
                raise RevocationError("revocation list signer chain is broken")
        top = chain[-1]
        if not any(top == root or issued_by(top, root) for root in self.bundle):
            raise RevocationError("revocation list is not signed by a mesh CA")
        return entries

    def _save(self) -> None:
        if self.path is None:
            return
        write_public(self.path, json.dumps(self.cutoffs).encode())


