"""Property-based fuzzing of the wire decoder and of the ``Swim`` state machine.

The decoder must turn every input into either validated messages or a ``DecodeError`` with a
known ``reason``; the state machine must survive any sequence of packets, streams and ticks
without raising, while keeping its invariants and counting every rejected input.
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip import codec
from gossip.config import Config
from gossip.keyring import Keyring
from gossip.protocol import StreamRequest, Swim
from gossip.state import ROLES, MetaError, NodeMeta, Status

KEY_A, KEY_B = bytes(range(32)), bytes(range(100, 132))
SELF = "a"
POOL = [SELF, "b", "c", "d", "e"]
ADDRS = [(f"10.0.0.{i}", 7946) for i in range(1, 7)]
STREAM_MAX = 1 << 20


FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(FAST, max_examples=60)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _decode_or_reason(data: bytes, keyring: Keyring | None) -> list[Any] | str:
    try:
        return codec.decode_packet(data, keyring)
    except codec.DecodeError as exc:
        assert exc.reason in codec.DROP_REASONS, exc.reason
        return exc.reason


def _decode_stream_or_reason(data: bytes, keyring: Keyring | None) -> tuple[Any, ...] | str:
    try:
        return codec.decode_stream(data, keyring, STREAM_MAX)
    except codec.DecodeError as exc:
        assert exc.reason in codec.DROP_REASONS, exc.reason
        return exc.reason


# --- strategies ------------------------------------------------------------------------------

names = st.one_of(st.sampled_from(POOL), st.text(min_size=1, max_size=codec.MAX_NAME))
u64 = st.one_of(st.integers(0, 6), st.integers(0, codec.MAX_U64), st.just(codec.MAX_U64))
seqs = st.one_of(st.integers(0, 40), u64)
hosts = st.one_of(st.sampled_from([h for h, _ in ADDRS]),
                  st.text(min_size=1, max_size=codec.MAX_HOST))
ports = st.one_of(st.just(7946), st.integers(1, 65535))
addrs = st.one_of(st.sampled_from(ADDRS), st.tuples(hosts, ports))
valid_metas = st.builds(
    NodeMeta.build,
    roles=st.lists(st.sampled_from(ROLES), max_size=3),
    zone=st.text(max_size=8), region=st.text(max_size=8),
    ports=st.dictionaries(st.text(min_size=1, max_size=8), st.integers(0, 65535), max_size=3),
    tags=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=16), max_size=3),
).map(NodeMeta.encode)
metas = st.one_of(st.just(NodeMeta().encode()), valid_metas, st.binary(max_size=64))
blobs = st.binary(max_size=200)
MESH_OURS, MESH_THEIRS = "0" * 32, "f" * 32
"""The mesh of the node under test in the meshed runs, and another one."""
mesh_metas = st.sampled_from([NodeMeta.build(tags={"mesh": m}).encode()
                              for m in (MESH_OURS, MESH_THEIRS)])
digests = st.one_of(st.sampled_from([codec.mesh_digest(MESH_OURS),
                                     codec.mesh_digest(MESH_THEIRS)]),
                    st.binary(min_size=codec.MESH_DIGEST_BYTES,
                              max_size=codec.MESH_DIGEST_BYTES))

# Known protocol bug (xfail tests in test_protocol.py): our own incarnation is refuted as
# accused + 1 and our state version continued as remote + 1, both unbounded, so an input about
# ourselves at (or next to) 2**64-1 makes Swim raise OverflowError.  Generated values about
# ourselves stay well below that, and the checker skips any input that still reaches it (a
# mutation can flip the high bits).  Values about other members use the full u64 range.
SELF_SAFE = 2**48
OVERFLOW_ZONE = codec.MAX_U64 - 100_000


def _self_safe(name: str, value: int) -> int:
    return value % SELF_SAFE if name == SELF else value


def _hits_known_overflow(msgs: list[Any], nodes: list[Any] = (), states: list[Any] = ()) -> bool:
    for m in msgs:
        if m[0] in (codec.ALIVE, codec.SUSPECT, codec.DEAD) and m[2] == SELF:
            if m[1] >= OVERFLOW_ZONE:
                return True
        if m[0] in (codec.STATE, codec.STATE_DELTA) and m[1] == SELF and m[2] >= OVERFLOW_ZONE:
            return True
    return any(r[0] == SELF and r[3] >= OVERFLOW_ZONE for r in nodes) or any(
        r[0] == SELF and r[1] >= OVERFLOW_ZONE for r in states)


@st.composite
def messages(draw: Any) -> bytes:
    kind = draw(st.sampled_from(list(codec.MESSAGE_NAMES)))
    if kind == codec.PING:
        target = draw(st.one_of(st.just(""), st.just(SELF), names))
        return codec.ping(draw(seqs), target, draw(names))
    if kind == codec.INDIRECT_PING:
        host, port = draw(addrs)
        return codec.indirect_ping(draw(seqs), draw(names), host, port, draw(st.booleans()),
                                   draw(names))
    if kind == codec.ACK:
        return codec.ack(draw(seqs), draw(st.binary(max_size=codec.MAX_ACK_PAYLOAD)))
    if kind == codec.NACK:
        return codec.nack(draw(seqs))
    if kind == codec.MESH:
        return codec.mesh(draw(digests))
    name = draw(names)
    if kind == codec.ALIVE:
        host, port = draw(addrs)
        meta = draw(st.one_of(metas, mesh_metas))
        return codec.alive(_self_safe(name, draw(u64)), name, host, port, meta)
    if kind == codec.SUSPECT:
        return codec.suspect(_self_safe(name, draw(u64)), name, draw(names))
    if kind == codec.DEAD:
        return codec.dead(_self_safe(name, draw(u64)), name, draw(names))
    if kind == codec.STATE_DELTA:
        return codec.state_delta(name, _self_safe(name, draw(u64)), draw(blobs))
    return codec.state(name, _self_safe(name, draw(u64)), draw(blobs))


@st.composite
def node_records(draw: Any) -> list[Any]:
    name = draw(names)
    host, port = draw(addrs)
    return [name, host, port, _self_safe(name, draw(u64)), draw(st.integers(0, 3)),
            draw(metas)]


@st.composite
def state_records(draw: Any) -> list[Any]:
    name = draw(names)
    return [name, _self_safe(name, draw(u64)), draw(blobs)]


def packets(keyring: Keyring | None) -> st.SearchStrategy[bytes]:
    return st.lists(messages(), min_size=1, max_size=5).map(
        lambda msgs: codec.seal(codec.compound(msgs), keyring))


def streams(keyring: Keyring | None) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda src, join, nodes, states: codec.encode_stream(src, join, nodes, states, keyring),
        names, st.booleans(), st.lists(node_records(), max_size=6),
        st.lists(state_records(), max_size=4))


@st.composite
def mutated(draw: Any, base: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(base))
    how = draw(st.sampled_from(["truncate", "flip", "extend", "splice", "byte"]))
    if how == "truncate":
        del data[draw(st.integers(0, len(data))):]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "extend":
        data += draw(st.binary(min_size=1, max_size=32))
    elif how == "splice":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=16))
    else:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), codec.MAX_U64)
    | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)

# Message-shaped arrays with random field values: [type, anything...].
message_shaped = st.builds(lambda kind, rest: [kind, *rest],
                           st.one_of(st.integers(0, 10), msgpack_values),
                           st.lists(msgpack_values, max_size=7))


# --- the decoder -----------------------------------------------------------------------------


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    for ring in (None, Keyring([KEY_A])):
        _decode_or_reason(data, ring)
        _decode_stream_or_reason(data, ring)


@FAST
@given(st.binary(max_size=300))
def test_random_bodies_behind_a_valid_header(body: bytes) -> None:
    _decode_or_reason(bytes((codec.VERSION, 0)) + body, None)
    _decode_stream_or_reason(bytes((codec.VERSION, 0)) + body, None)
    ring = Keyring([KEY_A])
    _decode_or_reason(codec.seal(body, ring), ring)
    _decode_stream_or_reason(codec.seal(body, ring), ring)


@FAST
@given(st.lists(messages(), min_size=1, max_size=6), st.booleans())
def test_valid_packets_round_trip(msgs: list[bytes], encrypted: bool) -> None:
    ring = Keyring([KEY_A]) if encrypted else None
    decoded = codec.decode_packet(codec.seal(codec.compound(msgs), ring), ring)
    assert decoded == [msgpack.unpackb(m, raw=False) for m in msgs]


@FAST
@given(streams(None))
def test_valid_streams_round_trip(data: bytes) -> None:
    source, _join, nodes, states = codec.decode_stream(data, None, STREAM_MAX)
    assert codec.encode_stream(source, _join, nodes, states, None) == data


@FAST
@given(st.one_of(mutated(packets(None)), mutated(streams(None))))
def test_mutated_plaintext_only_raises_decode_error(data: bytes) -> None:
    _decode_or_reason(data, None)
    _decode_stream_or_reason(data, None)


@FAST
@given(st.one_of(mutated(packets(Keyring([KEY_A]))), mutated(streams(Keyring([KEY_A])))))
def test_mutated_ciphertext_is_rejected(data: bytes) -> None:
    ring = Keyring([KEY_A])
    got = _decode_or_reason(data, ring)
    if isinstance(got, str):
        return
    # Only a mutation outside the authenticated bytes can pass: none exist, except an
    # unchanged packet (e.g. a byte overwritten with its own value, or a no-op truncation).
    assert data[:2] == bytes((codec.VERSION, codec.FLAG_ENCRYPTED))


@SLOW
@given(msgpack_values)
def test_wrong_shapes_only_raise_decode_error(value: Any) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    for ring in (None, Keyring([KEY_A])):
        sealed = codec.seal(body, ring)
        got = _decode_or_reason(sealed, ring)
        if not isinstance(got, str):
            assert type(value) is list and value
        _decode_stream_or_reason(sealed, ring)


@SLOW
@given(st.lists(message_shaped, min_size=1, max_size=4))
def test_message_shaped_garbage_only_raises_decode_error(msgs: list[list[Any]]) -> None:
    data = codec.seal(msgpack.packb(msgs, use_bin_type=True), None)
    got = _decode_or_reason(data, None)
    if not isinstance(got, str):
        for msg in got:  # whatever passed satisfies the schema
            assert codec.validate_message(msg) is msg


@SLOW
@given(st.lists(st.lists(msgpack_values, max_size=7), max_size=4),
       st.lists(st.lists(msgpack_values, max_size=4), max_size=3), msgpack_values)
def test_stream_shaped_garbage_only_raises_decode_error(nodes: list[Any], states: list[Any],
                                                         source: Any) -> None:
    for src in (source, "x"):
        body = msgpack.packb([src, False, nodes, states], use_bin_type=True)
        _decode_stream_or_reason(codec.seal(body, None), None)


def test_oversized_input() -> None:
    big = codec.seal(b"\x91" + msgpack.packb([codec.NACK, 1]) + bytes(70_000), None)
    assert _decode_or_reason(big, None) == "oversized"
    assert _decode_or_reason(bytes(codec.MAX_PACKET_BYTES + 1), None) == "oversized"
    ok = codec.seal(codec.compound([codec.nack(1)]), None)
    assert _decode_stream_or_reason(ok + bytes(STREAM_MAX), None) == "oversized"


def test_deeply_nested_input() -> None:
    deep = codec.seal(b"\x91" * 100_000 + b"\xc0", None)
    assert _decode_or_reason(deep, None) == "oversized"
    deep = codec.seal(b"\x91" * 60_000 + b"\xc0", None)
    assert _decode_or_reason(deep, None) in ("msgpack", "schema")
    assert isinstance(_decode_stream_or_reason(deep, None), str)


@FAST
@given(st.integers(0, 255).filter(lambda v: v != codec.VERSION), packets(None))
def test_wrong_version_byte(version: int, data: bytes) -> None:
    assert _decode_or_reason(bytes((version,)) + data[1:], None) == "version"


@FAST
@given(st.integers(2, 255), packets(None))
def test_unknown_flags(flags: int, data: bytes) -> None:
    assert _decode_or_reason(data[:1] + bytes((flags,)) + data[2:], None) == "version"


@FAST
@given(packets(Keyring([KEY_B])))
def test_encrypted_under_a_wrong_key(data: bytes) -> None:
    assert _decode_or_reason(data, Keyring([KEY_A])) == "auth"
    assert _decode_or_reason(data, None) == "no_key"
    assert _decode_or_reason(data, Keyring([KEY_A, KEY_B])) != "auth"


@FAST
@given(packets(None))
def test_plaintext_when_a_keyring_is_set(data: bytes) -> None:
    assert _decode_or_reason(data, Keyring([KEY_A])) == "unencrypted"


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "truncated"), (b"\x01", "truncated"), (b"\x01\x00", "truncated"),
    (b"\x01\x00\xc1", "msgpack"), (b"\x01\x00\x90", "schema"), (b"\x01\x00\x01", "schema"),
    (b"\x01\x00\x91\x90", "schema"), (b"\x01\x00\x91\x91\x3f", "unknown_type"),
    (b"\x01\x00\x91\x91\xc3", "unknown_type"), (b"\x01\x00\x91\x92\x04\xa1x", "schema"),
    (b"\x01\x00\x90\x90", "msgpack"), (b"\x01\x01" + bytes(27), "no_key"),
])
def test_reason_labels(data: bytes, reason: str) -> None:
    assert _decode_or_reason(data, None) == reason


def test_a_newer_builds_messages_are_read_as_far_as_this_build_knows_them() -> None:
    """Rolling upgrades: an optional message type this build does not know is skipped with the
    rest of the packet kept; known messages and records may carry fields added later."""
    ping = [codec.PING, 7, "b", "a"]
    packet = codec.seal(codec.compound([msgpack.packb([99, "news", 1]),
                                        msgpack.packb([*ping, "added", 2])]), None)
    assert codec.decode_compound(packet, None) == ([ping], 1)
    assert codec.decode_packet(packet, None) == [ping]
    too_many = codec.seal(codec.compound([msgpack.packb([*ping, *range(9)])]), None)
    assert _decode_or_reason(too_many, None) == "schema"
    essential = codec.seal(codec.compound([msgpack.packb([63, 1])]), None)
    assert _decode_or_reason(essential, None) == "unknown_type"
    body = msgpack.packb(["a", False, [["n", "h", 1, 2, 0, b"", "new"]], [["n", 3, b"x", 9]],
                          "extra"], use_bin_type=True)
    assert codec.decode_stream(codec.seal(body, None), None, STREAM_MAX) == (
        "a", False, [["n", "h", 1, 2, 0, b""]], [["n", 3, b"x"]])


def test_short_ciphertext_is_auth_failure() -> None:
    ring = Keyring([KEY_A])
    assert _decode_or_reason(b"\x01\x01" + bytes(27), ring) == "auth"


def test_bool_and_float_are_not_integers() -> None:
    for bad in (_pack([codec.NACK, True]), _pack([codec.NACK, 1.0]),
                _pack([codec.PING, -1, "", "b"]),
                _pack([codec.ALIVE, 0, "b", "h", 0, b""]),
                _pack([codec.ALIVE, 0, "b", "h", 65536, b""]),
                _pack([codec.ALIVE, -1, "b", "h", 1, b""]),
                _pack([codec.SUSPECT, 0, "", "b"]),
                _pack([codec.STATE, "b", 0, "text, not bytes"])):
        assert _decode_or_reason(codec.seal(codec.compound([bad]), None), None) == "schema"


def test_every_drop_reason_is_exported_from_the_start() -> None:
    # Metrics expose stats.dropped as-is: every label a drop can be counted under must exist
    # (at 0) before the first drop, for datagrams and for push-pull streams alike.
    dropped = Swim(Config.lan(), SELF, ADDRS[0], now=0.0).stats.dropped
    expected = {*codec.DROP_REASONS, "misdirected", "meta",
                *(f"stream_{r}" for r in codec.DROP_REASONS)}
    assert set(dropped) == expected and not any(dropped.values())


# --- the state machine -----------------------------------------------------------------------


def operations(keyring: Keyring | None) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.one_of(
        st.tuples(st.just("packet"), st.lists(messages(), min_size=1, max_size=4), addrs),
        st.tuples(st.just("packet"), st.lists(messages(), min_size=1, max_size=4), addrs),
        st.tuples(st.just("raw"), st.one_of(st.binary(max_size=64), mutated(packets(keyring)),
                                            packets(None), packets(Keyring([KEY_B]))), addrs),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
        st.tuples(st.just("stream"), st.one_of(streams(keyring), mutated(streams(keyring))),
                  st.booleans()),
        st.tuples(st.just("publish"), blobs),
        st.tuples(st.just("meta"), valid_metas),
        st.tuples(st.just("leave"), st.just(None)),
    )


class Checker:
    """Drives one ``Swim`` and asserts its invariants after every step."""

    def __init__(self, keyring: Keyring | None = None, cfg: Config | None = None,
                 mesh: str = "") -> None:
        self.keyring = keyring
        self.cfg = cfg or Config.lan(push_pull_interval=20.0, reap_time=30.0)
        self.swim = Swim(self.cfg, SELF, ADDRS[0],
                         NodeMeta.build(tags={"mesh": mesh}) if mesh else None, now=0.0,
                         rng=random.Random(7), keyring=keyring)
        self.now = 0.0
        self.last_tick = 0.0
        self.incarnation = self.swim.incarnation
        self.rejected = 0
        self.skipped = 0
        self.seqs_sent: list[int] = []
        """Sequence numbers of pings we sent, so generated acks and nacks can match them."""

    def dropped_total(self) -> int:
        return sum(self.swim.stats.dropped.values())

    def receive(self, data: bytes, addr: tuple[str, int]) -> None:
        s = self.swim
        expected = _decode_or_reason(data, self.keyring)
        if not isinstance(expected, str) and s.mesh and any(
                m[0] == codec.MESH and m[1] != codec.mesh_digest(s.mesh) for m in expected):
            expected = "other_mesh"  # a datagram of another mesh: dropped whole
        if not isinstance(expected, str) and _hits_known_overflow(expected):
            self.skipped += 1
            return
        before = dict(s.stats.dropped)
        members_before = s.members()
        s.receive(data, addr, self.now)
        after = s.stats.dropped
        if isinstance(expected, str):
            # Every rejected packet is counted once, under its reason, and changes nothing.
            self.rejected += 1
            assert after[expected] == before[expected] + 1
            assert sum(after.values()) == sum(before.values()) + 1
            assert s.members() == members_before
            assert s.datagrams_to_send() == []  # check() drained the earlier ones
        else:
            changed = {k for k in after if after[k] != before.get(k, 0)}
            assert changed <= {"misdirected", "meta", "other_mesh"}

    def stream(self, data: bytes, as_reply: bool) -> None:
        s = self.swim
        expected = _decode_stream_or_reason(data, self.keyring)
        if not isinstance(expected, str) and self._of_other_mesh(expected[0], expected[2]):
            expected = "other_mesh"  # its sender's own record names another mesh
        if not isinstance(expected, str) and _hits_known_overflow([], expected[2], expected[3]):
            self.skipped += 1
            return
        before = self.dropped_total()
        if as_reply:
            req = s.streams_to_open()
            ok = s.stream_reply(data, req[0] if req else StreamRequest(ADDRS[1], b"", False),
                                self.now)
            assert ok is not isinstance(expected, str)
        else:
            reply = s.handle_stream(data, ADDRS[1], self.now)
            assert (reply is None) is isinstance(expected, str)
            if reply is not None:
                src, join, nodes, _ = codec.decode_stream(reply, self.keyring, STREAM_MAX)
                assert src == SELF and join is False
                assert sorted(r[0] for r in nodes) == [m.name for m in s.members()]
        if isinstance(expected, str):
            self.rejected += 1
            assert s.stats.dropped["stream_" + expected] >= 1
            assert self.dropped_total() == before + 1

    def _of_other_mesh(self, source: str, nodes: list[Any]) -> bool:
        own = next((r for r in nodes if r[0] == source), None)
        try:
            theirs = NodeMeta.decode(own[5]).mesh if own is not None else ""
        except MetaError:
            return False
        return bool(self.swim.mesh and theirs and theirs != self.swim.mesh)

    def step(self, op: tuple[Any, ...]) -> None:
        s = self.swim
        kind = op[0]
        if kind == "packet":
            self.receive(codec.seal(codec.compound(op[1]), self.keyring), op[2])
        elif kind == "raw":
            self.receive(op[1], op[2])
        elif kind == "tick":
            self.now += op[1]
            s.tick(self.now)
            self.last_tick = self.now
        elif kind == "stream":
            self.stream(op[1], op[2])
        elif kind == "publish":
            s.publish_state(op[1], self.now)
        elif kind == "meta":
            try:
                meta = NodeMeta.decode(op[1])
            except MetaError:
                meta = None
            # Not after leave: that un-leaves us at peers (protocol bug, xfail in
            # test_protocol.py) without breaking any invariant checked here.
            if meta is not None and len(op[1]) <= self.cfg.max_meta_bytes and not s.leaving:
                s.update_meta(meta, self.now)
        elif kind == "leave":
            s.leave(self.now)
        self.check()

    def check(self) -> None:
        s = self.swim
        me = s.local
        assert me.name == SELF and me.addr == ADDRS[0]
        assert me.status == (Status.LEFT if s.leaving else Status.ALIVE)
        assert s.incarnation >= self.incarnation
        assert s.incarnation <= codec.MAX_U64
        self.incarnation = s.incarnation
        members = s.members()
        assert len({m.name for m in members}) == len(members)
        assert s.num_live() == sum(1 for m in members if m.status <= Status.SUSPECT)
        # After tick(now), next_timer() may equal now (a second gossip round is due at once
        # after a late tick: minor protocol bug, xfail in test_protocol.py), never earlier.
        t = s.next_timer()
        assert math.isfinite(t) and t >= self.last_tick
        assert s.broadcast_queue_depth() <= 4096
        assert self.dropped_total() >= self.rejected
        for ev in s.events():
            assert ev.at <= self.now
        for data, _addr in s.datagrams_to_send():
            # Whatever we send, any peer (with our keys) can decode.
            msgs = _decode_or_reason(data, self.keyring)
            assert not isinstance(msgs, str)
            assert len(data) <= self.cfg.packet_size
            # Our mesh message, once and first, or none: none to a peer that may be older.
            tagged = [i for i, m in enumerate(msgs) if m[0] == codec.MESH]
            assert tagged in ([], [0]) and (not tagged or msgs[0][1] == codec.mesh_digest(
                s.mesh))
            if not s.mesh:
                assert not tagged
            self.seqs_sent += [m[1] for m in msgs if m[0] in (codec.PING, codec.INDIRECT_PING)]
            del self.seqs_sent[:-32]
        for req in s.streams_to_open():
            assert not isinstance(_decode_stream_or_reason(req.payload, self.keyring), str)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(operations(None), min_size=10, max_size=120))
def test_swim_survives_random_input(steps: list[tuple[Any, ...]]) -> None:
    c = Checker()
    for op in steps:
        c.step(op)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(operations(Keyring([KEY_A])), min_size=10, max_size=80))
def test_swim_with_keyring_survives_random_input(steps: list[tuple[Any, ...]]) -> None:
    c = Checker(keyring=Keyring([KEY_A]))
    for op in steps:
        c.step(op)


@pytest.mark.parametrize("keyed", [False, True])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_swim_with_a_mesh_id_survives_random_input(keyed: bool, data: st.DataObject) -> None:
    """Packets with our mesh's message, another's and none; members of both meshes."""
    ring = Keyring([KEY_A]) if keyed else None
    c = Checker(keyring=ring, mesh=MESH_OURS)
    for op in data.draw(st.lists(operations(ring), min_size=10, max_size=100)):
        c.step(op)


# --- the mesh message ------------------------------------------------------------------------


@FAST
@given(st.text(min_size=1, max_size=256), st.lists(messages(), max_size=4), st.booleans())
def test_the_mesh_message_round_trips(mesh_id: str, rest: list[bytes], encrypted: bool) -> None:
    digest = codec.mesh_digest(mesh_id)
    assert len(digest) == codec.MESH_DIGEST_BYTES and digest == codec.mesh_digest(mesh_id)
    msg = codec.mesh(digest)
    assert len(msg) == 12  # the fixed cost per datagram, whatever the id's length
    ring = Keyring([KEY_A]) if encrypted else None
    packet = codec.seal(codec.compound([msg, *rest]), ring)
    decoded, skipped = codec.decode_compound(packet, ring)
    assert decoded[0] == [codec.MESH, digest] and skipped == 0
    assert decoded[1:] == [msgpack.unpackb(m, raw=False) for m in rest]


malformed_mesh = st.one_of(
    st.just([codec.MESH]),
    st.builds(lambda b: [codec.MESH, b], st.binary(max_size=40).filter(
        lambda b: len(b) != codec.MESH_DIGEST_BYTES)),
    st.builds(lambda v: [codec.MESH, v], msgpack_values.filter(lambda v: type(v) is not bytes)),
    st.builds(lambda d, n: [codec.MESH, d, *range(n)], digests,
              st.integers(codec.MAX_EXTRA_FIELDS + 1, codec.MAX_EXTRA_FIELDS + 4)),
)


@FAST
@given(malformed_mesh, st.lists(messages(), max_size=3), st.booleans(), st.booleans())
def test_a_malformed_mesh_message_is_counted_and_its_packet_dropped(
        bad: list[Any], rest: list[bytes], first: bool, meshed: bool) -> None:
    body = [_pack(bad), *rest] if first else [*rest, _pack(bad)]
    packet = codec.seal(codec.compound(body), None)
    assert _decode_or_reason(packet, None) == "schema"
    swim = Swim(Config.lan(), SELF, ADDRS[0],
                NodeMeta.build(tags={"mesh": MESH_OURS}) if meshed else None, now=0.0)
    swim.datagrams_to_send()
    members = swim.members()
    swim.receive(packet, ADDRS[1], 0.0)
    assert swim.stats.dropped["schema"] == 1 and sum(swim.stats.dropped.values()) == 1
    assert swim.members() == members and swim.datagrams_to_send() == [] and not swim.events()


def test_a_mesh_message_with_fields_added_later_is_read() -> None:
    digest = codec.mesh_digest(MESH_OURS)
    packet = codec.seal(codec.compound([_pack([codec.MESH, digest, "later", 1])]), None)
    assert codec.decode_packet(packet, None) == [[codec.MESH, digest]]


# --- long random runs ------------------------------------------------------------------------
#
# Hypothesis cannot build hundreds of structured operations in one example (its buffer is a few
# kilobytes), so these runs let it pick a seed and a mix, and a ``random.Random`` build the
# sequence: hundreds of valid messages with random field values, replies matching the pings the
# node sent, corrupted packets, streams and ticks.


class RandomPeer:
    """Builds random inputs for one node under test from ``rng``."""

    def __init__(self, rng: random.Random, checker: Checker) -> None:
        self.rng = rng
        self.c = checker
        self.extra_names = [self.text(1, codec.MAX_NAME) for _ in range(3)]

    def text(self, lo: int, hi: int) -> str:
        alphabet = "abcdefgh-.:_0123456789\u00e9\u4e2d\U0001f600"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(lo, hi)))

    def name(self) -> str:
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(POOL)
        if r < 0.95:
            return self.rng.choice(self.extra_names)
        return self.text(1, codec.MAX_NAME)

    def u64(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.randint(0, 6)
        if r < 0.8:
            return codec.MAX_U64 - self.rng.randint(0, 2)
        return self.rng.randint(0, codec.MAX_U64)

    def about(self, name: str) -> int:
        return _self_safe(name, self.u64())

    def seq(self) -> int:
        if self.c.seqs_sent and self.rng.random() < 0.7:
            return self.rng.choice(self.c.seqs_sent)
        return self.u64()

    def addr(self) -> tuple[str, int]:
        if self.rng.random() < 0.85:
            return self.rng.choice(ADDRS)
        return (self.text(1, codec.MAX_HOST), self.rng.randint(1, 65535))

    def meta(self) -> bytes:
        r = self.rng.random()
        if r < 0.6:
            return NodeMeta().encode()
        if r < 0.7:
            mesh = self.rng.choice([MESH_OURS, MESH_THEIRS])
            return NodeMeta.build(tags={"mesh": mesh}).encode()
        if r < 0.9:
            return NodeMeta.build(roles=self.rng.sample(ROLES, self.rng.randint(0, 2)),
                                  zone=self.text(0, 6), ports={"p": self.rng.randint(0, 65535)},
                                  tags={self.text(1, 4): self.text(0, 8)}).encode()
        return self.rng.randbytes(self.rng.randint(0, 40))

    def message(self) -> bytes:
        kind = self.rng.choice(list(codec.MESSAGE_NAMES))
        rng = self.rng
        if kind == codec.PING:
            return codec.ping(self.seq(), rng.choice(["", SELF, self.name()]), self.name())
        if kind == codec.INDIRECT_PING:
            host, port = self.addr()
            return codec.indirect_ping(self.seq(), self.name(), host, port, rng.random() < 0.5,
                                       self.name())
        if kind == codec.ACK:
            return codec.ack(self.seq(), rng.randbytes(rng.randint(0, 16)))
        if kind == codec.NACK:
            return codec.nack(self.seq())
        if kind == codec.MESH:
            return codec.mesh(codec.mesh_digest(rng.choice([MESH_OURS, MESH_THEIRS]))
                              if rng.random() < 0.9 else rng.randbytes(codec.MESH_DIGEST_BYTES))
        name = self.name()
        if kind == codec.ALIVE:
            host, port = self.addr()
            return codec.alive(self.about(name), name, host, port, self.meta())
        if kind == codec.SUSPECT:
            return codec.suspect(self.about(name), name, self.name())
        if kind == codec.DEAD:
            return codec.dead(self.about(name), name, self.name())
        if kind == codec.STATE_DELTA:
            return codec.state_delta(name, self.about(name), rng.randbytes(rng.randint(0, 64)))
        return codec.state(name, self.about(name), rng.randbytes(rng.randint(0, 64)))

    def packet(self) -> bytes:
        msgs = [self.message() for _ in range(self.rng.randint(1, 5))]
        return codec.seal(codec.compound(msgs), self.c.keyring)

    def corrupt(self, data: bytes) -> bytes:
        rng = self.rng
        b = bytearray(data)
        how = rng.randrange(4)
        if how == 0:
            del b[rng.randint(0, len(b)):]
        elif how == 1:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == 2:
            b += rng.randbytes(rng.randint(1, 20))
        else:
            return rng.randbytes(rng.randint(0, 80))
        return bytes(b)

    def stream(self) -> bytes:
        nodes = []
        for _ in range(self.rng.randint(0, 6)):
            name = self.name()
            host, port = self.addr()
            nodes.append([name, host, port, self.about(name), self.rng.randint(0, 3),
                          self.meta()])
        states = []
        for _ in range(self.rng.randint(0, 3)):
            name = self.name()
            states.append([name, self.about(name), self.rng.randbytes(10)])
        return codec.encode_stream(self.name(), self.rng.random() < 0.3, nodes, states,
                                   self.c.keyring)

    def op(self, weights: list[float]) -> tuple[Any, ...]:
        rng = self.rng
        kind = rng.choices(["packet", "raw", "tick", "stream", "publish", "meta", "leave"],
                           weights)[0]
        if kind == "packet":
            return ("raw", self.packet(), self.addr())
        if kind == "raw":
            return ("raw", self.corrupt(self.packet()), self.addr())
        if kind == "tick":
            return ("tick", rng.choice([0.0, 0.05, 0.2, 0.5, 1.0, 5.0, 40.0]) * rng.random())
        if kind == "stream":
            data = self.stream()
            return ("stream", self.corrupt(data) if rng.random() < 0.3 else data,
                    rng.random() < 0.5)
        if kind == "publish":
            return ("publish", rng.randbytes(rng.randint(0, 100)))
        if kind == "meta":
            return ("meta", self.meta())
        return ("leave", None)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), keyed=st.booleans(),
       weights=st.lists(st.floats(0.0, 1.0), min_size=7, max_size=7).filter(
           lambda w: sum(w[:4]) > 0.5),
       leave_late=st.booleans(), meshed=st.booleans())
def test_swim_long_random_runs(seed: int, keyed: bool, weights: list[float],
                               leave_late: bool, meshed: bool) -> None:
    rng = random.Random(seed)
    c = Checker(keyring=Keyring([KEY_A]) if keyed else None, mesh=MESH_OURS if meshed else "")
    peer = RandomPeer(rng, c)
    weights[6] = 0.0 if leave_late else weights[6] * 0.01  # leave is final: keep it rare
    for i in range(600):
        c.step(peer.op(weights))
        if leave_late and i == 500:
            c.step(("leave", None))
    assert c.dropped_total() >= c.rejected
