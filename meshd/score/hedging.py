"""When to hedge: the delay after which a second copy of a request goes to the next target.

A hedge sent after the first target's p99 latency touches only the slowest 1% of requests,
which is where a stalled or overloaded replica shows; sent earlier it mostly adds load, and
at p95 the ordinary tail alone spent a 5% budget and left none for stalls (``bench/routing``).
A target that stalls now and then has a latency quantile inflated by its own stalls, just
when its requests need the hedge; so the delay is also capped at ``PREDICTED_FACTOR`` times
this request's prediction: a request three times later than predicted is late whatever the
target's history.  So the delay is the sooner of the two (``RoutingPolicy.hedge_quantile``),
or the SLO class's fixed ``hedge_after_ms``, and no hedge is offered when the budget is spent
(``budget.HedgeBudget``: at most ``hedge_budget`` extra requests per request), when there is
no second target, or when the delay would not leave time before the deadline.
"""

from __future__ import annotations

from meshd.score.target import Target

PREDICTED_FACTOR = 3.0
"""Hedge after this many times the request's prediction at the latest (and always, without
enough observed latencies): late enough to be rare while predictions are corrected by
outcomes."""


def hedge_after(first: Target, quantile: float, fixed: float | None, deadline: float | None,
                floor: float) -> float:
    """Seconds after which to send the hedge, or 0 for none.

    ``fixed`` is the SLO class's delay, ``deadline`` the seconds the request has left (None:
    none), ``floor`` the shortest delay worth hedging at.
    """
    if fixed is not None:
        delay = fixed
    else:
        q = first.stats.latency.quantile(quantile)
        delay = first.p_seconds * PREDICTED_FACTOR
        if q is not None and q < delay:
            delay = q
    delay = max(delay, floor)
    if deadline is not None and delay >= deadline:
        return 0.0
    return delay
