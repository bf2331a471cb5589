"""Adaptive concurrency limit for one target, in the style of Netflix concurrency-limits' Gradient2.

A fixed ``max_concurrency`` is either too low (a fast replica idles) or too high (a slow one
queues until requests time out).  Instead the limit follows latency: while the recent RTT
(short-term EWMA) stays within ``tolerance`` of the long-term RTT (the replica's unloaded
baseline, as far as we can tell), the limit grows by ``smoothing * max(queue_size,
sqrt(limit))`` per sample; once the recent RTT exceeds it, queueing has started and the limit
shrinks in proportion (by at most half per sample, smoothed).  A latency that lasts becomes
the new baseline as the long-term RTT follows it, so the limit grows back (Gradient2 by
design: the limiter finds the concurrency at which latency stops rising, it does not defend
an absolute latency).  Drops
(timeouts, overload, UNAVAILABLE) carry no usable RTT, so they back off multiplicatively.

Pure logic: the caller counts requests in and out and passes latencies in seconds; ``now`` is
accepted but unused (kept for probe intervals later).  Every method is O(1) and allocates
nothing but floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import sqrt

_INF = math.inf


@dataclass(frozen=True, slots=True)
class LimiterConfig:
    """How one target's limit adapts.  Defaults follow Gradient2's, scaled for GPU replicas."""

    initial: float = 20.0
    """Limit before any sample: enough to fill a Triton replica's dynamic batcher, few enough
    that a cold, slow replica is not buried before the first latencies come back."""
    min_limit: float = 2.0
    """The floor: at least two requests, so one slow request cannot stall a target and the
    limiter keeps getting samples to recover from.  Latency alone brings the limit down to
    ``2 * queue_size`` at most (where ``limit / 2 + queue_size == limit``); only drops take it
    lower."""
    max_limit: float = 1000.0
    """The ceiling: bounds the damage while latency looks deceptively flat (e.g. a replica that
    fails fast)."""
    smoothing: float = 0.2
    """Weight of each new limit estimate (0..1]: higher reacts faster and oscillates more."""
    tolerance: float = 1.5
    """How much the short-term RTT may exceed the long-term one before the limit shrinks:
    GPU batching makes latency rise a little with load before any real queueing."""
    long_window: int = 600
    """Samples the long-term RTT (the baseline) averages over: long enough to remember the
    unloaded latency through a burst of load."""
    short_window: int = 10
    """Samples the short-term RTT averages over: short enough to see queueing within a batch
    or two, long enough that one outlier does not halve the limit."""
    queue_size: float = 4.0
    """Headroom added to each estimate (``max(queue_size, sqrt(limit))``; Gradient2's
    default).  It is the queue the target may hold beyond the concurrency at which latency
    rises: a single-instance replica's latency rises with its second request, and with only
    ``sqrt(limit)`` its limit fell to 4 and shed Poisson bursts and the load a stalled peer
    left behind at 80% utilization (measured in ``bench/routing``)."""
    backoff_ratio: float = 0.9
    """Factor applied to the limit on each drop (timeout, overload, UNAVAILABLE).  Each drop
    counts: a burst of timeouts means the target is overloaded now."""

    def __post_init__(self) -> None:
        if not 0.0 < self.min_limit <= self.initial <= self.max_limit < _INF:
            raise ValueError("need 0 < min_limit <= initial <= max_limit < inf")
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError("smoothing must be in (0, 1]")
        if not 1.0 <= self.tolerance < _INF:
            raise ValueError("tolerance must be >= 1 and finite")
        if not 1 <= self.short_window <= self.long_window:
            raise ValueError("need 1 <= short_window <= long_window")
        if not 0.0 <= self.queue_size < _INF:
            raise ValueError("queue_size must be >= 0 and finite")
        if not 0.0 < self.backoff_ratio <= 1.0:
            raise ValueError("backoff_ratio must be in (0, 1]")


class AdaptiveLimit:
    """One target's concurrency limit and in-flight count.

    ``limit`` and ``inflight`` are plain attributes for reading (metrics, scoring); change them
    only through the methods.  ``short_rtt`` and ``long_rtt`` (seconds, 0.0 before the first
    sample) are exposed for metrics.
    """

    __slots__ = ("limit", "inflight", "short_rtt", "long_rtt", "_min", "_max", "_smoothing",
                 "_tolerance", "_backoff", "_queue", "_short_alpha", "_long_alpha", "_n", "_n_cap")

    def __init__(self, config: LimiterConfig = LimiterConfig()) -> None:
        self.limit: float = config.initial
        self.inflight: int = 0
        self.short_rtt: float = 0.0
        self.long_rtt: float = 0.0
        # The config is copied into slots: the hot path then reads one attribute, not two.
        self._min = config.min_limit
        self._max = config.max_limit
        self._smoothing = config.smoothing
        self._tolerance = config.tolerance
        self._backoff = config.backoff_ratio
        self._queue = config.queue_size
        self._short_alpha = 2.0 / (config.short_window + 1)
        self._long_alpha = 2.0 / (config.long_window + 1)
        self._n = 0
        """Samples seen, counted up to ``_n_cap`` (where ``1/n`` no longer matters)."""
        self._n_cap = config.long_window + 1

    def try_acquire(self, share: float = 1.0, over: float = 1.0) -> bool:
        """Admit one request if fewer than ``limit * share * over`` are in flight.

        ``share`` in (0, 1] keeps headroom for higher priorities: a request allowed only 0.8 of
        the limit is refused while the last 20% is left to those allowed all of it.  An idle
        target admits any share, so low priorities are never starved outright.  ``over`` >= 1
        lets the caller overdraw the limit (the scorer does, boundedly, rather than send a
        request to a target predicted to take far longer).
        """
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        if not over >= 1.0:
            raise ValueError("over must be >= 1")
        if self.inflight < self.limit * share * over:
            self.inflight += 1
            return True
        return False

    def headroom(self) -> float:
        """``limit - inflight``: how many more requests the target takes (negative after the
        limit shrank below what is already in flight)."""
        return self.limit - self.inflight

    def forget(self) -> None:
        """A request ended without telling us anything (e.g. its decision expired)."""
        if self.inflight > 0:
            self.inflight -= 1

    def release(self, latency: float | None, dropped: bool, now: float) -> None:
        """A request ended after ``latency`` seconds; adapt the limit.

        ``latency`` None (unknown, e.g. cancelled), NaN, infinite or negative is no sample:
        a cancelled request's duration says nothing about the target.  ``dropped`` (timeout,
        overload, UNAVAILABLE) backs off multiplicatively instead of taking a sample: its
        latency is the deadline, not the target's.  ``now`` is unused for now.
        """
        used = self.inflight
        if used > 0:
            self.inflight = used - 1
        if dropped:
            limit = self.limit * self._backoff
            self.limit = limit if limit > self._min else self._min
            return
        if latency is None or not 0.0 <= latency < _INF:
            return
        # The sample is taken inline: a helper method call would add ~25% to this hot path.
        # EWMA weights start at 1/n (a plain mean) and fall to 2/(window+1): the first samples
        # set the averages instead of being diluted into a made-up zero.
        n = self._n
        if n < self._n_cap:
            n += 1
            self._n = n
            inv = 1.0 / n
            short_alpha = inv if inv > self._short_alpha else self._short_alpha
            long_alpha = inv if inv > self._long_alpha else self._long_alpha
        else:
            short_alpha = self._short_alpha
            long_alpha = self._long_alpha
        # ``x += a * (s - x)`` rather than ``(1 - a) * x + a * s``: it cannot overflow for
        # finite non-negative samples, however large.
        short = self.short_rtt + short_alpha * (latency - self.short_rtt)
        long = self.long_rtt + long_alpha * (latency - self.long_rtt)
        # After a long overload the baseline has crept up; decay it faster than the EWMA alone
        # would once latency is back well below it, so the limit can grow again.
        if long > 2.0 * short:
            long *= 0.95
        self.short_rtt = short
        self.long_rtt = long

        limit = self.limit
        # App-limited: a target using under half its limit gives no evidence that it could
        # take more, so the limit is not grown (nor shrunk: the RTT is then not a load signal).
        if used < limit * 0.5:
            return
        # gradient = clamp(tolerance * long / short, 0.5, 1), written without dividing so a
        # zero or huge RTT needs no special case.  Never below 0.5: one slow outlier must not
        # shed more than half the load.
        scaled = self._tolerance * long
        if scaled >= short:
            gradient = 1.0
        elif scaled <= 0.5 * short:
            gradient = 0.5
        else:
            gradient = scaled / short
        root = sqrt(limit)
        new_limit = limit * gradient + (root if root > self._queue else self._queue)
        limit += self._smoothing * (new_limit - limit)
        self.limit = self._min if limit < self._min else self._max if limit > self._max else limit
