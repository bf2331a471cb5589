"""The ``want`` node-state section (scale from zero): what a node publishes, what the
controller reads, and that any bytes a peer sends are either a section or a WantsError."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.models.wants import HOLD, MAX_MODELS, Wants, WantsError


def test_a_want_is_published_as_an_age_and_read_back_on_the_reader_s_clock() -> None:
    here, there = Wants(), Wants()
    here.note("resnet", 1000.0)
    there.learn("n1", here.section(1002.5), now=50.0)  # an unrelated clock
    assert there.latest("resnet", 50.0) == 47.5
    assert there.latest("bert", 50.0) is None
    assert there.latest("resnet", 47.5 + HOLD) is None  # past the hold
    there.forget("n1")
    assert there.latest("resnet", 50.0) is None


def test_old_wants_leave_the_section_and_the_newest_win_past_the_bound() -> None:
    w = Wants(hold=10.0)
    for i in range(MAX_MODELS + 5):
        w.note(f"m{i}", float(i))
    raw = msgpack.unpackb(w.section(MAX_MODELS + 5.0))
    assert len(raw) <= MAX_MODELS and "m0" not in raw and f"m{MAX_MODELS + 4}" in raw
    assert msgpack.unpackb(w.section(1e6)) == {}


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.dictionaries(st.one_of(st.text(max_size=300), st.integers(-2**40, 2**40)),
                                 st.one_of(st.integers(-2**62, 2**62), st.floats(), st.text(),
                                           st.none(),
                                           st.booleans()), max_size=80).map(msgpack.packb)))
def test_any_bytes_are_a_section_or_a_clear_error(data: bytes) -> None:
    w = Wants()
    w.note("mine", 5.0)
    try:
        w.learn("peer", data, now=10.0)
    except WantsError as exc:
        assert str(exc)
        assert w.latest("mine", 10.0) == 5.0
        return
    raw = msgpack.unpackb(data, strict_map_key=False)
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in raw.items())
