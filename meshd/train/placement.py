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

A gang prefers one node: its GPUs share a host, and no RTT is paid.  Only when no node has
enough eligible GPUs are nodes combined, within one zone first.  A job that asks for
``nodes`` (a ``torchrun --nnodes`` job) gets exactly that many, with an equal share of its
GPUs on each; the node set is grown from each of the cheapest few nodes by adding the one that
costs least counting its RTT to the set, so a far node joins only when it is much less busy.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
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


def rank(needs: Needs, slots: Iterable[GpuSlot], *, excluded_nodes: Collection[str] = (),
         busy: Collection[tuple[str, str]] = (), rtt: Callable[[str, str], float] | None = None,
         limit: int = 5) -> list[Candidate]:
    """The ``limit`` best candidates for ``needs``, cheapest first (ties by node and GPU
    name, so every coordinator ranks alike), at most one per node: the list is the failover
    order, and failing over to the node that just failed would not help.

    ``excluded_nodes``: cordoned, draining or quarantined nodes; ``busy``: (node, gpu) pairs
    another job's live lease holds; ``rtt(a, b)``: estimated seconds between two nodes (for
    gangs spread over nodes; without it such gangs are not formed).  Raises
    :class:`Unplaceable` when no set of GPUs in ``slots`` could ever hold the job, whatever
    is running: asking for more than the fleet has is an error, not a wait.
    """
    if needs.gpus < 1:
        raise ValueError("needs.gpus must be >= 1")
    if needs.nodes > 1:
        return _gang(needs, slots, excluded_nodes, busy, rtt or _no_rtt, limit)
    by_node: dict[str, list[tuple[float, str, GpuSlot]]] = defaultdict(list)
    could: dict[str, int] = defaultdict(int)
    for slot in slots:
        if not eligible(needs, slot):
            continue
        could[slot.node] += 1
        if (slot.node in excluded_nodes or (slot.node, slot.gpu) in busy
                or slot.vram_free_mb < needs.min_free_vram_mb):
            continue
        by_node[slot.node].append((slot_cost(needs, slot), slot.gpu, slot))
    if sum(could.values()) < needs.gpus or (rtt is None and max(could.values(), default=0)
                                            < needs.gpus):
        raise Unplaceable(
            f"no {needs.gpus} GPU(s) in the fleet match (type {needs.gpu_type or 'any'}, "
            f">= {needs.min_free_vram_mb} MiB, zones {list(needs.zones) or 'any'}): the "
            f"largest match is {max(could.values(), default=0)} on one node, "
            f"{sum(could.values())} in all")
    out: list[tuple[float, tuple[str, ...], Candidate]] = []
    for node, costs in by_node.items():
        if len(costs) < needs.gpus:
            continue
        chosen = heapq.nsmallest(needs.gpus, costs)
        cost = max(c for c, _, _ in chosen)
        cand = Candidate(tuple(s for _, _, s in chosen), cost, {"slowest": cost, "comm": 0.0})
        out.append((cost, (node,) + tuple(g for _, g, _ in chosen), cand))
    if not out and rtt is not None and needs.gpus > 1:
        out = _spread(needs, by_node, rtt)
    out.sort(key=lambda x: (x[0], x[1]))
    return [c for _, _, c in out[:limit]]


GANG_SEEDS = 8
"""Cheapest nodes a fixed-size gang's node set is grown from."""
GANG_POOL = 16
"""A fixed-size gang of ``n`` nodes is chosen among the ``GANG_POOL + 4n`` cheapest: a busier
node would only join for a shorter RTT, and that leaves several near sets to choose from
while the RTTs looked up stay few (each is a Vivaldi estimate)."""


def _no_rtt(a: str, b: str) -> float:
    return 0.0


def _gang(needs: Needs, slots: Iterable[GpuSlot], excluded_nodes: Collection[str],
          busy: Collection[tuple[str, str]], rtt: Callable[[str, str], float],
          limit: int) -> list[Candidate]:
    """Candidates of exactly ``needs.nodes`` nodes with ``gpus / nodes`` GPUs each."""
    per, rem = divmod(needs.gpus, needs.nodes)
    if per < 1 or rem:
        raise ValueError("needs.gpus must be a multiple of needs.nodes")
    could: dict[str, int] = defaultdict(int)
    free: dict[str, list[tuple[float, str, GpuSlot]]] = defaultdict(list)
    for slot in slots:
        if not eligible(needs, slot):
            continue
        could[slot.node] += 1
        if not (slot.node in excluded_nodes or (slot.node, slot.gpu) in busy
                or slot.vram_free_mb < needs.min_free_vram_mb):
            free[slot.node].append((slot_cost(needs, slot), slot.gpu, slot))
    if sum(1 for n in could.values() if n >= per) < needs.nodes:
        raise Unplaceable(
            f"no {needs.nodes} nodes in the fleet have {per} matching GPU(s) each (type "
            f"{needs.gpu_type or 'any'}, >= {needs.min_free_vram_mb} MiB, zones "
            f"{list(needs.zones) or 'any'}): {sum(1 for n in could.values() if n >= per)} do")
    best: dict[str, tuple[float, tuple[tuple[float, str, GpuSlot], ...]]] = {}
    for node, costs in free.items():
        if len(costs) >= per:
            chosen = tuple(heapq.nsmallest(per, costs))
            best[node] = (max(c for c, _, _ in chosen), chosen)
    cheapest = sorted(best, key=lambda n: (best[n][0], n))[:GANG_POOL + 4 * needs.nodes]
    cost = {n: best[n][0] for n in cheapest}
    rounds = needs.collective_rounds
    known: dict[tuple[str, str], float] = {}

    def dist(a: str, b: str) -> float:
        key = (a, b) if a < b else (b, a)
        if key not in known:
            known[key] = rtt(*key)
        return known[key]

    groups: dict[tuple[str, ...], float] = {}
    for seed in cheapest[:GANG_SEEDS]:
        group = [seed]
        near = {n: dist(seed, n) for n in cheapest if n != seed}  # RTT to the group
        while len(group) < needs.nodes and near:
            nxt = min(near, key=lambda n: (cost[n] + rounds * near[n], n))
            group.append(nxt)
            del near[nxt]
            for n in near:
                d = dist(nxt, n)
                if d < near[n]:
                    near[n] = d
        key = tuple(sorted(group))
        if len(group) == needs.nodes and key not in groups:
            # the order the group grew in is a fair ring; the best few get the real one
            groups[key] = max(cost[n] for n in group) + rounds * ring_rtt(group, dist)
    out = []
    for key in sorted(groups, key=lambda k: (groups[k], k))[:limit]:
        ring = ring_order(key, dist)
        comm = ring_rtt(ring, dist) * rounds
        slowest = max(cost[n] for n in ring)
        picked = tuple(s for n in ring for _, _, s in sorted(best[n][1], key=lambda c: c[1]))
        out.append(Candidate(picked, slowest + comm, {"slowest": slowest, "comm": comm}))
    return sorted(out, key=lambda c: (c.cost, c.nodes))


def _spread(needs: Needs, by_node: dict[str, list[tuple[float, str, GpuSlot]]],
            rtt: Callable[[str, str], float]) -> list[tuple[float, tuple[str, ...], Candidate]]:
    """Gangs over several nodes, one per zone: the zone's cheapest GPUs, in ring order."""
    zones: dict[str, list[tuple[float, str, GpuSlot]]] = defaultdict(list)
    for costs in by_node.values():
        for c in costs:
            zones[c[2].zone].append(c)
    out = []
    for members in zones.values():
        if len(members) < needs.gpus:
            continue
        chosen = heapq.nsmallest(needs.gpus, members, key=lambda c: (c[0], c[2].node, c[1]))
        nodes = ring_order(sorted({s.node for _, _, s in chosen}), rtt)
        comm = ring_rtt(nodes, rtt) * needs.collective_rounds
        slowest = max(c for c, _, _ in chosen)
        order = {n: i for i, n in enumerate(nodes)}
        slots = tuple(sorted((s for _, _, s in chosen), key=lambda s: (order[s.node], s.gpu)))
        cand = Candidate(slots, slowest + comm, {"slowest": slowest, "comm": comm})
        out.append((slowest + comm, tuple(f"{s.node}/{s.gpu}" for s in slots), cand))
    return out
