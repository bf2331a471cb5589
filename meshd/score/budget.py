"""Token buckets: the hedge budget (hedges per request) and tenant rate quotas (requests per
second).

Hedging cuts tail latency only while it is rare: if every request hedged, a slow fleet would
get twice the load exactly when it can least take it.  :class:`HedgeBudget` therefore earns
tokens per request and spends one per hedge, like gRPC's retry throttling, so hedges stay
within ``ratio`` of requests however slow the targets get.  :class:`RateBucket` is the classic
continuous token bucket for a tenant's requests-per-second quota.

Pure logic: time, where it matters, is a ``now`` argument in seconds from a monotonic clock.
"""

from __future__ import annotations

import math

_INF = math.inf

_SLACK = 1e-9
"""Tokens a take may be short by.  Float time is decimal-unfriendly (``100.1 - 100.0`` is
``0.09999999999999432``), so without it a bucket refilling 10/s would refuse a take at exactly
100.1 s.  The shortfall is owed (the fill goes that far below zero), never given away."""

_SCALE = 1_000_000
"""Hedge tokens are counted in integer millionths (gRPC uses thousandths): 20 requests at 5%
then earn exactly one hedge, forever, where float sums drift (0.05 added 20 times is not 1.0)."""


class HedgeBudget:
    """Hedges allowed per request: ``ratio`` tokens per request, one token per hedge.

    Starts with ``min(burst, 1)`` tokens, not a full ``burst``: a router that just started (or
    restarted in a crash loop) has served no requests to pay for hedges, and a full bucket
    would let it hedge a whole burst against targets that may be the reason it restarted.
    """

    __slots__ = ("ratio", "burst", "granted", "refused", "_tokens", "_earn", "_cap")

    def __init__(self, ratio: float = 0.05, burst: float = 10.0) -> None:
        if not (ratio == 0.0 or 1.0 / _SCALE <= ratio < _INF):
            raise ValueError(f"ratio must be 0 or in [{1.0 / _SCALE}, inf)")
        if not 0.0 <= burst < _INF:
            raise ValueError("burst must be finite and >= 0")
        self.ratio = ratio
        """Tokens earned per request: the long-run fraction of requests that may hedge."""
        self.burst = burst
        """Tokens held at most: hedges that may follow each other after a quiet spell.
        Below 1 nothing ever hedges."""
        self.granted = 0
        """Hedges paid for so far (by ``try_spend`` or ``charge``)."""
        self.refused = 0
        """Hedges refused so far (for metrics: a high count means the budget binds)."""
        self._earn = round(ratio * _SCALE)
        self._cap = round(burst * _SCALE)
        self._tokens = min(self._cap, _SCALE) if self._earn else 0  # ratio 0: never

    @property
    def tokens(self) -> float:
        """Tokens available now (negative while ``charge`` left a debt)."""
        return self._tokens / _SCALE

    def on_request(self) -> None:
        """A request was routed: earn ``ratio`` tokens (up to ``burst``)."""
        tokens = self._tokens + self._earn
        self._tokens = tokens if tokens < self._cap else self._cap

    def try_spend(self) -> bool:
        """Spend a token on one hedge, if there is a whole one."""
        if self._tokens >= _SCALE:
            self._tokens -= _SCALE
            self.granted += 1
            return True
        self.refused += 1
        return False

    def charge(self) -> None:
        """Pay for a hedge that was offered (on ``tokens >= 1``) and sent, rather than granted
        by ``try_spend``.  Several offers taken up at once may leave the budget in debt
        (negative tokens); later requests pay it back, so hedges still stay within ``ratio``."""
        self._tokens -= _SCALE
        self.granted += 1


class RateBucket:
    """A tenant's quota: ``rate`` tokens per second, at most ``burst`` held; starts full.

    Takes are all or nothing, and succeed when at most ``_SLACK`` (1e-9) tokens short.

    Refill is computed lazily from the time of the last call.  Time never counts twice: a
    ``now`` earlier than one already seen adds nothing, and later calls refill only from the
    latest time seen.  So over any sequence of calls the bucket grants at most
    ``burst + rate * (latest now - first now) + 1e-9`` tokens, whatever the clock does; the
    price of a clock that really jumps back is a refill that pauses until it catches up.
    """

    __slots__ = ("rate", "burst", "_tokens", "_last")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        _check(rate, burst)
        if not math.isfinite(now):
            raise ValueError("now must be finite")
        self.rate = rate
        """Tokens per second (read-only: change it with ``reconfigure``)."""
        self.burst = burst
        """Tokens held at most (read-only: change it with ``reconfigure``)."""
        self._tokens = burst
        self._last = now

    def _refill(self, now: float) -> float:
        """Bring the fill up to ``now`` and return it."""
        tokens = self._tokens
        elapsed = now - self._last
        if elapsed > 0.0:  # False for a clock going back (and for NaN)
            self._last = now
            if tokens < self.burst:
                tokens += elapsed * self.rate
                if tokens > self.burst:
                    tokens = self.burst
                self._tokens = tokens
        return tokens

    def try_take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many; take nothing otherwise."""
        if not n > 0.0:
            raise ValueError("n must be > 0")
        tokens = self._refill(now)
        if tokens + _SLACK >= n:
            self._tokens = tokens - n
            return True
        return False

    def retry_after(self, now: float, n: float = 1.0) -> float:
        """Seconds from ``now`` until ``n`` tokens are there (0.0 if they are now; inf if
        ``n > burst`` or ``rate == 0``, as they never will be), assuming nothing else takes
        any.  Exact: ``try_take(now + retry_after(now, n), n)`` succeeds.  Changes nothing.
        """
        if not n > 0.0:
            raise ValueError("n must be > 0")
        if n > self.burst:
            return _INF
        if math.isnan(now):
            raise ValueError("now is NaN")
        tokens, last, rate = self._tokens, self._last, self.rate
        have = tokens
        if now > last and have < self.burst:
            have = min(have + (now - last) * rate, self.burst)
        if have + _SLACK >= n:
            return 0.0
        if rate == 0.0:
            return _INF
        # The wait counts from ``now``, the refill from ``last`` (later than ``now`` if the
        # clock went back).  Rounding may leave ``try_take`` a few ulps short at the first
        # estimate, so step forward, doubling the step, until the very arithmetic of
        # ``_refill`` grants ``n``.
        wait = (n - have) / rate + (last - now if last > now else 0.0)
        step = math.ulp(max(wait, abs(now + wait)))
        for _ in range(256):
            if tokens + ((now + wait) - last) * rate + _SLACK >= n:
                break
            wait += step
            step *= 2.0
        return wait

    def reconfigure(self, rate: float, burst: float, now: float) -> None:
        """Change the quota, keeping the current fill (capped at the new ``burst``): a new
        quota neither refunds a tenant's recent use nor takes away what it has left."""
        _check(rate, burst)
        tokens = self._refill(now)
        self.rate = rate
        self.burst = burst
        self._tokens = tokens if tokens < burst else burst


def _check(rate: float, burst: float) -> None:
    if not 0.0 <= rate < _INF:
        raise ValueError("rate must be finite and >= 0")
    if not 0.0 < burst < _INF:
        raise ValueError("burst must be finite and > 0")
