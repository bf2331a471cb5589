"""What a Triton server's counters mean for routing: pure functions and a tracker, no I/O.

Triton exposes only cumulative counters through ModelStatistics (``success``, ``queue``,
``compute_*`` counts and nanoseconds) and the current queue depth through one Prometheus gauge,
``nv_inference_pending_request_count``.  Routing needs rates and per-request times over the
last interval, and an estimate of **seconds per work unit** (SPU): how long one more 32 KiB of
payload keeps an instance busy.  :class:`StatsTracker` turns successive snapshots into those,
and survives counters going backwards (the server restarted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from adapters.model import work_units

PENDING_METRIC = "nv_inference_pending_request_count"

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_DTYPE_BYTES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8,
}

EWMA_REQUESTS = 20.0
"""The SPU and latency averages weigh an interval by its request count over this many
requests: one lone request moves them a little, a busy interval replaces them."""


@dataclass(frozen=True, slots=True)
class PendingScrape:
    """Queue depth per (model, version) from one scrape, and how many lines did not parse."""

    pending: dict[tuple[str, str], int]
    bad_lines: int


def parse_pending(text: str) -> PendingScrape:
    """Read ``nv_inference_pending_request_count{model=..,version=..} N`` lines.

    Only the lines of that metric are looked at (a scrape of a server with many models is
    large and this runs ten times a second); a line that does not parse is counted, not fatal.
    """
    out: dict[tuple[str, str], int] = {}
    bad = 0
    prefix = PENDING_METRIC + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        end = line.rfind("}")
        if end < 0:
            bad += 1
            continue
        labels = dict(_LABEL.findall(line[len(prefix):end]))
        try:
            value = float(line[end + 1:].split()[0])
        except (IndexError, ValueError):
            bad += 1
            continue
        model = labels.get("model")
        if not model or not math.isfinite(value) or value < 0:
            bad += 1
            continue
        key = (model, labels.get("version", ""))
        out[key] = out.get(key, 0) + int(value)
    return PendingScrape(out, bad)


def request_bytes(inputs: Iterable[tuple[str, Iterable[int]]]) -> int | None:
    """Payload bytes of one request from the model's inputs ``(data type, dims)``, or None
    when any input is variable-sized (a ``-1`` dim or BYTES): then only observed requests can
    tell.  Data types may be given as in the config (``TYPE_FP32``) or the protocol (``FP32``).
    """
    total = 0
    for dtype, dims in inputs:
        size = _DTYPE_BYTES.get(dtype.removeprefix("TYPE_"))
        shape = list(dims)
        if size is None or any(d < 0 for d in shape):
            return None
        total += size * math.prod(shape)
    return total


@dataclass(frozen=True, slots=True)
class StatsSample:
    """One model version's cumulative counters, as ModelStatistics reports them."""

    success_count: int
    success_ns: int
    fail_count: int
    queue_count: int
    queue_ns: int
    compute_count: int
    """``compute_infer.count``: requests that reached the model (batched or not)."""
    compute_ns: int
    """``compute_input + compute_infer + compute_output`` nanoseconds."""
    execution_count: int
    """Model executions: fewer than requests when dynamic batching merges them."""


@dataclass(frozen=True, slots=True)
class Interval:
    """What happened between two samples."""

    seconds: float
    requests: int
    failures: int
    rate: float
    queue_seconds: float | None
    compute_seconds: float | None
    latency_seconds: float | None
    batch: float
    """Requests per execution (≥ 1): how much dynamic batching drains the queue per step."""


class StatsTracker:
    """Per-replica counter deltas, SPU and latency EWMAs."""

    def __init__(self) -> None:
        self._last: StatsSample | None = None
        self._last_at = 0.0
        self.spu: float | None = None
        self.latency: float | None = None
        self.resets = 0

    def update(self, sample: StatsSample, now: float,
               units_per_request: float = 1.0) -> Interval | None:
        """Fold in a snapshot taken at ``now``; None for the first one or after a reset.

        ``units_per_request`` is the mean work units of the requests served (from the model's
        fixed input sizes, or from what routers observed); SPU is compute seconds per unit,
        divided by the batch factor because a batched execution serves several requests.
        """
        last, last_at = self._last, self._last_at
        self._last, self._last_at = sample, now
        if last is None:
            return None
        if any(getattr(sample, f) < getattr(last, f) for f in StatsSample.__slots__):
            self.resets += 1  # counters went backwards: the server restarted
            return None
        dt = now - last_at
        if dt <= 0:
            return None
        ok = sample.success_count - last.success_count
        queued = sample.queue_count - last.queue_count
        computed = sample.compute_count - last.compute_count
        executions = sample.execution_count - last.execution_count
        queue_s = (sample.queue_ns - last.queue_ns) / queued / 1e9 if queued else None
        compute_s = (sample.compute_ns - last.compute_ns) / computed / 1e9 if computed else None
        latency_s = (sample.success_ns - last.success_ns) / ok / 1e9 if ok else None
        batch = max(1.0, computed / executions) if executions > 0 else 1.0
        if ok:
            weight = 1.0 - math.exp(-ok / EWMA_REQUESTS)
            if compute_s is not None:
                spu = compute_s / max(units_per_request, 1.0) / batch
                self.spu = spu if self.spu is None else self.spu + weight * (spu - self.spu)
            if latency_s is not None:
                self.latency = (latency_s if self.latency is None
                                else self.latency + weight * (latency_s - self.latency))
        return Interval(seconds=dt, requests=ok,
                        failures=sample.fail_count - last.fail_count, rate=ok / dt,
                        queue_seconds=queue_s, compute_seconds=compute_s,
                        latency_seconds=latency_s, batch=batch)


def units_for(payload_bytes: int | None) -> float:
    """Work units of a request of ``payload_bytes`` (1 when unknown)."""
    return 1.0 if payload_bytes is None else float(work_units(payload_bytes))
