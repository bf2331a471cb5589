"""Members' node state reaches each layer from gossip's events alone: whole blobs, deltas
over them with patches, malformed input counted and dropped, and members forgotten."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.events import EventKind, MemberEvent
from gossip.state import Member, Status
from meshd.signals import nodestate
from meshd.signals.readers import NodeStateReaders, Reader

B = Member("b", ("127.0.0.2", 7946), 1, Status.ALIVE)


def event(kind: EventKind, state: bytes | None = None, delta: bytes | None = None
          ) -> MemberEvent:
    return MemberEvent(kind, B, 0.0, "", state, delta)


class Layers:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, object]] = []
        self.malformed = 0

    def readers(self) -> NodeStateReaders:
        def note(layer: str) -> object:
            return lambda n, data: self.seen.append((layer, n, data))

        return NodeStateReaders([
            Reader(note("coord"), section="coord", forget=lambda n: self.seen.append(
                ("forget", n, "coord"))),
            Reader(note("all")),
            Reader(note("sig"), section="sig", patch=note("sig-patch"))],  # type: ignore[arg-type]
            malformed=self.count)

    def count(self) -> None:
        self.malformed += 1


def test_a_state_reaches_every_reader_of_its_sections_then_its_held_delta() -> None:
    layers = Layers()
    readers = layers.readers()
    blob = nodestate.encode({"coord": b"c1", "sig": b"s1"})
    delta = nodestate.encode_delta({"coord": b"c2"}, {"sig": b"p1"})
    readers.event(event(EventKind.STATE, blob, delta))
    whole = {"coord": b"c1", "sig": b"s1"}
    after = {"coord": b"c2", "sig": b"s1"}
    assert layers.seen == [
        ("coord", "b", whole), ("all", "b", whole), ("sig", "b", whole),
        # the delta: only the coordinate changed whole; the signals section came as a patch
        ("coord", "b", after), ("all", "b", after), ("sig-patch", "b", b"p1")]


def test_a_delta_before_any_state_still_reaches_the_layers() -> None:
    layers = Layers()
    layers.readers().event(event(EventKind.DELTA, None, nodestate.encode_delta(
        {"sig": b"s2"}, {})))
    assert layers.seen == [("all", "b", {"sig": b"s2"}), ("sig", "b", {"sig": b"s2"})]


def test_a_section_gone_is_seen_by_the_readers_of_every_publication() -> None:
    layers = Layers()
    layers.readers().event(event(EventKind.STATE, nodestate.encode({})))
    assert layers.seen == [("all", "b", {})]


def test_malformed_blobs_and_deltas_are_counted_and_dropped() -> None:
    layers = Layers()
    readers = layers.readers()
    readers.event(event(EventKind.STATE, b"\xc1not msgpack"))
    readers.event(event(EventKind.DELTA, nodestate.encode({}), b"\x93\x01"))
    assert layers.malformed == 2 and layers.seen == []


def test_leaving_and_reaped_members_are_forgotten_and_other_events_ignored() -> None:
    layers = Layers()
    readers = layers.readers()
    for kind in EventKind:
        readers.event(event(kind))
    assert layers.seen == [("forget", "b", "coord")] * 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.binary(max_size=256))
def test_any_bytes_as_state_or_delta_never_raise(state: bytes, delta: bytes) -> None:
    layers = Layers()
    readers = layers.readers()
    readers.event(event(EventKind.STATE, state, delta))
    readers.event(event(EventKind.DELTA, state, delta))
