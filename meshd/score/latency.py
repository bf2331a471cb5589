"""Recent latency distribution of one target, for hedge delays.

A hedge is sent once the first attempt has taken longer than, say, the target's p95: late
enough that only the slow tail is duplicated, early enough to cut it.  That needs the quantile
of recent latencies, read on every request, so it is cached: the window is re-sorted at most
once per ``recompute_every`` samples (about 6 µs for 256 samples, so under 0.4 µs per sample
amortised), and every read in between is O(1).  A hedge delay a few samples stale is as good
as a fresh one; re-sorting 256 floats per request is not.

Pure logic: no clock, samples are seconds passed in.
"""

from __future__ import annotations

import math

_INF = math.inf


class LatencyWindow:
    """The last ``size`` latencies of one target (a ring buffer) and cached statistics.

    ``quantile`` and ``mean`` describe the window as of the last recomputation, which happens
    lazily on a read once ``recompute_every`` samples were added since the previous one (or
    when the previous one was made before the window reached ``min_samples``).  ``refresh``
    recomputes at once.
    """

    __slots__ = ("size", "min_samples", "recompute_every", "_ring", "_pos", "_count",
                 "_since", "_fresh_n", "_sorted", "_mean")

    def __init__(self, size: int = 256, min_samples: int = 20, recompute_every: int = 16) -> None:
        if not 1 <= min_samples <= size:
            raise ValueError("need 1 <= min_samples <= size")
        if recompute_every < 1:
            raise ValueError("recompute_every must be >= 1")
        self.size = size
        """Samples kept: the latest ``size`` ones (256: a few seconds of a busy target, so
        the tail reflects its current state, yet enough samples for a stable p99)."""
        self.min_samples = min_samples
        """Samples needed before ``quantile`` answers: with fewer, a p95 is one or two
        outliers, and a hedge delay built on it would hedge too much or never."""
        self.recompute_every = recompute_every
        """Samples added between two recomputations of the cached statistics at most."""
        self._ring = [0.0] * size
        self._pos = 0
        self._count = 0
        self._since = 0
        """Samples added since the statistics were last computed."""
        self._fresh_n = 0
        """Samples the window held when the statistics were last computed."""
        self._sorted: list[float] = []
        self._mean: float | None = None

    @property
    def count(self) -> int:
        """Samples in the window (at most ``size``)."""
        return self._count

    def add(self, seconds: float) -> None:
        """Record one latency.  NaN, infinite and negative values are ignored: they are
        measurement bugs, and one of them would poison every statistic of the window."""
        if not 0.0 <= seconds < _INF:
            return
        pos = self._pos
        self._ring[pos] = seconds
        pos += 1
        self._pos = 0 if pos == self.size else pos
        if self._count < self.size:
            self._count += 1
        self._since += 1

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (nearest rank: the smallest sample with at least ``q`` of the
        samples at or below it), or None below ``min_samples``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        if self._count < self.min_samples:
            return None
        if self._since and (self._since >= self.recompute_every
                            or self._fresh_n < self.min_samples):
            self.refresh()
        ordered = self._sorted
        rank = math.ceil(q * len(ordered))
        return ordered[rank - 1] if rank > 0 else ordered[0]

    def mean(self) -> float | None:
        """The mean of the window, or None while it is empty (cached like ``quantile``)."""
        if self._count == 0:
            return None
        if self._since and (self._since >= self.recompute_every
                            or self._fresh_n < self.min_samples):
            self.refresh()
        return self._mean

    def refresh(self) -> None:
        """Recompute the cached statistics now."""
        n = self._count
        ordered = sorted(self._ring if n == self.size else self._ring[:n])
        self._sorted = ordered
        if n:
            try:
                mean = math.fsum(ordered) / n
            except OverflowError:
                # Samples near float max: scale first.  Rounding may still overflow to inf,
                # which the clamp undoes: the exact mean lies within the samples.
                mean = sum(x / n for x in ordered)
            self._mean = min(max(mean, ordered[0]), ordered[-1])
        else:
            self._mean = None
        self._since = 0
        self._fresh_n = n
