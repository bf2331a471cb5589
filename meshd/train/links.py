"""Collective timings fed back into placement: what gangs measured raises the RTT estimate.

Vivaldi estimates the RTT between two nodes from small probe packets; a gang's collectives
move megabytes and can be slowed by what probes never see (a congested uplink, a slow NIC,
a throttled tunnel).  Every rank that runs collectives reports their timings (the job prints
``{"comm": {...}}`` lines; the trainer publishes them in its node's signals), and the
scheduler turns them into a per-hop figure for the next plan.

A ring collective over ``n`` nodes runs in steps (``STEPS`` per op: ``2(n-1)`` for an
all-reduce); in each step every hop of the ring carries a chunk at once, so a step lasts as
long as the slowest hop.  ``seconds / steps`` is therefore an upper bound on each hop of that
ring; a hop gets the smallest bound any ring it was in gave.  A slow link keeps a high bound
while the rings that avoid it show fast ones, so the next plan's ring routes around it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from adapters.model import CommStats

STEPS = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "broadcast": 1.0,
         "all_to_all": 1.0}
"""Steps per ``n - 1`` nodes each collective takes around a ring."""
MAX_AGE = 600.0
"""Seconds a timing counts for: links change, and an old slow path may be mended."""
UNKNOWN_RTT = 0.01
"""Seconds assumed between two nodes nothing is known of (neither coordinates nor zones): a
cross-zone figure, so unknown nodes do not look close."""

Hop = tuple[str, str]


def hop(a: str, b: str) -> Hop:
    return (a, b) if a <= b else (b, a)


def observed_hops(stats: Iterable[CommStats], now: float) -> dict[Hop, float]:
    """Per hop (an unordered node pair), the least per-step time of the ring collectives it
    carried in the last ``MAX_AGE`` seconds."""
    out: dict[Hop, float] = {}
    for c in stats:
        ring = list(dict.fromkeys(c.peers))
        steps = STEPS.get(c.op, 1.0) * (len(ring) - 1)
        if len(ring) < 2 or not now - MAX_AGE <= c.at <= now + 60 or not c.seconds > 0:
            continue
        per_step = c.seconds / steps
        for i in range(len(ring)):
            h = hop(ring[i - 1], ring[i])
            if h[0] != h[1]:
                out[h] = min(out.get(h, per_step), per_step)
    return out


def link_rows(estimate_rows: Callable[[Sequence[str]], list[list[float | None]]],
              observed: dict[Hop, float]) -> Callable[[Sequence[str]], list[list[float]]]:
    """:func:`link_rtt` for every pair of ``names`` at once (``rows[i][j]``)."""
    def rows(names: Sequence[str]) -> list[list[float]]:
        out = [[UNKNOWN_RTT if v is None else v for v in row] for row in estimate_rows(names)]
        for i in range(len(names)):
            out[i][i] = 0.0
        index = {n: i for i, n in enumerate(names)}
        for (a, b), seen in observed.items():  # few hops: walk them, not every pair
            ia, ib = index.get(a), index.get(b)
            if ia is not None and ib is not None and seen > out[ia][ib]:
                out[ia][ib] = out[ib][ia] = seen
        return out
    return rows


def link_rtt(estimate: Callable[[str, str], float | None],
             observed: dict[Hop, float]) -> Callable[[str, str], float]:
    """``rtt(a, b)`` for the scheduler: the estimate (``UNKNOWN_RTT`` when there is none),
    raised to the measured per-step time where collectives crossed that hop."""
    def rtt(a: str, b: str) -> float:
        if a == b:
            return 0.0
        est = estimate(a, b)
        return max(UNKNOWN_RTT if est is None else est, observed.get(hop(a, b), 0.0))
    return rtt
