"""Lifeguard dynamic suspicion timeout: memberlist's vectors and the ``Suspicion`` timer."""

import math

import pytest

from gossip.suspicion import Suspicion, remaining_suspicion_time, suspicion_timeout

# --- suspicion_timeout ---------------------------------------------------------------------


@pytest.mark.parametrize(("n", "expected_ms"), [
    # memberlist util_test.go TestSuspicionTimeout: suspicionTimeout(3, n, 1s) / 3.
    (5, 1000), (10, 1000), (50, 1698), (100, 2000), (500, 2698), (1000, 3000),
])
def test_suspicion_timeout_memberlist_vectors(n: int, expected_ms: int) -> None:
    assert suspicion_timeout(3, n, 1.0) == pytest.approx(3 * expected_ms / 1000, abs=1e-9)


@pytest.mark.parametrize("n", range(0, 11))
def test_suspicion_timeout_small_clusters_use_node_scale_one(n: int) -> None:
    # log10(N) <= 1 for N <= 10 (and N = 0 is treated as 1): just mult * interval.
    assert suspicion_timeout(4, n, 1.0) == 4.0


@pytest.mark.parametrize(("mult", "n", "interval", "expected"), [
    (4, 1000, 1.0, 12.0),      # LAN: 4 * log10(1000) * 1 s
    (4, 100, 1.0, 8.0),
    (4, 10_000, 1.0, 16.0),
    (4, 50, 1.0, 6.792),       # 4 * 1.698 (scale truncated to thousandths, as memberlist)
    (6, 50, 5.0, 50.94),       # WAN: 6 * 1.698 * 5 s
    (6, 1000, 5.0, 90.0),
    (3, 1000, 1.0, 9.0),       # local profile
    (4, 1000, 0.5, 6.0),
])
def test_suspicion_timeout_values(mult: int, n: int, interval: float, expected: float) -> None:
    assert suspicion_timeout(mult, n, interval) == pytest.approx(expected, abs=1e-9)


def test_suspicion_timeout_is_monotonic_in_cluster_size() -> None:
    values = [suspicion_timeout(4, n, 1.0) for n in range(1, 5000, 7)]
    assert values == sorted(values)


# --- remaining_suspicion_time --------------------------------------------------------------


@pytest.mark.parametrize(("n", "k", "elapsed", "expected"), [
    # memberlist suspicion_test.go TestSuspicion_remainingSuspicionTime (min 2 s, max 30 s).
    (0, 3, 0.0, 30.0),
    (1, 3, 2.0, 14.0),
    (2, 3, 3.0, 4.810),
    (3, 3, 4.0, -2.0),
    (4, 3, 5.0, -3.0),
    (5, 3, 10.0, -8.0),
])
def test_remaining_suspicion_time_memberlist_table(n: int, k: int, elapsed: float,
                                                   expected: float) -> None:
    got = remaining_suspicion_time(n, k, elapsed, 2.0, 30.0)
    assert got == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("n", "k", "elapsed"), [
    (0, 3, 0.0), (1, 3, 2.0), (2, 3, 3.0), (3, 3, 4.0), (4, 3, 5.0), (5, 3, 10.0),
    (1, 2, 0.5), (2, 5, 7.25), (1, 1, 0.0), (7, 9, 1.0),
])
def test_remaining_suspicion_time_matches_formula(n: int, k: int, elapsed: float) -> None:
    lo, hi = 2.0, 30.0
    frac = math.log(n + 1) / math.log(k + 1)
    timeout = math.floor(1000 * (hi - frac * (hi - lo))) / 1000
    assert remaining_suspicion_time(n, k, elapsed, lo, hi) == pytest.approx(
        max(timeout, lo) - elapsed, abs=1e-9)


def test_remaining_suspicion_time_never_below_min() -> None:
    for n in range(0, 20):
        assert remaining_suspicion_time(n, 3, 0.0, 2.0, 30.0) >= 2.0


def test_remaining_suspicion_time_k_zero_is_min() -> None:
    # memberlist would divide by log(1) = 0; with no confirmations expected the minimum applies.
    assert remaining_suspicion_time(0, 0, 0.0, 2.0, 30.0) == 2.0
    assert remaining_suspicion_time(3, 0, 1.5, 2.0, 30.0) == pytest.approx(0.5)


# --- Suspicion -----------------------------------------------------------------------------

K, MIN, MAX = 3, 0.5, 2.0


@pytest.mark.parametrize(("confirmations", "expected_n", "expected_timeout"), [
    # memberlist TestSuspicion_Timer (k=3, min 500 ms, max 2 s), with explicit time instead of
    # sleeps: (confirmer, is it new information?) pairs and the resulting total timeout.
    ([], 0, MAX),
    ([("me", False), ("foo", True)], 1, 1.25),
    ([("me", False), ("foo", True), ("foo", False), ("foo", False)], 1, 1.25),
    # memberlist's table says 810 ms, checked against wall-clock sleeps with a 25 ms fudge;
    # the formula gives floor(1000 * (2 - log(3)/log(4) * 1.5)) ms = 811 ms.
    ([("me", False), ("foo", True), ("bar", True)], 2, 0.811),
    ([("me", False), ("foo", True), ("bar", True), ("baz", True)], 3, MIN),
    ([("me", False), ("foo", True), ("bar", True), ("baz", True), ("zoo", False)], 3, MIN),
])
def test_suspicion_timer_memberlist_cases(confirmations: list[tuple[str, bool]],
                                          expected_n: int, expected_timeout: float) -> None:
    start = 100.0
    s = Suspicion("me", K, MIN, MAX, start)
    now = start
    for who, new_info in confirmations:
        now += 0.025
        assert s.confirm(who, now) is new_info, who
    assert s.confirmations == expected_n
    # The deadline is measured from the start, not from the last confirmation.
    assert s.deadline == pytest.approx(start + expected_timeout, abs=1e-9)


def test_confirm_dedups_and_ignores_the_accuser() -> None:
    s = Suspicion("a", 3, 2.0, 30.0, 0.0)
    assert s.confirm("a", 1.0) is False
    assert s.confirmations == 0 and s.deadline == 30.0
    assert s.confirm("b", 1.0) is True
    first = s.deadline
    assert s.confirm("b", 2.0) is False
    assert s.deadline == first and s.confirmations == 1


def test_confirm_is_capped_at_k() -> None:
    s = Suspicion("a", 2, 4.0, 24.0, 0.0)
    assert s.confirm("b", 1.0) and s.confirm("c", 1.0)
    assert s.deadline == pytest.approx(4.0)
    assert s.confirm("d", 1.0) is False
    assert s.confirmations == 2 and "d" not in s.confirmers


def test_deadline_only_moves_earlier() -> None:
    s = Suspicion("a", 5, 2.0, 30.0, 10.0)
    deadlines = [s.deadline]
    for i, who in enumerate("bcdef"):
        assert s.confirm(who, 10.0 + 0.1 * i)
        deadlines.append(s.deadline)
    assert deadlines == sorted(deadlines, reverse=True)
    assert len(set(deadlines)) == len(deadlines)
    assert deadlines[-1] == pytest.approx(12.0)


def test_late_confirmation_fires_now_not_in_the_past() -> None:
    # memberlist TestSuspicion_Timer_Immediate: remaining time underflows -> fire immediately.
    s = Suspicion("me", 1, 0.1, 30.0, 0.0)
    assert s.confirm("foo", 0.2)
    assert s.deadline == pytest.approx(0.2)


def test_k_zero_uses_min_and_takes_no_confirmations() -> None:
    s = Suspicion("a", 0, 2.0, 30.0, 5.0)
    assert s.deadline == 7.0
    assert s.confirm("b", 6.0) is False
    assert s.deadline == 7.0 and s.confirmations == 0


def test_max_equal_min_is_plain_swim() -> None:
    s = Suspicion("a", 3, 4.0, 4.0, 0.0)
    assert s.deadline == 4.0
    assert s.confirm("b", 1.0)
    assert s.deadline == pytest.approx(4.0)
