"""Model placement on a node: the asyncio shell around :mod:`meshd.models.plan` (decisions),
:mod:`meshd.models.store` (the replicated record) and a node's Triton (what it enacts).

* On the policy group's **leader**, every ``TICK`` the controller builds the fleet as this
  node sees it (gossip's liveness and zones, NVML's free memory in the fused signals, the
  node flags and ``ModelPin`` policies in the policy group, demand from the replicas'
  telemetry), plans against the committed record, and proposes the decisions.  A new leader
  plans from the same record: the decisions are fenced by each model's generation, so none is
  made twice.
* On a node with ``--model-slots`` (its Triton runs ``--model-control-mode=explicit``) the
  enactor reads the replicas the record puts on it and makes its Triton match: it loads a
  ``loading`` replica and reports it ``ready`` (or ``failed``, with Triton's reason); for a
  ``draining`` one it waits until the routers have stopped sending (they leave draining
  replicas out as soon as their copy of the policy group shows it) and the requests Triton
  holds are done, then unloads it and reports ``unloaded``; a ``ready`` replica its Triton
  lost (a restart) is loaded again.

Demand, the planner's input, is the fleet's seconds of work per second for a model: over its
ready replicas, requests per second times compute seconds per request, per execution
instance, plus what waits in the queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from consensus.group import ConsensusError
from gossip.protocol import Swim
from meshd.control.plane import ControlPlane
from meshd.models.config import PlacementConfig
from meshd.models.fleet import Gpu, Model, Node, Pin
from meshd.models.plan import Plan, plan
from meshd.models.record import (
    DRAINING,
    LOADING,
    READY,
    PlacementRecord,
    Replica,
    report_command,
)
from meshd.models.store import KIND, command, record_of
from meshd.models.wants import SECTION as WANT_SECTION
from meshd.models.wants import Wants, WantsError
from meshd.signals.wire import NodeSignals

log = logging.getLogger("meshd.models")

TICK = 1.0
"""Seconds between controller passes and enactor checks."""
WRITE_TIMEOUT = 2.0
SLOTS_TAG = "model_slots"
"""Node tag: the node's Triton takes placements (explicit model control); its value is how
many CPU-only replicas it has room for (GPU nodes are sized by NVML's free memory)."""
LOAD_TIMEOUT = 300.0
"""Seconds one load may take (Triton answers when the model is ready or has failed)."""
UNLOAD_TIMEOUT = 60.0
DRAIN_SEEN = 2.0
"""Seconds after a replica turns ``draining`` before its node looks at what it still serves:
time for every router's copy of the policy group to show it."""
DRAIN_QUIET = 1.0
"""Seconds with nothing queued and no request answered before a drained replica unloads."""
DRAIN_MAX = 120.0
"""Seconds a drain may take at most: then it unloads whatever still arrives."""
LOST_AFTER = 10.0
"""Seconds a ``ready`` replica may be missing from its answering Triton (restarted: explicit
mode starts with nothing loaded) before the node loads it again."""


class Runtime(Protocol):
    """What the enactor needs of a node's Triton (:class:`adapters.triton.TritonAdapter`)."""

    async def load_model(self, model: str, timeout: float, config: str = "") -> None: ...

    async def unload_model(self, model: str, timeout: float) -> None: ...

    async def served(self, model: str, timeout: float) -> int | None: ...

    def queued(self, model: str) -> int: ...

    def present(self, model: str) -> bool | None: ...


@dataclass(slots=True)
class _Action:
    load: str
    kind: str
    task: asyncio.Task[None]


class ModelService:
    """The controller (when leader of ``policy``) and the enactor (with a runtime)."""

    def __init__(self, node: str, control: ControlPlane, swim: Callable[[], Swim | None],
                 signals_of: Callable[[str], NodeSignals | None], *,
                 runtime: Runtime | None = None, config: PlacementConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.control = control
        self._swim = swim
        self._signals_of = signals_of
        self.runtime = runtime
        self.config = config or PlacementConfig()
        self.clock = clock
        self.last_plan: Plan | None = None
        """The controller's last plan (on the leader): desired replicas and why, per model."""
        self._actions: dict[str, _Action] = {}
        """The enactor's work in progress, by model."""
        self._missing: dict[str, float] = {}
        """Ready replicas its Triton answers without, since when (monotonic)."""
        self.wants = Wants(self.config.request_hold_s)
        """Models requested with no ready replica, here and as other nodes publish them."""
        self.changed: Callable[[], None] = lambda: None
        """Called when this node's ``want`` section should go out now (set by the agent)."""
        self.malformed = 0
        """Other nodes' ``want`` sections dropped as malformed."""
        self.gpu_used: Callable[[], Awaitable[dict[str, int] | None]] = _no_gpus
        """NVML's used memory per GPU now (read fresh), or None without GPUs (set by the
        agent): a load's footprint is the difference it makes."""
        self._loading = asyncio.Lock()
        self._configs: dict[str, str] = {}
        """The config each model's replica here loaded with (its pin's, at the time)."""
        self.on_decision: Callable[[str], None] = lambda op: None
        """Called with the op of each decision this node proposed that committed (metrics)."""
        self.on_load: Callable[[float, bool], None] = lambda seconds, ok: None
        """Called with the seconds each load here took and whether it worked (metrics)."""

    # --- what the controller sees -------------------------------------------------------------

    def fleet(self) -> list[Node]:
        """Every member whose Triton takes placements, dead ones included (their replicas
        count as gone)."""
        swim = self._swim()
        if swim is None:
            return []
        out = []
        for m in swim.members():
            tags = m.meta.tags_dict
            if SLOTS_TAG not in tags:
                continue
            try:
                slots = max(0, min(int(tags[SLOTS_TAG]), 1024))
            except ValueError:
                slots = 0
            sig = self._signals_of(m.name)
            gpus = tuple(Gpu(g.uuid or str(g.index), g.name, g.memory_free, g.memory_total)
                         for g in (sig.gpus if sig is not None else ()))
            loaded = frozenset(r.model for r in (sig.replicas if sig is not None else ())
                               if r.ready)
            flags = self.control.flags_of(m.name)
            out.append(Node(m.name, m.meta.zone, alive=m.live, cordoned="cordoned" in flags,
                            draining="draining" in flags, quarantined="quarantined" in flags,
                            gpus=gpus, cpu_slots=0 if gpus else slots, loaded=loaded))
        return out

    def models(self, record: PlacementRecord) -> list[Model]:
        """The pinned models (ModelPin policies), each with its demand and the footprint
        ``record``'s loads measured."""
        store = self.control.views["policy"].store
        demand = self.demand()
        now = self.clock()
        out = []
        for d in store.list("ModelPin"):
            name, _, revision = d.document.name.partition(":")
            footprint = record.footprint(d.document.name)
            out.append(Model(name, revision, Pin.from_spec(d.document.spec),
                             footprint_bytes=footprint,
                             footprint_source="unknown" if footprint is None else "measured",
                             demand=demand.get(name, 0.0),
                             requested_at=self.wants.latest(d.document.name, now)))
        return out

    # --- scale from zero ----------------------------------------------------------------------

    def want(self, model: str, version: str) -> bool:
        """A router here got a request for ``model`` with no ready replica: if meshd places
        it (a ModelPin for ``model:version`` or ``model``), note the want, publish it, and
        say so (the router holds the request for the replica that will come)."""
        store = self.control.views["policy"].store
        pin = next((p for k in ((f"{model}:{version}",) if version else ()) + (model,)
                    if (p := store.get("ModelPin", k)) is not None), None)
        if pin is None:
            return False
        if pin.document.spec.get("max_replicas") == 0:
            return False  # unloaded on purpose: no replica will come
        self.wants.note(pin.document.name, self.clock())
        self.changed()
        return True

    def repository_command(self, model: str, load: bool, config: str = "") -> dict[str, Any]:
        """The ModelPin patch behind Triton's repository control through the router: load =
        at least one replica (``min_replicas`` raised to 1, a ``max_replicas`` of 0 lifted;
        ``config``, when given, what every replica loads with, the loaded ones reloaded),
        unload = none (``min_replicas`` 0, ``max_replicas`` 0: drained and unloaded at once).
        Stamped with ``at`` and ``author`` by the caller."""
        stored = self.control.views["policy"].store.get("ModelPin", model)
        spec = stored.document.spec if stored is not None else {}
        if load:
            patch: dict[str, Any] = {"min_replicas": max(1, int(spec.get("min_replicas") or 0))}
            if spec.get("max_replicas") == 0:
                patch["max_replicas"] = None  # merge patch: back to no cap
            if config:
                patch["config"] = config
        else:
            patch = {"min_replicas": 0, "max_replicas": 0}
        return {"op": "patch", "kind": "ModelPin", "name": model, "spec": patch}

    def learn_wants(self, node: str, sections: dict[str, bytes]) -> None:
        """A member's ``want`` section (node-state reader)."""
        try:
            self.wants.learn(node, sections[WANT_SECTION], self.clock())
        except WantsError as exc:
            self.malformed += 1
            log.debug("malformed want section", extra={"event": "want_malformed",
                                                       "member": node, "detail": str(exc)})

    def want_section(self) -> bytes:
        """This node's ``want`` section."""
        return self.wants.section(self.clock())

    def demand(self) -> dict[str, float]:
        """Seconds of work per second per model, over the fleet's ready replicas."""
        swim = self._swim()
        out: dict[str, float] = {}
        for m in (swim.members() if swim is not None else ()):
            sig = self._signals_of(m.name)
            for r in (sig.replicas if sig is not None and m.live else ()):
                if not r.ready:
                    continue
                busy = (r.rate or 0.0) * (r.compute_seconds or 0.0) / max(1, r.instances)
                waiting = (r.queue or 0) * (r.compute_seconds or 0.0)
                out[r.model] = out.get(r.model, 0.0) + busy + waiting
        return out

    def record(self) -> PlacementRecord:
        """The placement record as this node's copy of the policy group holds it."""
        return record_of(self.control.views["policy"].store.list(KIND))

    def current_plan(self) -> Plan:
        """What the controller would decide now from this node's copy (any node can explain
        a model's placement: metrics, ``meshctl models``)."""
        record = self.record()
        return plan(self.models(record), self.fleet(), record, self.clock(), self.config)

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                if self._leads():
                    await self._control()
                if self.runtime is not None:
                    await self._enact()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("model placement pass failed", extra={"event": "models_error"})
            await asyncio.sleep(TICK)

    def _leads(self) -> bool:
        grp = self.control.groups.get("policy")
        return grp is not None and grp.status().state == "leader"

    async def _control(self) -> None:
        p = self.last_plan = self.current_plan()
        for cmd in p.commands(self.clock()):
            try:
                result = await self.control.write("policy", command(cmd), WRITE_TIMEOUT,
                                                  f"meshd/{self.node} (models)")
            except ConsensusError as exc:
                log.info("placement write failed", extra={
                    "event": "models_write_failed", "model": cmd["model"], "op": cmd["op"],
                    "detail": str(exc)})
                return
            if not result.get("ok"):  # stale: the record moved; the next pass plans again
                log.debug("placement decision not applied", extra={
                    "event": "models_decision_refused", "model": cmd["model"],
                    "op": cmd["op"], "detail": result.get("message", "")})
                return
            self.on_decision(str(cmd["op"]))
            if cmd["op"] in ("load", "unload", "refuse"):
                log.info(f"model {cmd['op']}", extra={
                    "event": f"model_{cmd['op']}", "model": cmd["model"],
                    "target": cmd.get("node", ""), "detail": cmd.get("reason", "")})

    # --- the enactor --------------------------------------------------------------------------

    def mine(self) -> list[Replica]:
        """The replicas the record puts on this node."""
        return self.record().on_node(self.node)

    async def _enact(self) -> None:
        assert self.runtime is not None
        mine = self.mine()
        for rep in mine:
            key = rep.model
            act = self._actions.get(key)
            if act is not None and not act.task.done():
                continue
            if rep.state == LOADING and (act is None or act.load != rep.load
                                         or act.kind != "load"):
                self._start(rep, "load", self._load(rep))
            elif rep.state == DRAINING and (act is None or act.load != rep.load
                                            or act.kind != "unload"):
                self._start(rep, "unload", self._unload(rep))
            elif rep.state == READY:
                self._check_present(rep)
        held = {r.model for r in mine}
        for key in [k for k, a in self._actions.items() if k not in held and a.task.done()]:
            del self._actions[key]

    def _check_present(self, rep: Replica) -> None:
        """Load a ready replica again once its Triton has answered without it for
        ``LOST_AFTER`` (the record still counts it; routers already skip it), or at once
        with its pin's new config when that changed since it loaded."""
        assert self.runtime is not None
        config = self.config_of(rep.model)
        if self._configs.get(rep.model, config) != config:
            log.info("the model's config changed; reloading it", extra={
                "event": "model_reload", "model": rep.model})
            self._start(rep, "reload", self._reload(rep))
            return
        if self.runtime.present(rep.model.partition(":")[0]) is not False:
            self._missing.pop(rep.model, None)
            return
        now = time.monotonic()
        since = self._missing.setdefault(rep.model, now)
        if now - since >= LOST_AFTER:
            del self._missing[rep.model]
            log.warning("a ready replica is gone from Triton; loading it again", extra={
                "event": "model_reload", "model": rep.model})
            self._start(rep, "reload", self._reload(rep))

    async def _reload(self, rep: Replica) -> None:
        assert self.runtime is not None
        config = self.config_of(rep.model)
        try:
            async with self._loading:
                await self.runtime.load_model(rep.model.partition(":")[0], LOAD_TIMEOUT,
                                              config)
            self._configs[rep.model] = config
        except Exception as exc:  # noqa: BLE001 - the record keeps it; the next check retries
            log.warning("model reload failed", extra={"event": "model_load_failed",
                                                      "model": rep.model, "detail": str(exc)})

    def _start(self, rep: Replica, kind: str, coro: Any) -> None:
        self._actions[rep.model] = _Action(rep.load, kind, asyncio.create_task(coro))

    def config_of(self, model: str) -> str:
        """The Triton config the model's pin says its replicas load with ("" = their own)."""
        stored = self.control.views["policy"].store.get("ModelPin", model)
        return str(stored.document.spec.get("config") or "") if stored is not None else ""

    async def _load(self, rep: Replica) -> None:
        """Load, measuring what the load took on the GPUs: loads here run one at a time, so
        the difference in NVML's used memory before and after is this model's."""
        assert self.runtime is not None
        name = rep.model.partition(":")[0]
        config = self.config_of(rep.model)
        async with self._loading:
            before = await self.gpu_used()
            started = time.monotonic()
            try:
                await self.runtime.load_model(name, LOAD_TIMEOUT, config)
                self._configs[rep.model] = config
            except Exception as exc:  # noqa: BLE001 - Triton's reason goes into the record
                log.warning("model load failed", extra={"event": "model_load_failed",
                                                        "model": rep.model, "detail": str(exc)})
                self.on_load(time.monotonic() - started, False)
                await self._report(rep, "failed", _reason(exc))
                return
            took = time.monotonic() - started
            after = await self.gpu_used()
        footprint = footprint_of(before, after)
        self.on_load(took, True)
        log.info("model loaded", extra={"event": "model_loaded", "model": rep.model,
                                        "seconds": round(took, 3),
                                        "footprint_bytes": footprint})
        await self._report(rep, "ready", footprint_bytes=footprint)

    async def _unload(self, rep: Replica) -> None:
        assert self.runtime is not None
        name = rep.model.partition(":")[0]
        began = time.monotonic()
        await asyncio.sleep(DRAIN_SEEN)
        last, quiet_since = None, time.monotonic()
        while time.monotonic() - began < DRAIN_MAX:
            served = await self.runtime.served(name, 2.0)
            busy = self.runtime.queued(name) > 0
            now = time.monotonic()
            if served is None:  # Triton has no such model (never loaded, or gone)
                break
            if served != last or busy:
                last, quiet_since = served, now
            elif now - quiet_since >= DRAIN_QUIET:
                break
            await asyncio.sleep(0.25)
        with contextlib.suppress(Exception):  # not loaded is as good as unloaded
            await self.runtime.unload_model(name, UNLOAD_TIMEOUT)
        log.info("model unloaded", extra={"event": "model_unloaded", "model": rep.model,
                                          "seconds": round(time.monotonic() - began, 3)})
        await self._report(rep, "unloaded")

    async def _report(self, rep: Replica, status: str, reason: str = "",
                      footprint_bytes: int = 0) -> None:
        cmd = command(report_command(rep.model, self.node, rep.load, status, self.clock(),
                                     reason, footprint_bytes))
        for _ in range(10):  # a leader change: try again (reports are idempotent)
            try:
                await self.control.write("policy", cmd, WRITE_TIMEOUT,
                                         f"meshd/{self.node} (models)")
                return
            except ConsensusError as exc:
                log.info("placement report failed", extra={
                    "event": "models_report_failed", "model": rep.model, "detail": str(exc)})
                await asyncio.sleep(TICK)

    async def close(self) -> None:
        for act in self._actions.values():
            act.task.cancel()
        for act in self._actions.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await act.task


async def _no_gpus() -> dict[str, int] | None:
    return None


def footprint_of(before: dict[str, int] | None, after: dict[str, int] | None) -> int:
    """Bytes a load took: what NVML's used memory grew by over the GPUs read both times
    (0 when either read is missing)."""
    if not before or not after:
        return 0
    return sum(max(0, used - before[gpu]) for gpu, used in after.items() if gpu in before)


def _reason(exc: BaseException) -> str:
    """Triton's words for a failed load, on one line."""
    text = getattr(exc, "message", None)
    msg = text() if callable(text) else str(exc)
    return " ".join(str(msg).split())[:1024] or type(exc).__name__
