"""Token buckets (meshd/score/budget.py): the hedge budget keeps hedges within their share of
requests, and a tenant's rate bucket grants ``burst + rate * T`` over T seconds, says exactly
when to retry, and mints nothing from a clock that goes back.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshd.score.budget import HedgeBudget, RateBucket

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- HedgeBudget ----------------------------------------------------------------------------


def test_hedge_budget_starts_with_one_token_not_a_burst() -> None:
    b = HedgeBudget()
    assert (b.ratio, b.burst, b.tokens, b.granted, b.refused) == (0.05, 10.0, 1.0, 0, 0)
    assert b.try_spend()
    assert not b.try_spend()
    assert (b.granted, b.refused) == (1, 1)
    assert HedgeBudget(burst=0.5).tokens == 0.5


def test_hedges_stay_within_ratio_of_requests() -> None:
    b = HedgeBudget(ratio=0.05, burst=10.0)
    for _ in range(10_000):
        b.on_request()
        b.try_spend()
    assert b.granted <= 0.05 * 10_000 + 1 + 1
    assert b.granted == 501  # exactly: one to start, then one per 20 requests
    assert b.granted + b.refused == 10_000


def test_twenty_requests_at_five_percent_earn_exactly_one_hedge() -> None:
    b = HedgeBudget(ratio=0.05)
    assert b.try_spend()
    for _ in range(19):
        b.on_request()
    assert not b.try_spend()
    b.on_request()
    assert b.tokens == 1.0 and b.try_spend()


def test_tokens_are_capped_at_burst() -> None:
    b = HedgeBudget(ratio=0.05, burst=10.0)
    for _ in range(100_000):
        b.on_request()
    assert b.tokens == 10.0
    assert sum(b.try_spend() for _ in range(20)) == 10


def test_zero_ratio_disables_hedging() -> None:
    b = HedgeBudget(ratio=0.0)
    for _ in range(1000):
        b.on_request()
    assert sum(b.try_spend() for _ in range(10)) == 0


def test_charge_pays_for_offered_hedges_even_into_debt() -> None:
    b = HedgeBudget(ratio=0.05)
    assert b.tokens >= 1
    b.charge()
    b.charge()  # two offers taken up at once
    assert b.tokens == -1.0 and b.granted == 2
    for _ in range(39):
        b.on_request()
    assert not b.try_spend()  # the debt is paid first
    b.on_request()
    assert b.try_spend() and b.tokens == 0.0


@pytest.mark.parametrize("ratio, burst", [(-0.1, 10.0), (math.nan, 10.0), (math.inf, 10.0),
                                          (1e-9, 10.0), (0.05, -1.0), (0.05, math.inf)])
def test_hedge_budget_rejects_nonsense(ratio: float, burst: float) -> None:
    with pytest.raises(ValueError):
        HedgeBudget(ratio, burst)


@FAST
@given(st.floats(min_value=1e-6, max_value=2.0) | st.just(0.0),
       st.floats(min_value=0.0, max_value=50.0), st.lists(st.booleans(), max_size=2000))
def test_property_hedges_never_exceed_earned_tokens(
        ratio: float, burst: float, seq: list[bool]) -> None:
    b = HedgeBudget(ratio, burst)
    requests = 0
    for is_request in seq:
        if is_request:
            b.on_request()
            requests += 1
        else:
            b.try_spend()
        assert 0.0 <= b.tokens <= burst + 1e-6
        # Earned tokens are counted in millionths: ratio rounds to the nearest one.
        assert b.granted <= min(burst, 1.0) + requests * (ratio + 5e-7) + 1e-9
    assert b.granted + b.refused == len(seq) - requests


# --- RateBucket -----------------------------------------------------------------------------


def test_rate_bucket_starts_full() -> None:
    r = RateBucket(rate=10.0, burst=5.0, now=100.0)
    assert sum(r.try_take(100.0) for _ in range(10)) == 5
    assert not r.try_take(100.05)
    assert r.try_take(100.1)


@pytest.mark.parametrize("rate, burst, seconds, step", [
    (100.0, 10.0, 5.0, 0.001), (3.0, 2.0, 60.0, 0.01), (1000.0, 50.0, 2.0, 0.0001),
    (0.5, 2.0, 100.0, 0.25),
])
def test_hammered_bucket_grants_rate_times_t_plus_burst(
        rate: float, burst: float, seconds: float, step: float) -> None:
    t0 = 12345.678
    r = RateBucket(rate, burst, t0)
    granted = 0
    for i in range(round(seconds / step) + 1):
        now = t0 + i * step
        while r.try_take(now):
            granted += 1
    assert abs(granted - (rate * seconds + burst)) <= 1


def test_take_n() -> None:
    r = RateBucket(rate=1.0, burst=10.0, now=0.0)
    assert r.try_take(0.0, 7.5)
    assert not r.try_take(0.0, 3.0)  # all or nothing
    assert r.try_take(0.0, 2.5)
    assert not r.try_take(0.0, 0.5)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            r.try_take(0.0, bad)
        with pytest.raises(ValueError):
            r.retry_after(0.0, bad)


def test_retry_after_is_exact() -> None:
    r = RateBucket(rate=4.0, burst=8.0, now=10.0)
    assert r.retry_after(10.0) == 0.0
    assert r.try_take(10.0, 8.0)
    assert r.retry_after(10.0) == 0.25
    assert r.retry_after(10.0, 3.0) == 0.75
    assert r.retry_after(10.1, 3.0) == pytest.approx(0.65)
    assert not r.try_take(10.0 + 0.75 - 1e-9, 3.0)
    assert r.try_take(10.0 + 0.75, 3.0)
    assert r.retry_after(10.75) == 0.25


def test_retry_after_never() -> None:
    r = RateBucket(rate=4.0, burst=8.0, now=0.0)
    assert r.retry_after(0.0, 9.0) == math.inf
    stuck = RateBucket(rate=0.0, burst=1.0, now=0.0)
    assert stuck.try_take(0.0)
    assert stuck.retry_after(1e9) == math.inf
    assert not stuck.try_take(1e9)


def test_retry_after_changes_nothing() -> None:
    r = RateBucket(rate=2.0, burst=2.0, now=0.0)
    r.try_take(0.0, 2.0)
    r.retry_after(0.4)
    r.retry_after(0.1)
    assert not r.try_take(0.4)
    assert r.try_take(0.5)


def test_clock_going_back_grants_nothing_extra() -> None:
    r = RateBucket(rate=10.0, burst=1.0, now=100.0)
    assert r.try_take(100.0)
    assert not r.try_take(50.0)  # back 50 s: no time passed
    assert not r.try_take(99.0)
    assert not r.try_take(100.0)  # the same instant again: still none
    assert r.retry_after(50.0) == pytest.approx(50.1)  # counts from the caller's now
    assert not r.try_take(100.05)
    assert r.try_take(100.1)


def test_reconfigure_keeps_the_fill() -> None:
    r = RateBucket(rate=1.0, burst=10.0, now=0.0)
    assert r.try_take(0.0, 4.0)
    r.reconfigure(rate=100.0, burst=20.0, now=1.0)  # 6 + 1 earned at the old rate
    assert (r.rate, r.burst) == (100.0, 20.0)
    assert r.try_take(1.0, 7.0) and not r.try_take(1.0, 0.5)
    assert r.try_take(1.1, 10.0)
    r.reconfigure(rate=1.0, burst=3.0, now=10.0)  # full (20), capped at the new burst
    assert r.try_take(10.0, 3.0) and not r.try_take(10.0, 0.1)


@pytest.mark.parametrize("rate, burst", [(-1.0, 1.0), (math.nan, 1.0), (math.inf, 1.0),
                                         (1.0, 0.0), (1.0, math.inf), (1.0, math.nan)])
def test_rate_bucket_rejects_nonsense(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        RateBucket(rate, burst, 0.0)
    r = RateBucket(1.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        r.reconfigure(rate, burst, 0.0)
    with pytest.raises(ValueError):
        RateBucket(1.0, 1.0, math.nan)


steps = st.tuples(
    st.floats(min_value=-5.0, max_value=5.0) | st.sampled_from([0.0, 1e-9, -1e-9, 1e3]),
    st.floats(min_value=0.01, max_value=5.0),
)


@FAST
@given(st.floats(min_value=0.0, max_value=1e4), st.floats(min_value=0.1, max_value=100.0),
       st.floats(min_value=-1e3, max_value=1e7), st.lists(steps, max_size=200))
def test_property_grants_bounded_by_latest_time(
        rate: float, burst: float, t0: float, seq: list[tuple[float, float]]) -> None:
    """Whatever the clock does, grants never exceed ``burst + rate * (latest now - t0)``."""
    r = RateBucket(rate, burst, t0)
    now, latest, granted = t0, t0, 0.0
    for dt, n in seq:
        now += dt
        latest = max(latest, now)
        if r.try_take(now, n):
            granted += n
        # The bound is exact up to float rounding (of ``granted`` and of ``now`` itself).
        limit = burst + rate * (latest - t0) + 1e-9
        assert granted <= limit * (1 + 1e-12) + rate * 1e-15 * abs(latest)


@FAST
@given(st.floats(min_value=1e-3, max_value=1e6), st.floats(min_value=0.01, max_value=1e3),
       st.floats(min_value=-1e3, max_value=1e9), st.floats(min_value=0.0, max_value=1.0),
       st.floats(min_value=-10.0, max_value=10.0), st.floats(min_value=1e-6, max_value=1.0))
def test_property_retry_after_is_exact(
        rate: float, burst: float, t0: float, drain: float, dt: float, frac: float) -> None:
    """After ``retry_after(now, n)`` seconds ``n`` tokens are there, and not much earlier."""
    r = RateBucket(rate, burst, t0)
    r.try_take(t0, max(burst * drain, 1e-9))
    now = t0 + dt
    n = burst * frac
    wait = r.retry_after(now, n)
    assert wait >= 0.0 and math.isfinite(wait)
    margin = 1e-3 * wait
    if margin * rate > 1e-7 and margin > 1e-12 * abs(now):
        # Noticeably earlier is too early (``margin`` tokens' worth more than the 1e-9 slack,
        # and more than the rounding of ``now`` itself).
        early = RateBucket(rate, burst, t0)
        early.try_take(t0, max(burst * drain, 1e-9))
        assert not early.try_take(now + wait - margin, n)
    assert r.try_take(now + wait, n)
