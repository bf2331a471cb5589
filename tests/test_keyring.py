"""Gossip encryption keyring (memberlist's keyring_test.go, adapted to AES-256 only)."""

import base64

import pytest

from gossip import codec
from gossip.keyring import (
    KEY_BYTES,
    NONCE_BYTES,
    TAG_BYTES,
    Keyring,
    KeyringError,
    decode_key,
    encode_key,
    generate_key,
)

K1, K2, K3 = bytes(range(32)), bytes(range(1, 33)), bytes(range(2, 34))
AAD = b"\x01\x01"


def test_empty_keyring_is_an_error() -> None:
    with pytest.raises(KeyringError, match="at least one key"):
        Keyring([])


@pytest.mark.parametrize("length", [0, 1, 16, 24, 31, 33, 64])
def test_wrong_key_length_rejected(length: int) -> None:
    with pytest.raises(KeyringError, match=f"must be 32 bytes.*got {length}"):
        Keyring([bytes(length)])
    ring = Keyring([K1])
    with pytest.raises(KeyringError, match="must be 32 bytes"):
        ring.install(bytes(length))
    assert ring.keys() == [K1]


def test_first_key_is_primary_and_order_kept() -> None:
    ring = Keyring([K1, K2, K3])
    assert ring.primary == K1
    assert ring.keys() == [K1, K2, K3]


def test_install_is_idempotent_and_appends() -> None:
    ring = Keyring([K1])
    ring.install(K2)
    ring.install(K2)
    ring.install(K1)
    assert ring.keys() == [K1, K2]
    assert ring.primary == K1  # installing never changes the primary


def test_duplicate_keys_in_constructor_collapse() -> None:
    assert Keyring([K1, K2, K1]).keys() == [K1, K2]


def test_keys_returns_a_copy() -> None:
    ring = Keyring([K1])
    ring.keys().append(K2)
    assert ring.keys() == [K1]


def test_use_makes_installed_key_primary() -> None:
    ring = Keyring([K1, K2, K3])
    ring.use(K3)
    assert ring.primary == K3
    assert set(ring.keys()) == {K1, K2, K3}
    ring.use(K3)  # already primary: no-op
    assert ring.primary == K3


def test_use_unknown_key_is_an_error() -> None:
    ring = Keyring([K1])
    with pytest.raises(KeyringError, match="not installed"):
        ring.use(K2)
    assert ring.primary == K1


def test_remove_rules() -> None:
    ring = Keyring([K1, K2])
    with pytest.raises(KeyringError, match="primary"):
        ring.remove(K1)
    with pytest.raises(KeyringError, match="not installed"):
        ring.remove(K3)
    ring.remove(K2)
    assert ring.keys() == [K1]
    # The last key is always the primary, so it can never be removed.
    with pytest.raises(KeyringError):
        ring.remove(K1)


def test_first_key_encrypts_all_keys_decrypt() -> None:
    ring = Keyring([K1, K2])
    sealed = ring.encrypt(b"hello", AAD)
    assert len(sealed) == NONCE_BYTES + len(b"hello") + TAG_BYTES
    assert Keyring([K1]).decrypt(sealed, AAD) == b"hello"
    assert Keyring([K2]).decrypt(sealed, AAD) is None  # encrypted under the primary only
    assert Keyring([K3, K2, K1]).decrypt(sealed, AAD) == b"hello"  # any position decrypts


def test_nonce_is_fresh_per_message() -> None:
    ring = Keyring([K1])
    assert ring.encrypt(b"same", AAD) != ring.encrypt(b"same", AAD)


def test_wrong_key_aad_or_tampering_gives_none() -> None:
    ring = Keyring([K1])
    sealed = ring.encrypt(b"payload", AAD)
    assert Keyring([K2]).decrypt(sealed, AAD) is None
    assert ring.decrypt(sealed, b"\x01\x00") is None
    for i in range(len(sealed)):
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        assert ring.decrypt(bytes(flipped), AAD) is None
    assert ring.decrypt(sealed[:-1], AAD) is None
    assert ring.decrypt(sealed + b"\x00", AAD) is None


@pytest.mark.parametrize("size", [0, 1, NONCE_BYTES, NONCE_BYTES + TAG_BYTES - 1])
def test_too_short_sealed_gives_none(size: int) -> None:
    assert Keyring([K1]).decrypt(bytes(size), AAD) is None


def test_empty_plaintext_round_trip() -> None:
    ring = Keyring([K1])
    assert ring.decrypt(ring.encrypt(b"", AAD), AAD) == b""


# --- base64 text form ----------------------------------------------------------------------


def test_base64_round_trip() -> None:
    key = generate_key()
    assert len(key) == KEY_BYTES
    text = encode_key(key)
    assert decode_key(text) == key
    assert decode_key(f"  {text}\n") == key  # e.g. read from a file
    assert Keyring.from_base64(encode_key(K1), encode_key(K2)).keys() == [K1, K2]


def test_generated_keys_differ() -> None:
    assert generate_key() != generate_key()


@pytest.mark.parametrize("text", ["not base64!", "abc", "é" * 44, "====", "AAAA AAAA"])
def test_invalid_base64(text: str) -> None:
    with pytest.raises(KeyringError, match="not valid base64"):
        decode_key(text)


@pytest.mark.parametrize("length", [0, 16, 24, 31, 33])
def test_base64_wrong_length(length: int) -> None:
    with pytest.raises(KeyringError, match=f"32 bytes.*got {length}"):
        decode_key(base64.b64encode(bytes(length)).decode())


def test_keyring_error_is_a_value_error() -> None:
    assert issubclass(KeyringError, ValueError)


# --- rotation across a mesh ----------------------------------------------------------------


def _packet(ring: Keyring, text: bytes) -> bytes:
    return codec.seal(codec.compound([codec.ping(1, "", text.decode())]), ring)


def _reads(ring: Keyring, packet: bytes) -> bool:
    try:
        codec.decode_packet(packet, ring)
    except codec.DecodeError as exc:
        assert exc.reason == "auth"
        return False
    return True


def test_three_step_rotation_never_cuts_anyone_off() -> None:
    old, new = K1, K2
    nodes = [Keyring([old]) for _ in range(3)]

    def everyone_talks() -> bool:
        return all(_reads(dst, _packet(src, b"n")) for src in nodes for dst in nodes)

    assert everyone_talks()
    # 1. Install the new key everywhere (one node at a time, checking in between).
    for ring in nodes:
        ring.install(new)
        assert everyone_talks()
    # 2. Make it primary everywhere; nodes still on the old primary remain readable.
    for ring in nodes:
        ring.use(new)
        assert everyone_talks()
    # 3. Remove the old key everywhere.
    for ring in nodes:
        ring.remove(old)
        assert everyone_talks()
    assert all(r.keys() == [new] for r in nodes)
    # A node that only knows the old key is cut off in both directions.
    stale = Keyring([old])
    assert not _reads(nodes[0], _packet(stale, b"s"))
    assert not _reads(stale, _packet(nodes[0], b"n"))


def test_using_new_key_before_everyone_installed_it_cuts_off() -> None:
    a, b = Keyring([K1]), Keyring([K1])
    a.install(K2)
    a.use(K2)
    assert not _reads(b, _packet(a, b"a"))  # b has not installed K2 yet
    assert _reads(a, _packet(b, b"b"))      # a still decrypts K1
