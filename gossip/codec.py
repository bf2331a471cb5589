"""Wire format of gossip packets and push-pull streams.

A packet is ``version (1 byte) | flags (1 byte) | body``.  With encryption the body is
``nonce | AES-256-GCM(ciphertext) | tag`` authenticated together with the two header bytes;
otherwise it is the plaintext.  The plaintext is one msgpack array of messages (a *compound*),
each message itself an array ``[type, field, ...]``, so one UDP packet carries a probe plus
piggybacked broadcasts.  Everything is validated on the way in: a packet that fails any check is
rejected as a whole with a :class:`DecodeError` whose ``reason`` is a short metric label.

**Rolling upgrades.**  A mesh runs two builds side by side while it upgrades, so the format
grows without breaking older readers, as protobuf does:

- a message may carry more fields than this build knows: the known ones are checked, the
  rest are dropped (up to :data:`MAX_EXTRA_FIELDS`);
- message types from :data:`OPTIONAL_TYPES` up are *optional*: a reader that does not know
  one skips it and takes the rest of the packet (an unknown type below is still an error:
  a new essential message needs every node upgraded first, so it must not be sent before);
- push-pull records and the payload itself may also grow at their ends.

The frame's ``version`` byte changes only for a format an older reader cannot skip through.

**Mesh message.**  :data:`MESH` (the first optional type) names the sender's mesh in a
datagram: ``[64, digest]``, where the digest is the first :data:`MESH_DIGEST_BYTES` bytes of
SHA-256 over the mesh id (:func:`mesh_digest`).  A digest, not the id itself: 12 bytes per
datagram whatever the id's length (a metadata tag may be 256 characters), so the packet budget
has one fixed charge; 64 bits keep two meshes apart (they are told apart, not authenticated:
keys and certificates do that).  Who gets it and what a receiver does with it is the
protocol's business (``gossip.protocol``); here it is one more message.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from gossip.keyring import NONCE_BYTES, TAG_BYTES, Keyring

VERSION = 1
FLAG_ENCRYPTED = 0x01
MAX_PACKET_BYTES = 65535

PING, INDIRECT_PING, ACK, NACK, ALIVE, SUSPECT, DEAD, STATE, STATE_DELTA = range(1, 10)
OPTIONAL_TYPES = 64
"""Message types from here to 127 are optional: skipped by a reader that does not know them."""
MAX_TYPE = 127
MESH = 64
"""Optional: the sender's mesh (:func:`mesh_digest`).  Optional so a build that knows optional
types but not this one still reads the packet; builds older than optional types drop the whole
packet, so it goes only to peers known to understand it (see ``gossip.protocol``)."""
MESH_DIGEST_BYTES = 8
MAX_EXTRA_FIELDS = 8
"""Fields a newer build may add to a message or record; more is not a newer build."""
MESSAGE_NAMES = {PING: "ping", INDIRECT_PING: "indirect_ping", ACK: "ack", NACK: "nack",
                 ALIVE: "alive", SUSPECT: "suspect", DEAD: "dead", STATE: "state",
                 STATE_DELTA: "state_delta", MESH: "mesh"}

MAX_NAME = 128
MAX_HOST = 255
MAX_U64 = 2**64 - 1
MAX_ACK_PAYLOAD = 512
MAX_META = 4096
MAX_BLOB = 1 << 20

ENCRYPTION_OVERHEAD = NONCE_BYTES + TAG_BYTES
HEADER_BYTES = 2
ARRAY_HEADER_MAX = 3  # msgpack array16 header

DROP_REASONS = ("truncated", "oversized", "version", "unencrypted", "no_key", "auth",
                "msgpack", "schema", "unknown_type", "unauthenticated", "other_mesh")
"""Every reason a packet can be dropped for, so metrics can expose them all from the start."""


class DecodeError(Exception):
    """A packet or stream that is rejected; ``reason`` is one of :data:`DROP_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# --- message constructors (each returns one encoded message) ---------------------------------

_pack = msgpack.Packer(use_bin_type=True).pack


def ping(seq: int, target: str, source: str) -> bytes:
    return _pack([PING, seq, target, source])


def indirect_ping(seq: int, target: str, host: str, port: int, nack: bool, source: str) -> bytes:
    return _pack([INDIRECT_PING, seq, target, host, port, nack, source])


def ack(seq: int, payload: bytes = b"") -> bytes:
    return _pack([ACK, seq, payload])


def nack(seq: int) -> bytes:
    return _pack([NACK, seq])


def alive(incarnation: int, name: str, host: str, port: int, meta: bytes) -> bytes:
    return _pack([ALIVE, incarnation, name, host, port, meta])


def suspect(incarnation: int, name: str, from_node: str) -> bytes:
    return _pack([SUSPECT, incarnation, name, from_node])


def dead(incarnation: int, name: str, from_node: str) -> bytes:
    return _pack([DEAD, incarnation, name, from_node])


def state(name: str, version: int, blob: bytes) -> bytes:
    return _pack([STATE, name, version, blob])


def state_delta(name: str, version: int, delta: bytes) -> bytes:
    return _pack([STATE_DELTA, name, version, delta])


def mesh_digest(mesh_id: str) -> bytes:
    """What a :data:`MESH` message carries for ``mesh_id``: a fixed-size digest, so the
    message costs the same whatever the id's length."""
    return hashlib.sha256(mesh_id.encode()).digest()[:MESH_DIGEST_BYTES]


def mesh(digest: bytes) -> bytes:
    """A :data:`MESH` message (12 bytes) naming the sender's mesh by its digest."""
    return _pack([MESH, digest])


def compound(messages: list[bytes]) -> bytes:
    """A msgpack array of already-encoded messages (no re-encoding)."""
    n = len(messages)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(messages)


# --- framing ---------------------------------------------------------------------------------

def seal(plaintext: bytes, keyring: Keyring | None) -> bytes:
    """Frame (and with a keyring, encrypt) a plaintext body."""
    if keyring is None:
        return bytes((VERSION, 0)) + plaintext
    header = bytes((VERSION, FLAG_ENCRYPTED))
    return header + keyring.encrypt(plaintext, header)


def open_frame(data: bytes, keyring: Keyring | None, max_bytes: int = MAX_PACKET_BYTES) -> bytes:
    """The plaintext body of a framed packet; raises :class:`DecodeError`."""
    if len(data) < HEADER_BYTES + 1:
        raise DecodeError("truncated", f"{len(data)} bytes")
    if len(data) > max_bytes:
        raise DecodeError("oversized", f"{len(data)} bytes")
    if data[0] != VERSION:
        raise DecodeError("version", f"version {data[0]}")
    flags = data[1]
    if flags & ~FLAG_ENCRYPTED:
        raise DecodeError("version", f"unknown flags {flags:#x}")
    encrypted = bool(flags & FLAG_ENCRYPTED)
    if keyring is None:
        if encrypted:
            raise DecodeError("no_key", "encrypted packet but no keyring")
        return data[HEADER_BYTES:]
    if not encrypted:
        raise DecodeError("unencrypted", "plaintext packet while encryption is on")
    plain = keyring.decrypt(data[HEADER_BYTES:], data[:HEADER_BYTES])
    if plain is None:
        raise DecodeError("auth", "no installed key authenticates the packet")
    return plain


def _unpack(body: bytes, max_len: int) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                               max_bin_len=max_len, max_str_len=max_len,
                               max_array_len=max(16, max_len // 2), max_map_len=64,
                               max_ext_len=0)
    except Exception as exc:  # msgpack raises many exception types on garbage input
        raise DecodeError("msgpack", type(exc).__name__) from None


# --- validation ------------------------------------------------------------------------------

def _is_u64(v: object) -> bool:
    return type(v) is int and 0 <= v <= MAX_U64  # noqa: E721 - bool is not a sequence number


def _is_name(v: object) -> bool:
    return type(v) is str and 0 < len(v) <= MAX_NAME  # noqa: E721


def _is_host(v: object) -> bool:
    return type(v) is str and 0 < len(v) <= MAX_HOST  # noqa: E721


def _is_port(v: object) -> bool:
    return type(v) is int and 0 < v <= 65535  # noqa: E721


def _is_bytes(v: object, limit: int) -> bool:
    return type(v) is bytes and len(v) <= limit  # noqa: E721


_SCHEMAS: dict[int, tuple[Any, ...]] = {
    PING: (_is_u64, lambda v: type(v) is str and len(v) <= MAX_NAME, _is_name),  # noqa: E721
    INDIRECT_PING: (_is_u64, _is_name, _is_host, _is_port, lambda v: type(v) is bool, _is_name),  # noqa: E721
    ACK: (_is_u64, lambda v: _is_bytes(v, MAX_ACK_PAYLOAD)),
    NACK: (_is_u64,),
    ALIVE: (_is_u64, _is_name, _is_host, _is_port, lambda v: _is_bytes(v, MAX_META)),
    SUSPECT: (_is_u64, _is_name, _is_name),
    DEAD: (_is_u64, _is_name, _is_name),
    STATE: (_is_name, _is_u64, lambda v: _is_bytes(v, MAX_BLOB)),
    STATE_DELTA: (_is_name, _is_u64, lambda v: _is_bytes(v, MAX_BLOB)),
    MESH: (lambda v: type(v) is bytes and len(v) == MESH_DIGEST_BYTES,),  # noqa: E721
}


def validate_message(msg: object) -> list[Any]:
    """Check one decoded message against its schema and return it (without the fields a newer
    build added: see the module's notes on upgrades)."""
    if type(msg) is not list or not msg:
        raise DecodeError("schema", "message is not a non-empty array")
    kind = msg[0]
    schema = _SCHEMAS.get(kind) if type(kind) is int else None  # noqa: E721
    if schema is None:
        raise DecodeError("unknown_type", f"message type {kind!r}")
    known = len(schema) + 1
    if not known <= len(msg) <= known + MAX_EXTRA_FIELDS:
        raise DecodeError("schema", f"{MESSAGE_NAMES[kind]} has {len(msg) - 1} fields")
    for i, check in enumerate(schema, 1):
        if not check(msg[i]):
            raise DecodeError("schema", f"{MESSAGE_NAMES[kind]} field {i} is invalid")
    return msg if len(msg) == known else msg[:known]


def is_optional(msg: object) -> bool:
    """A well-formed message of an optional type this build does not know."""
    return (type(msg) is list and bool(msg) and type(msg[0]) is int  # noqa: E721
            and OPTIONAL_TYPES <= msg[0] <= MAX_TYPE and msg[0] not in _SCHEMAS)


def decode_compound(data: bytes, keyring: Keyring | None) -> tuple[list[list[Any]], int]:
    """The messages of a packet this build knows, validated, and how many optional ones it
    skipped; raises :class:`DecodeError`."""
    body = open_frame(data, keyring)
    msgs = _unpack(body, MAX_PACKET_BYTES)
    if type(msgs) is not list or not msgs:
        raise DecodeError("schema", "packet body is not a non-empty array")
    known = [validate_message(m) for m in msgs if not is_optional(m)]
    return known, len(msgs) - len(known)


def decode_packet(data: bytes, keyring: Keyring | None) -> list[list[Any]]:
    """All messages of a packet this build knows, validated; raises :class:`DecodeError`."""
    return decode_compound(data, keyring)[0]


# --- push-pull streams -----------------------------------------------------------------------

# One node record in a push-pull exchange: [name, host, port, incarnation, status, meta].
NodeRecord = list[Any]
# One state record: [name, version, blob].
StateRecord = list[Any]


def encode_stream(source: str, join: bool, nodes: list[NodeRecord], states: list[StateRecord],
                  keyring: Keyring | None) -> bytes:
    """A sealed push-pull payload with our full membership and node-state tables."""
    return seal(msgpack.packb([source, join, nodes, states], use_bin_type=True), keyring)


def decode_stream(data: bytes, keyring: Keyring | None,
                  max_bytes: int) -> tuple[str, bool, list[NodeRecord], list[StateRecord]]:
    """Parse and validate a push-pull payload; raises :class:`DecodeError`."""
    body = open_frame(data, keyring, max_bytes)
    obj = _unpack(body, max_bytes)
    if not (type(obj) is list and 4 <= len(obj) <= 4 + MAX_EXTRA_FIELDS):
        raise DecodeError("schema", "push-pull payload must be an array of at least 4 elements")
    source, join, nodes, states = obj[:4]
    if not (_is_name(source) and type(join) is bool and type(nodes) is list
            and type(states) is list):
        raise DecodeError("schema", "push-pull header fields are invalid")
    for i, rec in enumerate(nodes):
        if type(rec) is list and 6 < len(rec) <= 6 + MAX_EXTRA_FIELDS:  # a newer build's
            rec = nodes[i] = rec[:6]
        if not (type(rec) is list and len(rec) == 6 and _is_name(rec[0]) and _is_host(rec[1])
                and _is_port(rec[2]) and _is_u64(rec[3]) and type(rec[4]) is int
                and 0 <= rec[4] <= 3 and _is_bytes(rec[5], MAX_META)):
            raise DecodeError("schema", "push-pull node record is invalid")
    for i, rec in enumerate(states):
        if type(rec) is list and 3 < len(rec) <= 3 + MAX_EXTRA_FIELDS:
            rec = states[i] = rec[:3]
        if not (type(rec) is list and len(rec) == 3 and _is_name(rec[0]) and _is_u64(rec[1])
                and _is_bytes(rec[2], MAX_BLOB)):
            raise DecodeError("schema", "push-pull state record is invalid")
    return source, join, nodes, states
