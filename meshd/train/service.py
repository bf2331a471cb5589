"""The training scheduler and the trainer role on a node: the asyncio shell around
:mod:`meshd.train.scheduler` (decisions), :mod:`meshd.train.board` (the replicated state)
and :class:`meshd.train.leases.LeaseKeeper` (when a trainer must stop).

* On the placements group's **leader**, every ``TICK`` it plans from its own copy of the
  group and proposes the commands (reap lapsed leases, place queued jobs).
* On a node with ``--role trainer`` it watches the group for leases with a part on this
  node and runs each job (:class:`meshd.train.run.JobRun`; a gang's rank) as a child
  process.

Trainers advertise what they offer through gossip: their GPUs (the NVML adapter's telemetry
in the node's signals) or, without GPUs, ``train_slots`` CPU slots (a node tag; default 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.trace import Tracer

from adapters.model import CommStats
from consensus.group import ConsensusError
from gossip.protocol import Swim
from meshd.control.plane import ControlPlane
from meshd.train.links import link_rows, link_rtt, observed_hops
from meshd.train.placement import Rtt, RttRows
from meshd.train.run import JobRun
from meshd.train.scheduler import Trainer, cpu_slots, gpu_slots, parts_of, plan

log = logging.getLogger("meshd.train")

TICK = 0.2
"""Seconds between scheduler passes and trainer checks."""
WRITE_TIMEOUT = 2.0
SLOTS_TAG = "train_slots"
"""Node tag: how many CPU jobs a trainer without GPUs runs at once (default 1)."""


class TrainService:
    """Scheduler (when leader of ``placements``) and trainer (with the role) on one node."""

    def __init__(self, node: str, control: ControlPlane, swim: Callable[[], Swim | None],
                 gpus_of: Callable[[str], list[Any]], *, trainer: bool, data_dir: Path,
                 rtt: Callable[[str, str], float | None] = lambda a, b: None,
                 rtt_rows: Callable[[Sequence[str]], list[list[float | None]]] | None = None,
                 comm_of: Callable[[], list[CommStats]] = list,
                 report_comm: Callable[[CommStats], None] = lambda stats: None) -> None:
        self.node = node
        self.control = control
        self._swim = swim
        self._gpus_of = gpus_of
        self._rtt = rtt
        self._rtt_rows = rtt_rows
        self._comm_of = comm_of
        self.report_comm = report_comm
        """Takes the collective timings this node's jobs print (fed back into plans)."""
        self.trainer = trainer
        self.data_dir = data_dir
        self.runs: dict[str, JobRun] = {}
        self.tracer: Tracer | None = None
        """Set when tracing is on: each rank's attempt is a span (:mod:`meshd.train.spans`)."""
        self._tasks: set[asyncio.Task[None]] = set()

    # --- what the mesh offers ---------------------------------------------------------------

    def trainers(self) -> list[Trainer]:
        """Live trainers and their slots, as this node sees them."""
        swim = self._swim()
        if swim is None:
            return []
        out = []
        for m in swim.members():
            if not m.live or "trainer" not in m.meta.roles:
                continue
            zone = m.meta.zone
            gpus = self._gpus_of(m.name)
            if gpus:
                slots = gpu_slots(m.name, gpus, zone)
            else:
                try:
                    count = int(m.meta.tags_dict.get(SLOTS_TAG, "1"))
                except ValueError:
                    count = 1
                slots = cpu_slots(m.name, max(0, min(count, 256)), zone)
            flags = self.control.flags_of(m.name)
            out.append(Trainer(m.name, slots, schedulable=not flags))
        return out

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                if self._leads():
                    await self._schedule()
                if self.trainer:
                    self._supervise()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("training pass failed", extra={"event": "train_error"})
            await asyncio.sleep(TICK)

    def _leads(self) -> bool:
        grp = self.control.groups.get("placements")
        return grp is not None and grp.status().state == "leader"

    def jobs(self) -> list[dict[str, Any]]:
        store = self.control.views["placements"].store
        return [{**d.document.spec, "name": d.document.name} for d in store.list("TrainingJob")]

    def quotas(self) -> dict[str, int | None]:
        """Tenant -> GPUs its training jobs may hold at once (TenantQuota ``training_gpus``)."""
        store = self.control.views["policy"].store
        return {d.document.name: d.document.spec["training_gpus"]
                for d in store.list("TenantQuota")}

    def placements(self) -> dict[str, dict[str, Any]]:
        store = self.control.views["placements"].store
        return {d.document.name: d.document.spec for d in store.list("TrainingPlacement")}

    def rtt(self) -> tuple[Rtt, RttRows | None]:
        """Seconds between nodes for this tick's plans, pair by pair and all pairs at once:
        Vivaldi's estimate, raised to what the gangs' collectives measured over each hop
        (:mod:`meshd.train.links`)."""
        observed = observed_hops(self._comm_of(), time.time())
        rows = link_rows(self._rtt_rows, observed) if self._rtt_rows is not None else None
        return link_rtt(self._rtt, observed), rows

    def address_of(self, node: str) -> str:
        """The host ``node`` gossips from (where its ranks listen), or "" if unknown."""
        swim = self._swim()
        m = swim.member(node) if swim is not None else None
        return m.addr[0] if m is not None else ""

    async def _schedule(self) -> None:
        rtt, rows = self.rtt()
        for cmd in plan(self.jobs(), self.placements(), self.trainers(), time.time(),
                        quotas=self.quotas(), rtt=rtt, rtt_rows=rows):
            try:
                result = await self.control.write("placements", cmd, WRITE_TIMEOUT,
                                                  f"meshd/{self.node} (scheduler)")
            except ConsensusError as exc:
                log.info("scheduler write failed", extra={
                    "event": "train_schedule_failed", "job": cmd["job"], "op": cmd["op"],
                    "detail": str(exc)})
                return
            level = logging.INFO if result.get("ok") else logging.DEBUG
            log.log(level, f"job {cmd['op']}", extra={
                "event": f"job_{cmd['op']}", "job": cmd["job"], "node": cmd.get("node", ""),
                "detail": result.get("message", ""), "ok": bool(result.get("ok"))})

    def _supervise(self) -> None:
        """Start a run for every lease with a part on this node that has none yet."""
        jobs = {j["name"]: j for j in self.jobs()}
        for name, p in self.placements().items():
            j = jobs.get(name)
            if j is None or not any(part["node"] == self.node and not part["outcome"]
                                    for part in parts_of(p)):
                continue
            current = self.runs.get(name)
            if current is not None and (current.token == j["token"] or not current.finished):
                continue
            run = JobRun(self, name, j, self.data_dir / "jobs" / name)
            self.runs[name] = run
            task = asyncio.create_task(run.run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def write(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return await self.control.write("placements", {**cmd, "at": time.time()}, WRITE_TIMEOUT,
                                        f"meshd/{self.node} (trainer)")

    def drain_deadline(self) -> float | None:
        """The wall-clock time this node's drain must be over by, or None when not draining."""
        draining = self.control.views["policy"].store.node_flags(self.node).get("draining")
        if not draining:
            return None
        deadline = draining.get("deadline_unix") if isinstance(draining, dict) else None
        return float(deadline) if isinstance(deadline, int | float) else time.time()

    async def close(self) -> None:
        """Stop every job this node runs (the leases lapse; the jobs move elsewhere)."""
        for run in list(self.runs.values()):
            run.kill("meshd is shutting down")
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
