"""Gossip encryption keys (memberlist's keyring).

AES-256-GCM.  The first key (the *primary*) encrypts; every installed key decrypts.  Rotating a
key across a live mesh therefore takes three steps that never cut anyone off: install the new key
everywhere, make it primary everywhere, remove the old one.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class KeyringError(ValueError):
    """A key that cannot be used (wrong length, not base64, last key, unknown)."""


def decode_key(text: str) -> bytes:
    """A key from its base64 text form, checked for length."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyringError("encryption key is not valid base64") from exc
    if len(key) != KEY_BYTES:
        raise KeyringError(f"encryption key must be {KEY_BYTES} bytes (AES-256), got {len(key)}")
    return key


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def generate_key() -> bytes:
    return os.urandom(KEY_BYTES)


class Keyring:
    """Ordered set of AES-256-GCM keys; index 0 is the primary."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise KeyringError("a keyring needs at least one key")
        self._keys: list[bytes] = []
        self._aeads: list[AESGCM] = []
        for key in keys:
            self.install(key)

    @classmethod
    def from_base64(cls, *texts: str) -> Keyring:
        return cls([decode_key(t) for t in texts])

    @property
    def primary(self) -> bytes:
        return self._keys[0]

    def keys(self) -> list[bytes]:
        return list(self._keys)

    def install(self, key: bytes) -> None:
        """Add a key for decryption (no-op if present)."""
        if len(key) != KEY_BYTES:
            raise KeyringError(
                f"encryption key must be {KEY_BYTES} bytes (AES-256), got {len(key)}")
        if key not in self._keys:
            self._keys.append(key)
            self._aeads.append(AESGCM(key))

    def use(self, key: bytes) -> None:
        """Make an installed key the primary (encrypting) key."""
        try:
            i = self._keys.index(key)
        except ValueError:
            raise KeyringError("cannot use a key that is not installed") from None
        self._keys.insert(0, self._keys.pop(i))
        self._aeads.insert(0, self._aeads.pop(i))

    def remove(self, key: bytes) -> None:
        """Remove a non-primary key."""
        if key == self._keys[0]:
            raise KeyringError("cannot remove the primary key; use another key first")
        try:
            i = self._keys.index(key)
        except ValueError:
            raise KeyringError("key is not installed") from None
        del self._keys[i]
        del self._aeads[i]

    def encrypt(self, plaintext: bytes, aad: bytes) -> bytes:
        """``nonce || ciphertext || tag`` under the primary key."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aeads[0].encrypt(nonce, plaintext, aad)

    def decrypt(self, sealed: bytes, aad: bytes) -> bytes | None:
        """The plaintext, or None when no installed key authenticates it."""
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            return None
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        for aead in self._aeads:
            try:
                return aead.decrypt(nonce, body, aad)
            except InvalidTag:
                continue
        return None
