"""The built-in strategies: ``baseline_rr``, ``least_queue``, ``p2c`` and ``hybrid``.

Each ranks by its own rule and returns at most ``ctx.limit`` targets, best first; the rest of
the list is the failover and hedge order.  All are O(n) (or O(n log k)) in the number of
targets: they run once per request.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence

from meshd.score.strategy import Context, Registry
from meshd.score.target import Target

HEADROOM_FLOOR = 0.1
"""GPU memory free share under which ``hybrid`` starts to avoid a target: a replica on a GPU
that is nearly full is one allocation away from failing (or from the trainer beside it)."""

HEADROOM_PENALTY = 1.0
"""How much of its own predicted seconds a target with no free GPU memory is charged."""

SERVICE_WEIGHT = 0.5
"""The share of a request's own service time ``hybrid`` charges a target, beside its queue.

Ranking by the whole predicted finish (queue + service: each request's own best) pours work
onto the fastest replicas until their queues are as long as a slow replica's service time,
so at high load the typical request waits behind others there: in ``bench/routing`` (1x, 1x,
2x, 5x replicas at 80% load) the full weight gave a p50 of 14.8 ms where NGINX's least_conn
had 11.9.  At half weight a slower replica takes a request once the fast ones hold half its
service time of queue: that request finishes a little later, every request behind it on the
fast replica sooner - p50 13.3 ms in the same runs, and p99 84 ms against 92 (the tail is
set by stalls, not by a slow replica's service).  An idle fast replica still wins: with no
queue anywhere the costs are the service times, halved alike."""


_by_predicted = operator.attrgetter("p_seconds")
_by_backlog = operator.attrgetter("p_backlog")


def _best(targets: Sequence[Target], k: int) -> list[Target]:
    # A C-level sort beats heapq.nsmallest's Python loop for the tens of targets a model has.
    return sorted(targets, key=_by_predicted)[:k]


class RoundRobin:
    """``baseline_rr``: each target in turn, whatever its state.  Context only: it piles onto
    slow replicas, which is what the others are measured against."""

    name = "baseline_rr"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        n = len(targets)
        i = self._next.get(ctx.model, 0) % n
        self._next[ctx.model] = i + 1
        return [targets[(i + j) % n] for j in range(min(n, ctx.limit))]


class LeastQueue:
    """``least_queue``: the shortest backlog (runtime's report or this agent's in-flight,
    whichever is larger); the first among equals is drawn at random so routers do not agree
    on one target."""

    name = "least_queue"

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        # A C-level sort, then the targets tied for the shortest backlog are rotated by a
        # random offset: each is as likely to come first, for one random draw.
        ranked = sorted(targets, key=_by_backlog)
        ties = bisect.bisect_right(list(map(_by_backlog, ranked)), ranked[0].p_backlog)
        r = int(ctx.rng.random() * ties)
        if r:
            ranked[:ties] = [*ranked[r:ties], *ranked[:r]]
        return ranked[: ctx.limit]


class PowerOfTwo:
    """``p2c``: sample two targets, take the lower predicted seconds.

    Robust to stale data: even when every router's view is equally wrong, two random
    choices spread the load instead of herding it onto the one target that looks best.
    The rest follow by predicted seconds, as failover and hedge candidates.
    """

    name = "p2c"

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        n = len(targets)
        if n == 1:
            return [targets[0]]
        i = int(ctx.rng.random() * n)
        j = int(ctx.rng.random() * (n - 1))
        if j >= i:
            j += 1
        a, b = targets[i], targets[j]
        first = a if a.p_seconds <= b.p_seconds else b
        if ctx.limit == 1:
            return [first]
        rest = _best([t for t in targets if t is not first], ctx.limit - 1)
        return [first, *rest]


class Hybrid:
    """``hybrid``: predicted seconds (which include the RTT) with the request's own service
    time at ``SERVICE_WEIGHT``, plus a penalty for leaving the agent's zone and for GPU
    memory running out, plus bounded jitter.

    The jitter is uniform in ``[0, randomization * best cost]``: targets within that
    margin of the best are treated as equals and chosen among at random, so routers sharing
    one view do not all pick the same replica, while a clearly better one still wins.
    """

    name = "hybrid"

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        rnd = ctx.rng.random
        far = ctx.routing.zone_penalty if ctx.zone else 0.0
        zone = ctx.zone
        floor = HEADROOM_FLOOR
        rebate = 1.0 - SERVICE_WEIGHT
        # Two passes (the scoring path's second and third loops over every target), then a
        # C-level sort of the indices: cheaper than heapq.nsmallest's Python loop for tens
        # of targets.  Balanced targets converge to near-equal costs, so most of them draw
        # jitter anyway.
        base = [(t.p_seconds - rebate * t.p_service)
                * (1.0 if (h := t.gpu_headroom) is None or h >= floor
                   else 1.0 + HEADROOM_PENALTY * (1 - h / floor))
                + (far if t.zone != zone else 0.0)
                for t in targets]
        spread = ctx.routing.randomization * min(base)
        costs = [c + rnd() * spread for c in base]
        order = sorted(range(len(costs)), key=costs.__getitem__)
        return [targets[i] for i in order[: ctx.limit]]


BUILTIN = {s.name: s for s in (RoundRobin, LeastQueue, PowerOfTwo, Hybrid)}
FALLBACK = PowerOfTwo.name
"""What a decision falls back to when the chosen strategy is unknown, too slow or fails."""


def default_registry(plugins: bool = True) -> Registry:
    reg = Registry()
    for name, cls in BUILTIN.items():
        reg.register(name, cls)
    if plugins:
        reg.load_plugins()
    return reg
