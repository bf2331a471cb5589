"""The latency window behind hedge delays (meshd/score/latency.py): nearest-rank quantiles of
the last N samples, recomputed at most once per ``recompute_every`` samples, and bogus samples
ignored.
"""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshd.score.latency import LatencyWindow

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def nearest_rank(data: list[float], q: float) -> float:
    """The oracle, straight from the definition: the smallest sample with at least ``q * n``
    samples at or below it."""
    n = len(data)
    return min(x for x in data if sum(1 for y in data if y <= x) >= q * n)


def test_defaults() -> None:
    w = LatencyWindow()
    assert (w.size, w.min_samples, w.recompute_every, w.count) == (256, 20, 16, 0)
    assert w.quantile(0.5) is None and w.mean() is None


@pytest.mark.parametrize("kwargs", [
    {"size": 10, "min_samples": 11}, {"min_samples": 0}, {"recompute_every": 0},
])
def test_rejects_nonsense(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        LatencyWindow(**kwargs)


def test_needs_min_samples() -> None:
    w = LatencyWindow()
    for i in range(19):
        w.add(float(i))
    assert w.quantile(0.95) is None
    assert w.mean() == 9.0  # the mean needs only one sample
    w.add(19.0)
    assert w.quantile(0.95) == 18.0  # rank ceil(0.95 * 20) = 19
    assert w.quantile(1.0) == 19.0 and w.quantile(0.0) == 0.0


def test_nearest_rank() -> None:
    w = LatencyWindow()
    for i in range(100, 0, -1):
        w.add(i / 1000)
    w.refresh()
    assert w.quantile(0.5) == 0.050
    assert w.quantile(0.95) == 0.095
    assert w.quantile(0.99) == 0.099
    assert w.quantile(0.001) == 0.001
    assert w.quantile(0.0) == 0.001 and w.quantile(1.0) == 0.100
    assert w.mean() == pytest.approx(0.0505)
    for bad in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            w.quantile(bad)


@pytest.mark.parametrize("bogus", [math.nan, math.inf, -math.inf, -0.001])
def test_ignores_bogus_samples(bogus: float) -> None:
    w = LatencyWindow(min_samples=1)
    w.add(0.01)
    w.add(bogus)
    assert w.count == 1
    assert w.quantile(1.0) == 0.01 and w.mean() == 0.01


def test_zero_is_a_sample() -> None:
    w = LatencyWindow(min_samples=1)
    w.add(0.0)
    assert w.count == 1 and w.quantile(0.5) == 0.0


def test_ring_keeps_the_latest_size_samples() -> None:
    w = LatencyWindow(size=32, min_samples=4, recompute_every=1)
    for _ in range(32):
        w.add(1.0)
    for i in range(31):
        w.add(2.0)
        assert w.count == 32
        assert w.quantile(1.0) == 2.0
        assert w.mean() == pytest.approx((2.0 * (i + 1) + 1.0 * (31 - i)) / 32)
    assert w.quantile(0.0) == 1.0
    w.add(2.0)
    assert w.quantile(0.0) == 2.0


def test_cached_until_recompute_every_adds() -> None:
    w = LatencyWindow()
    for _ in range(256):
        w.add(0.010)
    assert w.quantile(0.5) == 0.010
    for _ in range(15):
        w.add(1.0)
        assert w.quantile(1.0) == 0.010  # stale: not re-sorted per call
        assert w.mean() == 0.010
    w.add(1.0)
    assert w.quantile(1.0) == 1.0  # the 16th add makes the next read recompute
    assert w.mean() == pytest.approx((240 * 0.010 + 16 * 1.0) / 256)
    w.add(5.0)
    assert w.quantile(1.0) == 1.0
    w.refresh()
    assert w.quantile(1.0) == 5.0


def test_ignored_samples_do_not_count_towards_a_recompute() -> None:
    w = LatencyWindow()
    for _ in range(40):
        w.add(0.010)
    assert w.quantile(0.5) == 0.010
    for _ in range(100):
        w.add(math.nan)
    assert w.quantile(0.5) == 0.010 and w.count == 40


def test_huge_samples_keep_the_mean_finite() -> None:
    w = LatencyWindow(min_samples=1)
    for _ in range(3):
        w.add(1.7976931348623157e308)
    assert w.mean() == 1.7976931348623157e308
    w.add(1.0)
    w.refresh()
    assert w.mean() == pytest.approx(1.7976931348623157e308 * 0.75)


samples = st.one_of(
    st.floats(min_value=0.0, max_value=10.0),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.001, 0.001, 0.5, 1e300, math.nan, -1.0]),
)


@FAST
@given(st.lists(samples, max_size=600), st.floats(min_value=0.0, max_value=1.0),
       st.sampled_from([(256, 20, 16), (7, 3, 2), (16, 1, 1)]))
def test_property_matches_nearest_rank_after_refresh(
        data: list[float], q: float, shape: tuple[int, int, int]) -> None:
    size, min_samples, every = shape
    w = LatencyWindow(size, min_samples, every)
    for x in data:
        w.add(x)
    window = [x for x in data if 0.0 <= x < math.inf][-size:]
    assert w.count == len(window)
    w.refresh()
    if len(window) < min_samples:
        assert w.quantile(q) is None
    else:
        assert w.quantile(q) == nearest_rank(window, q)
        assert w.quantile(0.5) == statistics.median_low(window)
        assert w.quantile(0.0) == min(window) and w.quantile(1.0) == max(window)
    if window:
        mean = w.mean()
        assert mean is not None and math.isfinite(mean)
        assert min(window) <= mean <= max(window)
        if max(window) < 1e300:
            assert mean == pytest.approx(statistics.fmean(window), rel=1e-12, abs=1e-300)


@FAST
@given(st.lists(samples, max_size=600), st.floats(min_value=0.0, max_value=1.0))
def test_property_recomputes_exactly_once_per_recompute_every_samples(
        data: list[float], q: float) -> None:
    """Read after every sample: the answer changes only when the 16th sample since the last
    computation arrives (or while the window is filling to ``min_samples``), and is then exact."""
    w = LatencyWindow(size=64)
    valid: list[float] = []
    since, previous = 0, None
    for x in data:
        w.add(x)
        if not 0.0 <= x < math.inf:
            continue
        valid.append(x)
        since += 1
        got = w.quantile(q)
        window = valid[-64:]
        if len(window) < 20:
            assert got is None
            continue
        if len(window) == 20 or since == 16:
            assert got == nearest_rank(window, q)
            since = 0
        else:
            assert got == previous
        previous = got
