"""The pure side of the Triton adapter: the queue gauge parser, request sizes from a model's
inputs, and the counter tracker (deltas, resets, batching, SPU)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.triton_stats import (
    EWMA_REQUESTS,
    StatsSample,
    StatsTracker,
    parse_pending,
    request_bytes,
    units_for,
)

SCRAPE = """\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="add_sub",version="1"} 0
nv_inference_pending_request_count{model="delay",version="1"} 7
nv_inference_pending_request_count{model="delay",version="2"} 2
nv_inference_count{model="delay",version="1"} 1234
nv_inference_pending_request_count{model="we\\"ird",version="1"} 3
nv_inference_pending_request_count{version="1"} 3
nv_inference_pending_request_count{model="x",version="1"} NaN
nv_inference_pending_request_count{model="y",version="1"}
nv_inference_pending_request_count{model="z",version="1"
"""


def test_parse_pending_reads_only_the_gauge_and_counts_bad_lines() -> None:
    got = parse_pending(SCRAPE)
    assert got.pending == {("add_sub", "1"): 0, ("delay", "1"): 7, ("delay", "2"): 2,
                           ("we\\\"ird", "1"): 3}
    assert got.bad_lines == 4  # no model label, NaN, no value, no closing brace


@given(st.text(max_size=400))
def test_parse_pending_never_raises(text: str) -> None:
    got = parse_pending(text)
    assert all(v >= 0 for v in got.pending.values())


@given(st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                          st.integers(0, 10**6)), max_size=20))
def test_parse_pending_round_trips_generated_gauges(rows: list[tuple[str, int]]) -> None:
    text = "\n".join(f'nv_inference_pending_request_count{{model="{m}",version="1"}} {v}'
                     for m, v in rows)
    want: dict[tuple[str, str], int] = {}
    for m, v in rows:
        want[(m, "1")] = want.get((m, "1"), 0) + v
    assert parse_pending(text).pending == want


def test_request_bytes() -> None:
    assert request_bytes([("TYPE_FP32", [4]), ("FP32", [4])]) == 32
    assert request_bytes([("TYPE_INT64", [2, 3])]) == 48
    assert request_bytes([("TYPE_FP32", [-1])]) is None
    assert request_bytes([("TYPE_STRING", [1])]) is None
    assert request_bytes([("BYTES", [1])]) is None
    assert request_bytes([]) == 0
    assert units_for(None) == 1.0 and units_for(0) == 1.0
    assert units_for(32 * 1024) == 1.0 and units_for(32 * 1024 + 1) == 2.0


def sample(ok: int, ms_per: float = 10.0, queue_ms: float = 2.0, fail: int = 0,
           batch: float = 1.0) -> StatsSample:
    return StatsSample(success_count=ok, success_ns=int(ok * (ms_per + queue_ms) * 1e6),
                       fail_count=fail, queue_count=ok, queue_ns=int(ok * queue_ms * 1e6),
                       compute_count=ok, compute_ns=int(ok * ms_per * 1e6),
                       execution_count=int(ok / batch))


def test_tracker_turns_counters_into_interval_figures() -> None:
    t = StatsTracker()
    assert t.update(sample(100), now=10.0) is None  # the first snapshot is a baseline
    iv = t.update(sample(300, fail=4), now=12.0, units_per_request=2.0)
    assert iv is not None
    assert iv.requests == 200 and iv.failures == 4 and iv.rate == pytest.approx(100.0)
    assert iv.compute_seconds == pytest.approx(0.010)
    assert iv.queue_seconds == pytest.approx(0.002)
    assert iv.latency_seconds == pytest.approx(0.012)
    assert iv.batch == 1.0
    # 200 requests weigh almost fully: SPU = 10 ms / 2 units.
    assert t.spu == pytest.approx(0.005)
    assert t.latency == pytest.approx(0.012)


def test_tracker_batch_factor_lowers_spu() -> None:
    t = StatsTracker()
    t.update(sample(0, batch=4.0), now=0.0)
    iv = t.update(sample(400, batch=4.0), now=1.0)
    assert iv is not None and iv.batch == pytest.approx(4.0)
    assert t.spu == pytest.approx(0.010 / 4)


def test_tracker_quiet_interval_keeps_the_estimates() -> None:
    t = StatsTracker()
    t.update(sample(100), now=0.0)
    t.update(sample(200), now=1.0)
    spu = t.spu
    iv = t.update(sample(200), now=2.0)
    assert iv is not None and iv.requests == 0 and iv.rate == 0.0
    assert iv.compute_seconds is None and iv.latency_seconds is None
    assert t.spu == spu


def test_tracker_one_request_moves_the_average_a_little() -> None:
    t = StatsTracker()
    t.update(sample(0, ms_per=10.0), now=0.0)
    t.update(sample(1000, ms_per=10.0), now=1.0)
    slow = StatsSample(success_count=1001, success_ns=1000 * 12_000_000 + 1_000_000_000,
                       fail_count=0, queue_count=1001, queue_ns=1000 * 2_000_000,
                       compute_count=1001, compute_ns=1000 * 10_000_000 + 1_000_000_000,
                       execution_count=1001)
    t.update(slow, now=2.0)
    weight = 1 - math.exp(-1 / EWMA_REQUESTS)
    assert t.spu == pytest.approx(0.010 + weight * (1.0 - 0.010))
    assert t.spu is not None and t.spu < 0.1


def test_tracker_rebaselines_when_counters_go_backwards() -> None:
    t = StatsTracker()
    t.update(sample(500), now=0.0)
    assert t.update(sample(10), now=1.0) is None  # restarted server
    assert t.resets == 1
    iv = t.update(sample(110), now=2.0)
    assert iv is not None and iv.requests == 100


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**12),
                          st.integers(0, 10**6), st.floats(0.001, 5.0)), max_size=12))
def test_tracker_never_yields_negative_or_nan(steps: list[tuple[int, int, int, float]]) -> None:
    t = StatsTracker()
    now = 0.0
    for ok, ns, fail, dt in steps:
        now += dt
        iv = t.update(StatsSample(ok, ns, fail, ok, ns // 3, ok, ns // 2, max(ok // 2, 0)),
                      now)
        if iv is not None:
            assert iv.requests >= 0 and iv.failures >= 0 and iv.rate >= 0
            for v in (iv.queue_seconds, iv.compute_seconds, iv.latency_seconds):
                assert v is None or (math.isfinite(v) and v >= 0)
    assert t.spu is None or (math.isfinite(t.spu) and t.spu >= 0)
