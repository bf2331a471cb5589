"""Rank order for a multi-node job: a ring of its nodes with little total RTT.

Ring all-reduce sends every chunk once around the ring, so a ring's cost is the sum of its
hops' RTTs.  Finding the shortest ring is the travelling-salesman problem.  Up to
``EXACT_UP_TO`` nodes every ring is tried; gangs beyond that (tens of nodes) get
nearest-neighbour tours from every start, then 2-opt on the shortest few until no swap of
two hops shortens them: within a few per cent of optimal in about a millisecond.
Deterministic: ties break by node name, so every node computes the same ring.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

Rtt = Callable[[str, str], float]
EXACT_UP_TO = 7
"""Rings of up to this many nodes are searched exhaustively (360 rings at 7)."""
TWO_OPT_STARTS = 6
"""Nearest-neighbour tours (the shortest of those from every start) that 2-opt improves."""


def ring_rtt(ring: Sequence[str], rtt: Rtt) -> float:
    """Seconds around the ring (0 for fewer than two nodes)."""
    if len(ring) < 2:
        return 0.0
    return sum(rtt(ring[i - 1], ring[i]) for i in range(len(ring)))


def ring_order(nodes: Sequence[str], rtt: Rtt) -> list[str]:
    """``nodes`` ordered into a ring of (near-)least total RTT, starting at the first name."""
    names = sorted(set(nodes))
    n = len(names)
    if n <= 3:
        return names  # every ring of three or fewer is the same ring
    d = [[0.0 if i == j else rtt(names[i], names[j]) for j in range(n)] for i in range(n)]
    if n <= EXACT_UP_TO:  # every ring through node 0, each direction once
        tours = [(_length([0, *p], d), [0, *p])
                 for p in itertools.permutations(range(1, n)) if p[0] < p[-1]]
        return _named(min(tours)[1], names)
    nearest = [sorted(range(n), key=row.__getitem__) for row in d]
    tours = []
    for start in range(n):
        tour = [start]
        seen = [False] * n
        seen[start] = True
        for _ in range(n - 1):
            nxt = next(j for j in nearest[tour[-1]] if not seen[j])
            seen[nxt] = True
            tour.append(nxt)
        tours.append((_length(tour, d), tour))
    tours.sort()
    best: list[int] | None = None
    best_len = float("inf")
    for _, tour in tours[:TWO_OPT_STARTS]:
        tour = _two_opt(tour, d)
        length = _length(tour, d)
        if length < best_len - 1e-12:
            best, best_len = tour, length
    assert best is not None
    return _named(best, names)


def _named(best: list[int], names: list[str]) -> list[str]:
    k = best.index(0)
    ring = best[k:] + best[:k]
    if ring[1] > ring[-1]:  # one direction, so the same ring always reads the same
        ring = [ring[0]] + ring[1:][::-1]
    return [names[i] for i in ring]


def _length(tour: list[int], d: list[list[float]]) -> float:
    return sum(d[tour[i - 1]][tour[i]] for i in range(len(tour)))


def _two_opt(tour: list[int], d: list[list[float]]) -> list[int]:
    n = len(tour)
    improved = True
    while improved:
        improved = False
        for i in range(n - 1):
            for j in range(i + 2, n if i else n - 1):
                a, b, c, e = tour[i], tour[i + 1], tour[j], tour[(j + 1) % n]
                if d[a][c] + d[b][e] < d[a][b] + d[c][e] - 1e-12:
                    tour[i + 1:j + 1] = reversed(tour[i + 1:j + 1])
                    improved = True
    return tour
