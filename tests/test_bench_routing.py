"""The routing bench's yardsticks: the clairvoyant router its hedging bar is read against,
the schedule of pauses every case shares, and the recovery clock."""

from __future__ import annotations

import math

import pytest

from bench.routing import arrivals, clairvoyant, detecting, pause_schedule, recovery
from bench.table import distribution

SERVICE = [0.005, 0.005, 0.010, 0.025]
CAPACITY = sum(1 / s for s in SERVICE)


def test_an_idle_fleet_serves_each_request_on_the_fastest_replica_at_once() -> None:
    times = arrivals(3, [(200.0, 1.0)])
    out = distribution(clairvoyant(SERVICE, 1, [], times))
    assert out["n"] > 100
    assert out["min"] == pytest.approx(5.0) and out["max"] == pytest.approx(5.0)


def test_pauses_raise_the_tail_under_load_even_for_a_router_that_sees_them_coming() -> None:
    """At 80% load a pause of a 1x replica leaves the rest short of capacity: the queue it
    builds shows in the p99.9 however requests are routed, but no request waits it out."""
    times = arrivals(1, [(20.0, 0.8 * CAPACITY)])
    pauses = pause_schedule(1, 0.5, 20.0, 4.0, 0.25)
    calm = distribution(clairvoyant(SERVICE, 1, [], times))
    paused = distribution(clairvoyant(SERVICE, 1, pauses, times))
    assert paused["p999"] > 1.5 * calm["p999"]
    assert paused["max"] < 250.0


def test_a_pause_on_a_replica_the_rest_can_cover_barely_shows() -> None:
    times = arrivals(2, [(20.0, 0.5 * CAPACITY)])
    pauses = pause_schedule(2, 0.5, 20.0, 4.0, 0.25)
    calm = distribution(clairvoyant(SERVICE, 3, [], times))
    paused = distribution(clairvoyant(SERVICE, 3, pauses, times))
    assert paused["p999"] < 1.5 * calm["p999"]


def test_the_pause_schedule_is_the_same_for_a_seed_and_fits_the_run() -> None:
    a = pause_schedule(7, 0.5, 33.0, 4.0, 0.25)
    assert a == pause_schedule(7, 0.5, 33.0, 4.0, 0.25) != pause_schedule(8, 0.5, 33.0, 4.0,
                                                                          0.25)
    assert 5 <= len(a) <= 14
    assert all(0.5 <= s < e <= 33.0 and e - s == pytest.approx(0.25) for s, e in a)
    assert all(b[0] - a_[1] >= 4.0 * 0.5 for a_, b in zip(a, a[1:], strict=False))


def test_arrivals_follow_each_phase_rate() -> None:
    times = arrivals(5, [(10.0, 100.0), (10.0, 300.0)])
    first = sum(1 for t in times if t < 10.0)
    assert 900 < first < 1100 and 2700 < len(times) - first < 3300
    assert times == sorted(times) and times == arrivals(5, [(10.0, 100.0), (10.0, 300.0)])
    # a twin that differs in one phase has the same arrivals in the others
    twin = arrivals(5, [(10.0, 100.0), (10.0, 50.0)])
    assert [t for t in twin if t < 10.0] == [t for t in times if t < 10.0]


def test_recovery_is_when_the_tail_from_then_on_is_back_within_the_bar() -> None:
    """Against the twin run (the same arrivals, no overload): a burst both runs saw, however
    it lifts the tail, does not move the recovery."""
    fast = [(t / 100, 0.010, "OK", 0, 0.0) for t in range(0, 3000)]  # 30 s, 10 ms each
    burst = [(r[0], 0.05 if 20.0 <= r[0] < 20.5 else r[1], r[2], 0, 0.0) for r in fast]
    slow = [(r[0], 0.5 if 10.0 <= r[0] < 13.0 else r[1], r[2], 0, 0.0) for r in burst]
    assert recovery(fast, fast, 10.0, 30.0) == 0.0
    assert recovery(slow, burst, 10.0, 30.0) == pytest.approx(3.0)
    assert recovery(slow, fast, 10.0, 30.0) > 10.0  # against a calm twin the burst counts
    failing = [(r[0], r[1], "UNAVAILABLE" if r[0] >= 25 else "OK", 0, 0.0) for r in fast]
    assert math.isinf(recovery(failing, fast, 10.0, 30.0))
    never = [(r[0], 0.5 if r[0] >= 10.0 else r[1], r[2], 0, 0.0) for r in fast]
    assert math.isinf(recovery(never, fast, 10.0, 30.0))


def test_a_router_blind_to_pauses_trades_p99_for_p999_when_it_hedges() -> None:
    """Bar 3's yardstick: with no pause it routes as the clairvoyant one does; with pauses at
    80% load, not hedging leaves the requests caught in a pause to wait it out (p99.9 near
    the pause), and hedging them at detection cuts p99.9 but adds work where the others are
    already short of capacity, so p99 rises."""
    times = arrivals(4, [(30.0, 0.8 * CAPACITY)])
    assert detecting(SERVICE, 1, [], times, 0.02, True) == clairvoyant(SERVICE, 1, [], times)
    pauses = pause_schedule(4, 0.5, 30.0, 4.0, 0.25)
    blind = distribution(detecting(SERVICE, 1, pauses, times, 0.02, False))
    hedged = distribution(detecting(SERVICE, 1, pauses, times, 0.02, True))
    best = distribution(clairvoyant(SERVICE, 1, pauses, times))
    assert blind["p999"] > 200.0 and hedged["p999"] < 1.5 * best["p999"] < blind["p999"]
    assert hedged["p99"] > blind["p99"] >= best["p99"] * 0.9
