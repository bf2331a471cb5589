"""Where a training job goes: rank (node, GPUs) candidates by when the job would finish.

Sans-I/O and deterministic: the scheduler hands in the GPUs it knows of (from the fused
view: NVML's free memory and utilization, the leases' backlog) and gets back candidates,
best first.  The first one the placements group grants a lease on wins; the rest are the
failover order.

A candidate's cost is in seconds, so its parts add up and read plainly:

    cost = backlog + work / (speed * (1 - inference_share * load)) + fit + comm

* ``backlog`` - seconds of training already leased on the slowest of the chosen GPUs;
* the job's own ``work`` (seconds on a free GPU of speed 1), slowed by the inference load
  the GPU carries (a serving GPU gives training only part of its time);
* ``fit`` - best fit: a job that leaves a big GPU's memory unused pays for it (``FIT_SECONDS``
  per unused GPU), so large GPUs stay free for the jobs that need them;
* ``comm`` - for a gang spread over several nodes, the estimated RTT around the ring of
  its nodes times the collective rounds the job expects; 0 on one node.

A multi-GPU job runs on one node (its GPUs share a host, and no RTT is paid) unless it asks
for ``nodes`` (a ``torchrun --nnodes`` job): then it gets exactly that many, with an equal
share of its GPUs on each (each rank runs the same command, so shares must match).  The
node set is grown from each of the cheapest few nodes by adding the one that costs least
counting its RTT to the set, so a far node joins only when it is much less busy.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from meshd.train.ring import ring_order, ring_rtt

FIT_SECONDS = 30.0
"""Cost, per GPU, of leaving its whole memory unused (scaled by the unused share)."""
INFERENCE_SHARE = 0.5
"""Share of a GPU's time inference keeps when a training job shares it, at full load."""


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU (or MIG slice) as the scheduler sees it."""

    node: str
    gpu: str
    gpu_type: str
    vram_total_mb: int
    vram_free_mb: int
    zone: str = ""
    backlog_s: float = 0.0
    """Seconds of training work already leased here."""
    inference_load: float = 0.0
    """0..1: how busy inference keeps the GPU (NVML utilization)."""
    speed: float = 1.0
    """Relative training throughput (1 = the reference GPU)."""


@dataclass(frozen=True, slots=True)
class Needs:
    """What a job asks of the GPUs it runs on."""

    gpus: int
    work_s: float
    """Estimated seconds of work on one free GPU of speed 1 (per GPU for a gang)."""
    min_free_vram_mb: int = 0
    gpu_type: str = ""
    """A GPU product name to match exactly; empty = any."""
    zones: tuple[str, ...] = ()
    """Zones the job may run in; empty = any."""
    collective_rounds: float = 1000.0
    """Synchronizations a multi-node gang expects (each pays the ring's RTT)."""
    nodes: int = 0
    """Exactly this many nodes, ``gpus / nodes`` GPUs on each; 0 = as few as fit."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A place for the job: GPUs per node, in ring order, and the cost's parts."""

    slots: tuple[GpuSlot, ...]
    cost: float
    parts: dict[str, float] = field(compare=False)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.node for s in self.slots))


class Unplaceable(ValueError):
    """No GPU set in the fleet could ever take the job (not merely none free now)."""


def eligible(needs: Needs, slot: GpuSlot) -> bool:
    """Whether the slot could run the job at all, ignoring what runs on it now."""
    return ((not needs.gpu_type or slot.gpu_type == needs.gpu_type)
            and slot.vram_total_mb >= needs.min_free_vram_mb
            and (not needs.zones or slot.zone in needs.zones))


def slot_cost(needs: Needs, slot: GpuSlot) -> float:
    """Seconds until the job would be done on this one GPU, plus its fit penalty."""
    share = 1.0 - INFERENCE_SHARE * min(max(slot.inference_load, 0.0), 1.0)
    unused = (slot.vram_free_mb - needs.min_free_vram_mb) / slot.vram_total_mb \
        if slot.vram_total_mb > 0 else 0.0
    return slot.backlog_s + needs.work_s / (slot.speed * share) + FIT_SECONDS * unused


Rtt = Callable[[str, str], float]
RttRows = Callable[[Sequence[str]], list[list[float]]]
"""``rows(names)[i][j]``: the RTT between ``names[i]`` and ``names[j]``, every pair at once."""


def rank(needs: Needs, slots: Iterable[GpuSlot], *, excluded_nodes: Collection[str] = (),
         busy: Collection[tuple[str, str]] = (), rtt: Rtt | None = None,
         rtt_rows: RttRows | None = None, limit: int = 5) -> list[Candidate]:
    """The ``limit`` best candidates for ``needs``, cheapest first (ties by node and GPU
    name, so every coordinator ranks alike).  A job on one node gets at most one candidate
    per node: the list is the failover order, and failing over to the node that just failed
    would not help.  A gang (``needs.nodes`` > 1) gets node sets, which may overlap.

    ``excluded_nodes``: cordoned, draining or quarantined nodes; ``busy``: (node, gpu) pairs
    another job's live lease holds; ``rtt(a, b)``: estimated seconds between two nodes (for
    gangs; without it every pair counts as equally near), and ``rtt_rows`` the same for many
    pairs at once (faster, when the estimator can).  Raises :class:`Unplaceable` when
    no set of GPUs in ``slots`` could ever hold the job, whatever is running: asking for more
    than the fleet has is an error, not a wait.
    """
    if needs.gpus < 1:
        raise ValueError("needs.gpus must be >= 1")
    per, rem = divmod(needs.gpus, max(1, needs.nodes))
    if per < 1 or rem:
        raise ValueError("needs.gpus must be a multiple of needs.nodes")
    could, free = _usable(needs, slots, excluded_nodes, busy)
    fits = sum(1 for n in could.values() if n >= per)
    if fits < max(1, needs.nodes):
        if needs.nodes > 1:
            raise Unplaceable(
                f"no {needs.nodes} nodes in the fleet have {per} matching GPU(s) each "
                f"({_wanted(needs)}): {fits} do")
        raise Unplaceable(
            f"no node in the fleet has {needs.gpus} matching GPU(s) ({_wanted(needs)}): the "
            f"most on one node is {max(could.values(), default=0)}; a job over several "
            f"nodes says so with gpus.nodes")
    best = {node: _share(costs, per) for node, costs in free.items() if len(costs) >= per}
    if needs.nodes > 1:
        return _gang(needs, best, rtt or _no_rtt, rtt_rows, limit)
    out = sorted((cost, (node, *(g for _, g, _ in chosen)), chosen)
                 for node, (cost, chosen) in best.items())
    return [Candidate(tuple(s for _, _, s in chosen), cost, {"slowest": cost, "comm": 0.0})
            for cost, _, chosen in out[:limit]]


Costed = tuple[float, str, GpuSlot]
"""A free slot's cost for the job, its GPU id (for ties), and the slot."""


def _usable(needs: Needs, slots: Iterable[GpuSlot], excluded_nodes: Collection[str],
            busy: Collection[tuple[str, str]]
            ) -> tuple[dict[str, int], dict[str, list[Costed]]]:
    """Per node: how many slots could ever take the job, and the free ones, costed."""
    could: dict[str, int] = defaultdict(int)
    free: dict[str, list[Costed]] = defaultdict(list)
    for slot in slots:
        if not eligible(needs, slot):
            continue
        could[slot.node] += 1
        if not (slot.node in excluded_nodes or (slot.node, slot.gpu) in busy
                or slot.vram_free_mb < needs.min_free_vram_mb):
            free[slot.node].append((slot_cost(needs, slot), slot.gpu, slot))
    return could, free


def _share(costs: list[Costed], per: int) -> tuple[float, tuple[Costed, ...]]:
    """A node's ``per`` cheapest free slots, by GPU id, and the cost of the slowest."""
    chosen = heapq.nsmallest(per, costs)
    return max(c for c, _, _ in chosen), tuple(sorted(chosen, key=lambda c: c[1]))


def _wanted(needs: Needs) -> str:
    return (f"type {needs.gpu_type or 'any'}, >= {needs.min_free_vram_mb} MiB, zones "
            f"{list(needs.zones) or 'any'}")


GANG_SEEDS = 8
"""Cheapest nodes a fixed-size gang's node set is grown from."""
GANG_POOL = 16
"""A fixed-size gang of ``n`` nodes is chosen among the ``GANG_POOL + 2n`` cheapest: a busier
node would only join for a shorter RTT, and that leaves several near sets to choose from
while the RTTs looked up stay few (each is a Vivaldi estimate)."""
GANG_RINGS = 3
"""Node sets (at least; ``limit`` if more) whose least-RTT ring is computed; the others are
judged by the ring they grew in."""


def _no_rtt(a: str, b: str) -> float:
    return 0.0


def _gang(needs: Needs, best: dict[str, tuple[float, tuple[Costed, ...]]], rtt: Rtt,
          rtt_rows: RttRows | None, limit: int) -> list[Candidate]:
    """Candidates of exactly ``needs.nodes`` of the nodes in ``best`` (each node's share)."""
    names = sorted(best, key=lambda n: (best[n][0], n))[:GANG_POOL + 2 * needs.nodes]
    cost = [best[n][0] for n in names]
    rounds = needs.collective_rounds
    rows: dict[int, list[float]] = dict(enumerate(rtt_rows(names))) if rtt_rows else {}

    def row(i: int) -> list[float]:
        """RTTs from ``names[i]`` to every candidate (looked up once per node)."""
        if i not in rows:
            rows[i] = [0.0 if j == i else rows[j][i] if j in rows else rtt(names[i], names[j])
                       for j in range(len(names))]
        return rows[i]

    def dist(a: str, b: str) -> float:
        return row(index[a])[index[b]]

    index = {n: i for i, n in enumerate(names)}
    groups: dict[tuple[str, ...], float] = {}
    for seed in range(min(GANG_SEEDS, len(names))):
        group = [seed]
        near = row(seed)  # RTT from each candidate to the group
        while len(group) < needs.nodes:
            score = [c + rounds * d for c, d in zip(cost, near, strict=True)]
            for g in group:
                score[g] = math.inf
            nxt = min(range(len(names)), key=score.__getitem__)
            if score[nxt] == math.inf:
                break  # fewer candidates than nodes
            group.append(nxt)
            near = [a if a < b else b for a, b in zip(near, row(nxt), strict=True)]
        key = tuple(sorted(names[i] for i in group))
        if len(group) == needs.nodes and key not in groups:
            groups[key] = max(cost[i] for i in group) + rounds * ring_rtt(
                [names[i] for i in group], dist)
    out = []
    for key in sorted(groups, key=lambda k: (groups[k], k))[:max(limit, GANG_RINGS)]:
        ring = ring_order(key, dist)
        comm = ring_rtt(ring, dist) * rounds
        slowest = max(best[n][0] for n in ring)
        picked = tuple(s for n in ring for _, _, s in best[n][1])
        out.append(Candidate(picked, slowest + comm, {"slowest": slowest, "comm": comm}))
    return sorted(out, key=lambda c: (c.cost, c.nodes))[:limit]
