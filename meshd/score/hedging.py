"""When to hedge: the delay after which a second copy of a request goes to the next target.

A hedge sent after the first target's p95 latency touches only the slowest 5% of requests,
which is where a stalled or overloaded replica shows; sent earlier it mostly doubles load.
So the delay is the target's observed latency quantile (``RoutingPolicy.hedge_quantile``),
or the SLO class's fixed ``hedge_after_ms``, and no hedge is offered when the budget is spent
(``budget.HedgeBudget``: at most ``hedge_budget`` extra requests per request), when there is
no second target, or when the delay would not leave time before the deadline.
"""

from __future__ import annotations

from meshd.score.target import Target

PREDICTED_FACTOR = 3.0
"""Without enough observed latencies, hedge after this many times the prediction: late
enough to be rare while the prediction is unproven."""


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
        delay = q if q is not None else first.p_seconds * PREDICTED_FACTOR
    delay = max(delay, floor)
    if deadline is not None and delay >= deadline:
        return 0.0
    return delay
