"""The scheduler's decisions: which leases to reap and which jobs to place where.

Sans-I/O: :func:`plan` takes the placements group's documents, the trainers the node sees
(from gossip) and ``now``, and returns the commands to propose.  The placements group's
leader runs it every tick (``meshd/train/service.py``); the lease table, not this function,
is the judge: a command built on a stale view is refused there (``live``, ``busy``,
``held``) and the next tick plans again from the newer view.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.model import GpuState
from meshd.train.placement import GpuSlot, Rtt, RttRows, Unplaceable, rank
from meshd.train.spec import parse_job

TTL = 5.0
"""Seconds each renewal extends a lease by (trainers renew every ~1.3 s)."""
START_TIMEOUT = 15.0
"""Seconds a new lease waits for its trainer's first renewal (process start included)."""
CPU = "cpu"
"""``gpu_type`` of a CPU slot: jobs asking for 0 GPUs run there, and only there."""
TRIED_AFTER = 2 * TTL
"""Seconds a re-queued job waits for a node where none of its leases lapsed before it may go
back to one where one did: a node that just failed the job is the last resort."""
EXPIRE_GRACE = 0.2
"""Seconds past a lease's expiry, by this node's clock, before reaping it is proposed (the
table rechecks with the proposing coordinator's clock)."""


@dataclass(frozen=True)
class Trainer:
    """A live trainer as gossip shows it."""

    node: str
    slots: tuple[GpuSlot, ...]
    schedulable: bool = True
    """False when cordoned, draining or quarantined."""


def split_slots(trainers: Iterable[Trainer]) -> dict[bool, list[GpuSlot]]:
    """The trainers' slots by kind: ``[True]`` CPU slots, the only ones a job asking for 0
    GPUs may take (:attr:`JobSpec.cpu_only`); ``[False]`` GPUs, for every other job."""
    out: dict[bool, list[GpuSlot]] = {True: [], False: []}
    for t in trainers:
        for s in t.slots:
            out[s.gpu_type == CPU].append(s)
    return out


def parts_of(placement: dict[str, Any]) -> list[dict[str, Any]]:
    """A TrainingPlacement's (or TrainingJob's) parts: ``{node, gpus, outcome}`` per node in
    rank order (documents written before gangs have only ``node`` and ``gpus``)."""
    return placement.get("parts") or [{"node": placement["node"], "gpus": placement["gpus"],
                                       "outcome": ""}]


def plan(jobs: Iterable[dict[str, Any]], placements: dict[str, dict[str, Any]],
         trainers: Collection[Trainer], now: float, *, ttl: float = TTL,
         start_timeout: float = START_TIMEOUT, quotas: Mapping[str, int | None] | None = None,
         rtt: Rtt | None = None, rtt_rows: RttRows | None = None) -> list[dict[str, Any]]:
    """Commands for this tick.

    ``jobs``: TrainingJob specs with ``name`` added; ``placements``: TrainingPlacement specs by
    job; ``quotas``: tenant -> GPUs its jobs may hold at once (TenantQuota ``training_gpus``;
    absent or None = unlimited); ``rtt(a, b)`` and ``rtt_rows(names)``: estimated seconds
    between nodes, for jobs over several nodes (see :func:`meshd.train.placement.rank`).  A
    lapsed lease is reaped (``expire``) before its job is placed again, on the next tick.
    Queued jobs go by priority, then age; each takes the best candidate not already taken
    this tick.  A job its tenant's quota cannot take now waits, and lower-priority jobs of
    other tenants go ahead of it.
    """
    out: list[dict[str, Any]] = []
    jobs = list(jobs)
    by_name = {j["name"]: j for j in jobs}
    live = {name: [part for part in parts_of(p) if not part.get("outcome")]
            for name, p in placements.items()}  # a released part's rank has exited
    busy = {(part["node"], g) for parts in live.values() for part in parts
            for g in part["gpus"]}
    quotas = quotas or {}
    held: Counter[str] = Counter()
    for name, parts in live.items():
        if name in by_name:
            held[by_name[name]["job"]["tenant"]] += sum(len(part["gpus"]) or 1
                                                        for part in parts)
    for name, p in sorted(placements.items()):
        j = by_name.get(name)
        expires = float((p.get("lease") or {}).get("expires_unix", 0.0))
        if j is not None and j["state"] in ("placed", "running") and \
                expires + EXPIRE_GRACE < now:
            out.append({"op": "expire", "job": name, "token": j["token"], "at": now})
    blocked = {t.node for t in trainers if not t.schedulable}
    offered = split_slots(trainers)
    queued = sorted((j for j in jobs if j["state"] == "queued" and not j["cancel"]),
                    key=lambda j: (-j["job"]["priority"], j["submitted_at"] or 0.0, j["name"]))
    for j in queued:
        spec = parse_job(j["job"])
        tenant, want = j["job"]["tenant"], spec.slots
        limit = quotas.get(tenant)
        if limit is not None and held[tenant] + want > limit:
            continue
        needs = spec.needs()
        slots = offered[spec.cpu_only]
        try:
            candidates = rank(needs, slots, excluded_nodes=blocked | set(j["tried"]),
                              busy=busy, rtt=rtt, rtt_rows=rtt_rows, limit=1)
            if not candidates and now - (j.get("queued_at") or 0.0) >= TRIED_AFTER:
                # a node where a lease lapsed is the last resort, not excluded for good
                candidates = rank(needs, slots, excluded_nodes=blocked, busy=busy, rtt=rtt,
                                  rtt_rows=rtt_rows, limit=1)
        except Unplaceable:  # the trainer that could hold it left; it waits for one
            continue
        if not candidates:  # every eligible slot is leased, or its node is not schedulable
            continue
        best = candidates[0]
        parts = [{"node": n, "gpus": [s.gpu for s in best.slots if s.node == n]}
                 for n in best.nodes]
        busy.update((s.node, s.gpu) for s in best.slots)
        held[tenant] += want
        out.append({"op": "acquire", "job": j["name"], "holder": best.nodes[0], "parts": parts,
                    "ttl": ttl, "start_timeout": start_timeout, "at": now})
    return out


MIB = 1 << 20


def gpu_slots(node: str, gpus: Iterable[GpuState], zone: str = "") -> tuple[GpuSlot, ...]:
    """A GPU trainer's slots, from its NVML telemetry: each GPU, or, on a GPU in MIG mode,
    each MIG instance (a whole MIG GPU cannot take a job).  A slice's ``gpu_type`` is
    ``"<GPU name> MIG <profile>"`` (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``), so a job asks for
    a slice size by name; it shares its GPU's inference load."""
    out: list[GpuSlot] = []
    for g in gpus:
        load = (g.sm_util or 0.0) / 100.0
        if g.mig:
            out.extend(GpuSlot(node, m.uuid, f"{g.name} MIG {m.profile}",
                               m.memory_total // MIB, m.memory_free // MIB, zone,
                               inference_load=load) for m in g.mig)
        else:
            out.append(GpuSlot(node, g.uuid, g.name, g.memory_total // MIB,
                               g.memory_free // MIB, zone, inference_load=load))
    return tuple(out)


def cpu_slots(node: str, count: int, zone: str = "") -> tuple[GpuSlot, ...]:
    """A CPU-only trainer's slots (``cpu0``...): one CPU job each."""
    return tuple(GpuSlot(node, f"cpu{i}", CPU, 0, 0, zone) for i in range(count))
