"""The placement controller's decisions: which model replicas to load, drain or give up on.

Sans-I/O and deterministic: :func:`plan` takes the models (pins, footprints, demand), the
nodes (liveness, flags, GPUs' free memory, CPU slots), the placement record and ``now``, and
returns decisions for the policy group's leader to propose, and per model a summary (desired,
placed, ready, why).  No clock, no randomness; every tie is broken by name, so a new leader
looking at the same record and fleet derives the same decisions, with the same ids, and
the record (:mod:`meshd.models.record`) applies a repeated one as a no-op.

Each model, in key order:

1. **Its replicas, as they count.**  A replica on a node that left the fleet is forgotten; one
   on a node gossip declares dead is drained (it unloads if the node returns) and counts as
   gone; a load outstanding past ``load_timeout_s`` is drained as a failed load.  Replicas on
   draining or quarantined nodes are not routed to, so they do not count (they stay; a
   cordoned node keeps serving what it has, so those count).  A replica outside its pin's
   ``nodes``/``zones``/``gpu_types`` (the pin changed) is replaced first and unloaded once
   enough others are ready.  A model a node's Triton reports loaded that meshd did not
   place counts too (it serves), but is never unloaded.
2. **How many it should have** (:func:`meshd.models.sizing.size`): the pin's floor, demand
   over target utilisation with hysteresis, the cap, the scale-down cool-down.
3. **Scale down**: drain the surplus (loading replicas first, then from the zone with the
   most, then the busiest node) - always drain then unload, never cut requests in flight.

Then the additions, over every model: first each model's floor (``min_replicas``, a request
from zero), then the rest of demand, each round largest footprint first (first-fit
decreasing: the big models get the big holes before small ones fragment them), so when
memory is short pins beat demand and nothing large is starved by many small loads.

**Where a replica goes.**  Only schedulable nodes (alive; not cordoned, draining or
quarantined) that the pin allows, that do not hold the model already (one replica per
Triton server) and are not in back-off after a failed load of it.  Across zones: the zone
with fewest replicas of the model (an outage of one zone takes as few as possible); within
it, the node holding fewest replicas of any model (spreads the requests and the blast
radius of a node failure); then by name.  On the node, the GPU:

* footprint known: **best fit**, the GPU with the least free memory that still holds it.
  Replicas cannot span GPUs, so a large model needs one large hole; filling the tightest
  hole first keeps the large ones for the models that need them (with 200 models on 1,000
  GPUs, a model refused for fragmentation is worse than two replicas sharing a GPU, which
  demand-driven scaling answers by adding replicas elsewhere);
* footprint unknown: the GPU with fewest replicas, then most free memory (the safest guess
  for a size nobody knows), provided ``min_free_vram_mb`` is met; failing a GPU, a free CPU
  slot when the pin asks for neither GPU memory nor a GPU type.

Free memory is NVML's reading less the footprints of loads still in flight (their memory is
not in the reading yet) and of the loads decided in this plan.  A model that cannot get all
the replicas it should is **refused** with the reason (too large for any free GPU memory,
naming the largest free and the footprint; no node of its GPU type; nodes in back-off; fewer
eligible nodes than replicas; no schedulable node at all); the refusal is written to the
record when its code changes, and cleared once the model is placed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from meshd.models.config import PlacementConfig
from meshd.models.fleet import MIB, Model, Node, Pin, fmt_bytes
from meshd.models.record import (
    DRAINING,
    LOADING,
    READY,
    Failure,
    ModelState,
    PlacementRecord,
    Replica,
    decision_id,
)
from meshd.models.sizing import size


@dataclass(frozen=True, slots=True)
class _Decision:
    """What every decision has: its model and the model's generation it was planned on."""

    op: ClassVar[str] = ""
    model: str
    base: int

    @property
    def id(self) -> str:
        """``<model>#<base>``: the same decision gets the same id from any leader."""
        return decision_id(self.model, self.base)

    def command(self, at: float) -> dict[str, Any]:
        """The record command (:mod:`meshd.models.record`), stamped ``at``."""
        out: dict[str, Any] = {"op": self.op, "id": self.id}
        for name in self.__dataclass_fields__:
            out[name] = getattr(self, name)
        out["at"] = at
        return out


@dataclass(frozen=True, slots=True)
class Load(_Decision):
    """Load the model on ``node`` (on ``gpu``; "" = a CPU slot), then report ready."""

    op: ClassVar[str] = "load"
    node: str
    gpu: str
    footprint_bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Unload(_Decision):
    """Drain the replica on ``node`` (routers stop sending, in-flight requests finish), then
    unload it and report ``unloaded``.  ``failed``: its load never finished."""

    op: ClassVar[str] = "unload"
    node: str
    reason: str
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Forget(_Decision):
    """Drop the replica on ``node``: the node left the fleet, nobody is left to unload it."""

    op: ClassVar[str] = "forget"
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class MarkLow(_Decision):
    """Record the scale-down cool-down: demand low since ``since`` (None = no longer low),
    needing at most ``peak`` replicas meanwhile."""

    op: ClassVar[str] = "low"
    since: float | None
    peak: int


@dataclass(frozen=True, slots=True)
class Refuse(_Decision):
    """The model cannot get the replicas it should: ``code`` (``too_large``, ``gpu_type``,
    ``backoff``, ``few_nodes``, ``no_node``; "" clears a refusal) and the reason in words."""

    op: ClassVar[str] = "refuse"
    code: str
    reason: str


Decision = Load | Unload | Forget | MarkLow | Refuse


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """One model after this plan: counts, and a line saying why."""

    model: str
    desired: int
    placed: int
    """Replicas that count (loading or ready) once this plan's decisions apply."""
    ready: int
    """Of those, ready now (routable)."""
    why: str
    refused: str = ""
    """Refusal code, "" = none; the reason is in ``why``."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A tick's decisions, in the order to propose them, and every model's summary."""

    decisions: tuple[Decision, ...]
    models: Mapping[str, ModelPlan] = field(default_factory=dict)

    def commands(self, at: float) -> list[dict[str, Any]]:
        """The decisions as record commands, stamped ``at`` (a coordinator re-stamps)."""
        return [d.command(at) for d in self.decisions]

    def of(self, kind: type[Decision]) -> list[Decision]:
        """The decisions of one kind (``plan.of(Load)``)."""
        return [d for d in self.decisions if isinstance(d, kind)]


# --- the fleet as one plan sees it ---------------------------------------------------------

class _Gpu:
    """A GPU's free memory as this plan uses it up."""

    __slots__ = ("free", "id", "replicas", "type")

    def __init__(self, id: str, type: str, free: int) -> None:
        self.id, self.type, self.free, self.replicas = id, type, free, 0


class _Fleet:
    """The nodes, with free memory, CPU slots and replica counts kept up to date as the plan
    places replicas."""

    def __init__(self, nodes: Iterable[Node], record: PlacementRecord) -> None:
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, list[_Gpu]] = {}
        self.by_id: dict[str, dict[str, _Gpu]] = {}
        self.types: dict[str, frozenset[str]] = {}
        self.load: Counter[str] = Counter()
        self.cpu_used: Counter[str] = Counter()
        self.loaded_by: dict[str, list[str]] = defaultdict(list)
        for node in sorted(nodes, key=lambda n: n.name):
            self.nodes[node.name] = node
            gpus = [_Gpu(g.id, g.type, g.free_bytes) for g in node.gpus]
            self.gpus[node.name] = gpus
            self.by_id[node.name] = {g.id: g for g in gpus}
            self.types[node.name] = frozenset(g.type for g in gpus)
            for key in node.loaded:
                self.loaded_by[key].append(node.name)
        for rep in record.replicas():
            self.load[rep.node] += 1
            gpu = self.by_id.get(rep.node, {}).get(rep.gpu)
            if gpu is not None:
                gpu.replicas += 1
                if rep.state == LOADING:  # not in NVML's reading yet
                    gpu.free -= rep.footprint_bytes
            elif not rep.gpu:
                self.cpu_used[rep.node] += 1
        for key, names in self.loaded_by.items():  # loaded outside the record: load too
            held = record.get(key).replicas
            for name in names:
                if name not in held:
                    self.load[name] += 1
        self.max_free = {n: max((g.free for g in gs), default=0) for n, gs in self.gpus.items()}
        self.schedulable = [n for n in self.nodes.values() if n.schedulable]

    def gpu_type(self, node: str, gpu: str) -> str | None:
        g = self.by_id.get(node, {}).get(gpu)
        return g.type if g else None

    def take(self, node: str, gpu: _Gpu | None, need: int) -> None:
        """Account for a replica placed on ``node`` (on ``gpu``, or a CPU slot)."""
        self.load[node] += 1
        if gpu is None:
            self.cpu_used[node] += 1
            return
        gpu.free -= need
        gpu.replicas += 1
        self.max_free[node] = max(g.free for g in self.gpus[node])


@dataclass(slots=True)
class _Work:
    """One model's state inside a plan."""

    model: Model
    state: ModelState
    base: int
    counted: list[Replica | str]
    """Replicas that count: record replicas, or the node name of one meshd did not place."""
    ready: int
    desired: int = 0
    floor: int = 0
    why: str = ""
    misplaced: list[Replica] = field(default_factory=list)
    removed: int = 0
    added: list[str] = field(default_factory=list)
    """Nodes this plan loads the model on."""
    refusal: tuple[str, str] = ("", "")


def plan(models: Iterable[Model], nodes: Iterable[Node], record: PlacementRecord, now: float,
         config: PlacementConfig | None = None) -> Plan:
    """The decisions for this tick; see the module docstring for the rules.

    ``models``: every model with a pin or demand (one per key; a model the record holds and
    ``models`` omits is treated as unpinned with no demand, so it scales down to zero after
    the cool-down); ``nodes``: every Triton node in the fleet, dead ones included (a node
    missing from the list has left, and its replicas are forgotten).
    """
    config = config or PlacementConfig()
    fleet = _Fleet(nodes, record)
    wanted = {m.key: m for m in models}
    for key in record.models:
        wanted.setdefault(key, Model(key))
    out: list[Decision] = []
    works: list[_Work] = []
    for key in sorted(wanted):
        work = _count(wanted[key], record.get(key), fleet, now, config, out)
        works.append(work)
        _size_and_shrink(work, fleet, now, config, out)
    order = sorted(works, key=lambda w: (-(w.model.footprint_bytes or 0), w.model.key))
    for floor_round in (True, False):
        for work in order:
            goal = work.floor if floor_round else work.desired
            short = min(goal, work.desired) - (len(work.counted) - work.removed + len(work.added))
            if short > 0:
                _grow(work, short, fleet, now, config, out)
    summaries = {}
    for work in works:
        _settle(work, out)
        summaries[work.model.key] = _summary(work, now, config)
    return Plan(tuple(out), summaries)


def _emit(work: _Work, out: list[Decision], decision: Decision) -> None:
    out.append(decision)
    work.base += 1


def _count(model: Model, state: ModelState, fleet: _Fleet, now: float,
           config: PlacementConfig, out: list[Decision]) -> _Work:
    """Step 1: which of the model's replicas count; drain or forget the ones that are gone."""
    work = _Work(model, state, state.gen, [], 0)
    key, pin = model.key, model.pin
    for name, rep in sorted(state.replicas.items()):
        node = fleet.nodes.get(name)
        if node is None:
            _emit(work, out, Forget(key, work.base, name, f"{name} left the fleet"))
            continue
        if rep.state == DRAINING:
            continue
        if not node.alive:
            _emit(work, out, Unload(key, work.base, name, f"{name} is down; placed elsewhere"))
            continue
        if rep.state == LOADING and now - rep.since > config.load_timeout_s \
                and key not in node.loaded:
            _emit(work, out, Unload(key, work.base, name, f"load on {name} did not finish in "
                                    f"{config.load_timeout_s:.0f} s", failed=True))
            continue
        if node.draining or node.quarantined:
            continue  # not routed to; it stays until the node is back or gone
        if not _pinned(pin, node, fleet.gpu_type(name, rep.gpu) if rep.gpu else None):
            work.misplaced.append(rep)
            continue
        work.counted.append(rep)
        work.ready += rep.state == READY or key in node.loaded
    for name in fleet.loaded_by.get(key, ()):
        node = fleet.nodes[name]
        if name not in state.replicas and node.alive and not (node.draining or
                                                                node.quarantined):
            work.counted.append(name)
            work.ready += 1
    return work


def _pinned(pin: Pin, node: Node, gpu_type: str | None) -> bool:
    """Whether an existing replica still satisfies the pin (``gpu_type`` None: a CPU slot)."""
    return pin.allows(node) and (not pin.gpu_types or gpu_type in pin.gpu_types)


def _size_and_shrink(work: _Work, fleet: _Fleet, now: float, config: PlacementConfig,
                     out: list[Decision]) -> None:
    """Steps 2 and 3: the desired count, the cool-down to record, the surplus to drain."""
    state, key = work.state, work.model.key
    s = size(work.model, len(work.counted), now, config, state.low_since, state.low_peak)
    work.desired, work.floor, work.why = s.desired, s.floor, s.why
    if (s.low_since, s.low_peak) != (state.low_since, state.low_peak):
        _emit(work, out, MarkLow(key, work.base, s.low_since, s.low_peak))
    surplus = len(work.counted) - s.desired
    if surplus <= 0:
        return
    managed = [r for r in work.counted if isinstance(r, Replica)]
    zones = Counter(fleet.nodes[r.node].zone for r in managed)
    for _ in range(min(surplus, len(managed))):
        victim = min(managed, key=lambda r: (r.state != LOADING, -zones[fleet.nodes[r.node].zone],
                                             -fleet.load[r.node], r.node))
        managed.remove(victim)
        zones[fleet.nodes[victim.node].zone] -= 1
        _emit(work, out, Unload(key, work.base, victim.node, f"scale down: {s.why}"))
        work.removed += 1


def _grow(work: _Work, short: int, fleet: _Fleet, now: float, config: PlacementConfig,
          out: list[Decision]) -> None:
    """Place up to ``short`` more replicas of the model, or say why not."""
    model, state = work.model, work.state
    pin, key = model.pin, model.key
    known = model.footprint_bytes is not None
    need = max(model.footprint_bytes or 0, pin.min_free_vram_mb * MIB)
    cpu_ok = not known and not pin.min_free_vram_mb and not pin.gpu_types
    taken = set(state.replicas)
    taken.update(r for r in work.counted if isinstance(r, str))
    taken.update(work.added)
    backoff = {n: f for n, f in state.failures.items()
               if now < f.at + config.backoff(f.count)}
    zones = Counter(fleet.nodes[r.node if isinstance(r, Replica) else r].zone
                    for r in [*work.counted, *work.added])
    causes: Counter[str] = Counter()
    small: list[Node] = []  # eligible but without the memory (or slot) for it
    by_zone: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for node in fleet.schedulable:
        name = node.name
        if name in taken:
            causes["taken"] += 1
        elif not pin.allows(node):
            causes["pin"] += 1
        elif name in backoff:
            causes["backoff"] += 1
        elif pin.gpu_types and pin.gpu_types.isdisjoint(fleet.types[name]):
            causes["type"] += 1
        elif (fleet.max_free[name] >= need and fleet.gpus[name]) or \
                (cpu_ok and node.cpu_slots > fleet.cpu_used[name]):
            by_zone[node.zone].append((fleet.load[name], name))
        else:
            causes["memory"] += 1
            small.append(node)
    heads = {z: sorted(c, reverse=True) for z, c in by_zone.items()}  # pop() takes the best
    placed = 0
    while placed < short and heads:
        zone = min(heads, key=lambda z: (zones[z], heads[z][-1], z))
        _, name = heads[zone].pop()
        if not heads[zone]:
            del heads[zone]
        slot = _slot(fleet, fleet.nodes[name], pin, need, known, cpu_ok)
        if slot is False:  # the roomiest GPU was of another type
            causes["memory"] += 1
            small.append(fleet.nodes[name])
            continue
        gpu = slot if isinstance(slot, _Gpu) else None
        fleet.take(name, gpu, need)
        zones[zone] += 1
        _emit(work, out, Load(key, work.base, name, gpu.id if gpu else "",
                              model.footprint_bytes or 0, work.why))
        work.added.append(name)
        placed += 1
    if placed < short:
        causes["taken"] += placed
        work.refusal = _refusal(work, short - placed, causes, small, fleet, need, backoff)


def _slot(fleet: _Fleet, node: Node, pin: Pin, need: int, known: bool,
          cpu_ok: bool) -> _Gpu | None | bool:
    """The GPU for a replica on ``node`` (best fit when the footprint is known, else fewest
    replicas then most free), None for a CPU slot, False when nothing there fits."""
    best: _Gpu | None = None
    for g in fleet.gpus[node.name]:
        if g.free < need or (pin.gpu_types and g.type not in pin.gpu_types):
            continue
        if best is None or (
                (g.free, g.id) < (best.free, best.id) if known else
                (g.replicas, -g.free, g.id) < (best.replicas, -best.free, best.id)):
            best = g
    if best is not None:
        return best
    if cpu_ok and node.cpu_slots > fleet.cpu_used[node.name]:
        return None
    return False


def _refusal(work: _Work, missing: int, causes: Counter[str], small: list[Node],
             fleet: _Fleet, need: int, backoff: Mapping[str, Failure]) -> tuple[str, str]:
    """Why ``missing`` replicas found no place: a code and a sentence naming the numbers."""
    model, pin = work.model, work.model.pin
    head = (f"{missing} of {work.desired} replicas unplaced" if work.desired > missing
            else f"no replica placed (wants {work.desired})")
    tally = _tally(causes, fleet)
    if causes["memory"]:
        largest, where = -1, ""
        for node in small:
            for g in fleet.gpus[node.name]:
                if (not pin.gpu_types or g.type in pin.gpu_types) and g.free > largest:
                    largest, where = g.free, f"{node.name} GPU {g.id}"
        size = (f"{model.footprint_source} footprint {fmt_bytes(model.footprint_bytes)}"
                if model.footprint_bytes is not None else "footprint unknown")
        floor = f", min_free_vram_mb {pin.min_free_vram_mb}" if pin.min_free_vram_mb else ""
        most = (f"the most free on any eligible GPU is {fmt_bytes(max(largest, 0))} ({where})"
                if largest >= 0 else "no eligible node has a GPU or a free CPU slot")
        return "too_large", (f"{head}: needs {fmt_bytes(need)} of free GPU memory ({size}"
                             f"{floor}); {most}{tally}")
    if causes["type"] and not causes["taken"]:
        return "gpu_type", (f"{head}: no schedulable node has a GPU of type "
                            f"{', '.join(sorted(pin.gpu_types))}{tally}")
    if causes["backoff"]:
        fails = "; ".join(f"{n}: {f.reason}" for n, f in sorted(backoff.items()))
        return "backoff", f"{head}: loads failed and are retried later ({fails}){tally}"
    if causes["taken"]:
        return "few_nodes", (f"{head}: every eligible node holds one replica already{tally}")
    scope = []
    if pin.nodes:
        scope.append(f"nodes {', '.join(sorted(pin.nodes))}")
    if pin.zones:
        scope.append(f"zones {', '.join(sorted(pin.zones))}")
    return "no_node", (f"{head}: no schedulable node matches the pin"
                       f"{' (' + '; '.join(scope) + ')' if scope else ''}{tally}")


_CAUSES = (("taken", "hold it"), ("memory", "too full"), ("type", "of other GPU types"),
           ("backoff", "in back-off"), ("pin", "outside the pin"))


def _tally(causes: Counter[str], fleet: _Fleet) -> str:
    """``; of 125 nodes: 3 hold it, 2 too full, 9 down, cordoned, draining or quarantined``."""
    down = len(fleet.nodes) - len(fleet.schedulable)
    parts = [f"{causes[k]} {words}" for k, words in _CAUSES if causes[k]]
    if down:
        parts.append(f"{down} down, cordoned, draining or quarantined")
    return f"; of {len(fleet.nodes)} nodes: {', '.join(parts) or 'none eligible'}"


def _settle(work: _Work, out: list[Decision]) -> None:
    """Unload misplaced replicas once enough others are ready; record a refusal's change."""
    key = work.model.key
    if work.misplaced and work.ready - work.removed >= work.desired:
        for rep in work.misplaced:
            _emit(work, out, Unload(key, work.base, rep.node,
                                    "outside the pin's nodes, zones or gpu_types"))
    code, reason = work.refusal
    if code != work.state.refused:
        _emit(work, out, Refuse(key, work.base, code, reason))


def _summary(work: _Work, now: float, config: PlacementConfig) -> ModelPlan:
    why = work.why
    if work.refusal[0]:
        why += "; refused: " + work.refusal[1]
    for name, f in sorted(work.state.failures.items()):
        if now < f.at + config.backoff(f.count):
            why += f"; load on {name} failed ({f.reason}), retried elsewhere"
    placed = len(work.counted) - work.removed + len(work.added)
    return ModelPlan(work.model.key, work.desired, placed, work.ready, why, work.refusal[0])
