"""Lifeguard local health awareness (memberlist's awareness_test.go)."""

import pytest

from gossip.awareness import Awareness


def test_memberlist_delta_table() -> None:
    # memberlist TestAwareness: max 8, each delta applied in turn, with the score after it.
    cases = [(0, 0), (-1, 0), (-10, 0), (1, 1), (-1, 0), (10, 7), (-1, 6), (-1, 5), (-1, 4),
             (-1, 3), (-1, 2), (-1, 1), (-1, 0), (-1, 0)]
    a = Awareness(8)
    for delta, score in cases:
        assert a.apply_delta(delta) == score
        assert a.score == score
        assert a.scale(1.0) == pytest.approx(score + 1)


def test_starts_healthy() -> None:
    a = Awareness(8)
    assert a.score == 0
    assert a.scale(0.5) == 0.5


def test_scale_stretches_by_score_plus_one() -> None:
    a = Awareness(8)
    a.apply_delta(3)
    assert a.scale(1.0) == 4.0
    assert a.scale(0.25) == 1.0
    a.apply_delta(100)
    assert a.score == 7
    assert a.scale(1.0) == 8.0  # "probe interval backs off to 8 seconds"


def test_max_multiplier_one_disables() -> None:
    a = Awareness(1)
    for delta in (1, 5, -1, 3):
        assert a.apply_delta(delta) == 0
    assert a.scale(1.0) == 1.0


def test_score_stays_in_range_for_any_deltas() -> None:
    a = Awareness(4)
    for delta in (2, 2, 2, -7, 1, -1, 3, 3, -100, 100):
        score = a.apply_delta(delta)
        assert 0 <= score <= 3
