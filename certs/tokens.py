"""Join tokens: what lets a new node enroll, with no central master to ask.

A token is ``mjt1.<payload>.<mac>`` (base64url).  The payload (id, expiry, allowed uses and the
fingerprint of the mesh root) is readable: the joining node uses the fingerprint to check that
the seed it talks to belongs to the mesh before it sends the token.  The MAC is keyed from the
CA key, so every CA holder can check any token without a shared database; what needs state is
the number of uses, which each CA holder counts and gossips (:class:`TokenLedger`).  Tokens are
secrets: only their id is ever logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import msgpack
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from certs.ca import CertificateAuthority
from certs.identity import write_public

PREFIX = "mjt1"
MAX_TOKEN_CHARS = 512
MAX_USES = 10_000
MAX_TTL = 30 * 86400.0
REASONS = ("malformed", "bad_mac", "expired", "exhausted", "wrong_mesh")


class TokenError(Exception):
    """A token that is refused; ``reason`` is one of :data:`REASONS`.  The message never holds
    the token itself."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TokenClaims:
    id: str
    expires: float
    uses: int
    ca_fingerprint: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac_key(ca: CertificateAuthority) -> bytes:
    secret = ca.key.private_numbers().private_value.to_bytes(48, "big")
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"meshd join token v1").derive(secret)


def _mac(ca: CertificateAuthority, signed: str) -> bytes:
    return hmac.new(_mac_key(ca), signed.encode("ascii"), hashlib.sha256).digest()[:16]


def create(ca: CertificateAuthority, *, uses: int, ttl: float, now: float
           ) -> tuple[str, TokenClaims]:
    """A new token allowing ``uses`` enrollments for ``ttl`` seconds."""
    if not 1 <= uses <= MAX_USES:
        raise ValueError(f"uses must be in 1..{MAX_USES}")
    if not 0 < ttl <= MAX_TTL:
        raise ValueError(f"ttl must be in (0, {MAX_TTL:.0f}] seconds")
    claims = TokenClaims(os.urandom(8).hex(), now + ttl, uses, ca.fingerprint())
    payload = _b64(msgpack.packb([claims.id, claims.expires, claims.uses,
                                  bytes.fromhex(claims.ca_fingerprint)]))
    signed = f"{PREFIX}.{payload}"
    return f"{signed}.{_b64(_mac(ca, signed))}", claims


def read(token: str) -> TokenClaims:
    """The claims, unverified: what a joining node uses to pin the CA."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        raise TokenError("malformed", "join token is not a token (wrong type or too long)")
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError("malformed", f"join token must look like {PREFIX}.<payload>.<mac>")
    try:
        tid, expires, uses, fp = msgpack.unpackb(_unb64(parts[1]), raw=False)
        if not (isinstance(tid, str) and isinstance(expires, float) and math.isfinite(expires)
                and isinstance(uses, int) and isinstance(fp, bytes) and len(fp) == 32):
            raise ValueError("payload fields")
        claims = TokenClaims(tid, expires, uses, fp.hex())
    except (ValueError, TypeError, binascii.Error, msgpack.UnpackException):
        raise TokenError("malformed", "join token payload cannot be decoded") from None
    if len(claims.ca_fingerprint) != 64 or not 1 <= claims.uses <= MAX_USES:
        raise TokenError("malformed", "join token payload is out of range")
    return claims


def check(ca: CertificateAuthority, token: str, now: float) -> TokenClaims:
    """Claims of a token this mesh made and that has not expired (uses are the ledger's job)."""
    claims = read(token)
    parts = token.strip().split(".")
    try:
        mac = _unb64(parts[2])
    except (ValueError, binascii.Error):
        raise TokenError("malformed", "join token MAC cannot be decoded") from None
    if claims.ca_fingerprint != ca.fingerprint():
        raise TokenError("wrong_mesh", f"join token {claims.id} was made for another mesh CA")
    if not hmac.compare_digest(mac, _mac(ca, f"{parts[0]}.{parts[1]}")):
        raise TokenError("bad_mac", f"join token {claims.id} is not signed by this mesh CA")
    if now >= claims.expires:
        raise TokenError("expired", f"join token {claims.id} expired")
    return claims


class TokenLedger:
    """How often each token was used: here (persisted) and, from gossip, at other CA holders.

    Two CA holders can each accept the last use of a token in the same gossip round; that window
    is the price of having no master, and it is bounded by one round.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.local: dict[str, list[float]] = {}   # id -> [uses here, expiry]
        self.remote: dict[str, dict[str, int]] = {}  # holder -> id -> uses
        self.version = 0
        if path is not None and path.exists():
            try:
                self.local = {str(k): [float(v[0]), float(v[1])]
                              for k, v in json.loads(path.read_text()).items()}
            except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError):
                self.local = {}

    def used(self, token_id: str) -> int:
        here = int(self.local.get(token_id, [0, 0])[0])
        return here + sum(counts.get(token_id, 0) for counts in self.remote.values())

    def consume(self, claims: TokenClaims) -> int:
        """Count one use; TokenError("exhausted") if none is left.  Returns uses left."""
        used = self.used(claims.id)
        if used >= claims.uses:
            raise TokenError("exhausted", f"join token {claims.id} has been used {used} of "
                                          f"{claims.uses} times")
        entry = self.local.setdefault(claims.id, [0, claims.expires])
        entry[0] += 1
        self.version += 1
        self._save()
        return claims.uses - used - 1

    def counts(self, now: float) -> dict[str, int]:
        """What this holder gossips: its own use counts of unexpired tokens."""
        return {k: int(v[0]) for k, v in self.local.items() if v[1] > now}

    def learn(self, holder: str, counts: dict[str, int]) -> None:
        self.remote[holder] = {str(k): int(v) for k, v in counts.items()}

    def prune(self, now: float) -> None:
        old = [k for k, v in self.local.items() if v[1] <= now]
        for k in old:
            del self.local[k]
        if old:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        write_public(self.path, json.dumps(self.local).encode())


def der_fingerprint(der: bytes) -> str:
    """SHA-256 hex of a DER certificate (what :attr:`TokenClaims.ca_fingerprint` holds)."""
    return hashlib.sha256(der).hexdigest()
