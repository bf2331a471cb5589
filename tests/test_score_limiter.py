"""The adaptive concurrency limit (meshd/score/limiter.py): it grows while latency stays flat and
the limit is used, shrinks once latency rises past the tolerance or requests drop, and no input
(zero, huge, NaN, infinite or negative latencies, spurious releases) moves it out of bounds.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshd.score.limiter import AdaptiveLimit, LimiterConfig

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fill(lim: AdaptiveLimit) -> None:
    """Acquire until refused: the target is fully used."""
    while lim.try_acquire():
        pass


def saturated(lim: AdaptiveLimit, latency: float, samples: int) -> None:
    """``samples`` requests ending after ``latency`` seconds, the limit full each time."""
    for _ in range(samples):
        fill(lim)
        lim.release(latency, False, 0.0)


def test_defaults_are_documented_and_sane() -> None:
    cfg = LimiterConfig()
    assert (cfg.initial, cfg.min_limit, cfg.max_limit) == (20.0, 2.0, 1000.0)
    assert (cfg.smoothing, cfg.tolerance, cfg.backoff_ratio) == (0.2, 1.5, 0.9)
    assert (cfg.long_window, cfg.short_window) == (600, 10)
    lim = AdaptiveLimit()
    assert (lim.limit, lim.inflight, lim.headroom()) == (20.0, 0, 20.0)


@pytest.mark.parametrize("kwargs", [
    {"min_limit": 0.0}, {"initial": 1.0}, {"initial": 2000.0}, {"max_limit": math.inf},
    {"smoothing": 0.0}, {"smoothing": 1.5}, {"tolerance": 0.9}, {"tolerance": math.nan},
    {"short_window": 0}, {"short_window": 700}, {"backoff_ratio": 0.0}, {"backoff_ratio": 1.1},
])
def test_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LimiterConfig(**kwargs)  # type: ignore[arg-type]


def test_grows_under_steady_low_latency_with_full_use() -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.010, 50)
    assert lim.limit > 40.0
    saturated(lim, 0.010, 1000)
    assert lim.limit == 1000.0  # the ceiling, exactly
    assert lim.short_rtt == pytest.approx(0.010) and lim.long_rtt == pytest.approx(0.010)


def test_latency_within_tolerance_does_not_shrink() -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.010, 100)
    before = lim.limit
    saturated(lim, 0.014, 100)  # 1.4x the baseline: batching, not queueing
    assert lim.limit > before


def test_shrinks_when_latency_rises_past_tolerance() -> None:
    lim = AdaptiveLimit(LimiterConfig(max_limit=200.0))
    saturated(lim, 0.010, 600)
    assert lim.limit == 200.0
    saturated(lim, 0.050, 10)  # 5x: queueing
    assert lim.limit < 100.0
    saturated(lim, 0.050, 30)
    assert lim.limit < 15.0
    assert lim.short_rtt > 1.5 * lim.long_rtt


def test_a_lasting_latency_becomes_the_new_baseline() -> None:
    lim = AdaptiveLimit(LimiterConfig(max_limit=200.0))
    saturated(lim, 0.010, 600)
    saturated(lim, 0.050, 40)
    low = lim.limit
    saturated(lim, 0.050, 2000)  # Gradient2 by design: the long-term RTT follows, slowly
    assert lim.long_rtt == pytest.approx(0.050, rel=0.01)
    assert lim.limit == 200.0 > low


def test_gradient_never_sheds_more_than_half_per_sample() -> None:
    lim = AdaptiveLimit(LimiterConfig(smoothing=1.0, max_limit=100.0))
    saturated(lim, 0.010, 100)
    before = lim.limit
    fill(lim)
    lim.release(1e6, False, 0.0)
    assert lim.limit == pytest.approx(before * 0.5 + max(4.0, math.sqrt(before)))


def test_recovers_after_an_overload() -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.010, 600)
    saturated(lim, 0.200, 100)  # an overload drags the baseline up
    assert lim.long_rtt > 0.05
    low = lim.limit
    assert low < 10.0
    saturated(lim, 0.010, 100)  # latency back to normal: the baseline decays, the limit grows
    assert lim.long_rtt < 0.02
    assert lim.limit > 10 * low


def test_never_leaves_bounds() -> None:
    # min_limit 9 is above the gradient's own floor (limit = limit / 2 + queue_size at 8).
    lim = AdaptiveLimit(LimiterConfig(initial=10.0, min_limit=9.0, max_limit=50.0))
    saturated(lim, 0.001, 1000)
    assert lim.limit == 50.0  # exactly
    saturated(lim, 10.0, 100)
    assert lim.limit == 9.0
    saturated(lim, 0.001, 1000)
    for _ in range(100):
        lim.try_acquire()
        lim.release(None, True, 0.0)
    assert lim.limit == 9.0


def test_drops_shrink_multiplicatively_without_a_sample() -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.010, 10)
    limit, short, long = lim.limit, lim.short_rtt, lim.long_rtt
    fill(lim)
    lim.release(5.0, True, 0.0)  # a timeout's latency is the deadline, not the target's
    assert lim.limit == pytest.approx(limit * 0.9)
    assert (lim.short_rtt, lim.long_rtt) == (short, long)
    lim.release(None, True, 0.0)
    assert lim.limit == pytest.approx(limit * 0.81)


def test_app_limited_use_does_not_grow() -> None:
    lim = AdaptiveLimit()
    for _ in range(1000):  # one request at a time against a limit of 20
        assert lim.try_acquire()
        lim.release(0.010, False, 0.0)
    assert lim.limit == 20.0
    for _ in range(1000):  # 9 of 20: still under half
        for _ in range(9):
            lim.try_acquire()
        for _ in range(9):
            lim.release(0.010, False, 0.0)
    assert lim.limit == 20.0
    assert lim.short_rtt == pytest.approx(0.010)  # the RTTs are still tracked


def test_share_reserves_headroom() -> None:
    lim = AdaptiveLimit()
    assert sum(lim.try_acquire(0.5) for _ in range(30)) == 10
    assert lim.headroom() == 10.0
    assert sum(lim.try_acquire(0.8) for _ in range(30)) == 6
    assert sum(lim.try_acquire() for _ in range(30)) == 4
    assert lim.inflight == 20 and lim.headroom() == 0.0
    for bad in (0.0, -1.0, 1.01, math.nan):
        with pytest.raises(ValueError):
            lim.try_acquire(bad)


def test_idle_target_admits_any_share() -> None:
    lim = AdaptiveLimit(LimiterConfig(initial=2.0))
    assert lim.try_acquire(0.01)
    assert not lim.try_acquire(0.01)


@pytest.mark.parametrize("latency", [None, math.nan, -0.001, math.inf, -math.inf])
def test_unknown_or_bogus_latency_is_no_sample(latency: float | None) -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.010, 5)
    state = (lim.limit, lim.short_rtt, lim.long_rtt)
    fill(lim)
    inflight = lim.inflight
    lim.release(latency, False, 0.0)
    assert (lim.limit, lim.short_rtt, lim.long_rtt) == state
    assert lim.inflight == inflight - 1


def test_zero_latency_is_a_sample_and_divides_nothing() -> None:
    lim = AdaptiveLimit()
    saturated(lim, 0.0, 50)
    assert lim.short_rtt == 0.0 and lim.limit > 20.0


def test_release_and_forget_never_go_below_zero() -> None:
    lim = AdaptiveLimit()
    lim.release(0.01, False, 0.0)
    lim.release(None, True, 0.0)
    lim.forget()
    assert lim.inflight == 0
    assert lim.limit == 18.0  # the drop still counts
    assert lim.try_acquire() and lim.try_acquire()
    lim.forget()
    assert lim.inflight == 1 and lim.limit == 18.0


latencies = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=2.0),
    st.sampled_from([0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308, -0.0, -1.0]),
)
ops = st.one_of(
    st.tuples(st.just("acquire"), st.floats(min_value=0.01, max_value=1.0)),
    st.tuples(st.just("fill"), st.just(1.0)),
    st.tuples(st.just("release"), latencies, st.booleans()),
    st.tuples(st.just("forget")),
)
configs = st.sampled_from([
    LimiterConfig(),
    LimiterConfig(initial=4.0, min_limit=2.0, max_limit=40.0, smoothing=1.0, short_window=1,
                  long_window=3),
    LimiterConfig(initial=5.0, min_limit=5.0, max_limit=5.0),
])


@FAST
@given(configs, st.lists(ops, max_size=300))
def test_property_any_sequence_keeps_invariants(
        config: LimiterConfig, seq: list[tuple[Any, ...]]) -> None:
    lim = AdaptiveLimit(config)
    inflight = 0
    for op in seq:
        if op[0] == "acquire":
            if lim.try_acquire(op[1]):
                inflight += 1
        elif op[0] == "fill":
            while lim.try_acquire():
                inflight += 1
        elif op[0] == "release":
            lim.release(op[1], op[2], 0.0)
            inflight = max(0, inflight - 1)
        else:
            lim.forget()
            inflight = max(0, inflight - 1)
        assert lim.inflight == inflight >= 0
        assert math.isfinite(lim.limit)
        assert config.min_limit <= lim.limit <= config.max_limit
        assert math.isfinite(lim.short_rtt) and lim.short_rtt >= 0.0
        assert math.isfinite(lim.long_rtt) and lim.long_rtt >= 0.0
        assert lim.headroom() == lim.limit - lim.inflight


def test_over_lets_the_caller_overdraw_boundedly() -> None:
    lim = AdaptiveLimit(LimiterConfig(initial=4.0))
    assert sum(lim.try_acquire() for _ in range(10)) == 4
    assert sum(lim.try_acquire(1.0, 2.0) for _ in range(10)) == 4
    assert lim.inflight == 8 and lim.headroom() == -4.0
    for bad in (0.5, 0.0, math.nan):
        with pytest.raises(ValueError):
            lim.try_acquire(1.0, bad)
