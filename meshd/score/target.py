"""Targets: the replicas a request for a model may go to, and what one costs.

A :class:`Target` is built from the fused view when that changes (telemetry, flags, policy)
and kept between requests, so scoring one request is arithmetic on a handful of floats per
target, not a walk over the mesh.  What varies per request (this agent's own in-flight count,
the payload's work units, the age of the queue figure) is applied in :meth:`Target.predict`.

Predicted seconds follow the Citadel design's seconds-of-work:

    queue   = backlog * units_per_request * spu / instances
    service = units * spu
    predicted = rtt + (queue + service) * correction

``backlog`` is the larger of what the runtime last reported (queued + executing, less what it
has served since it measured) and what this agent has in flight there (fresher, but only its
own share).  A single request runs on
one instance, so only the backlog is divided by ``instances``.  ``correction`` is the
EWMA of observed / predicted latency for this target: telemetry gives the shape, outcomes
correct its scale (a replica slower than its statistics say, a network hop the coordinates
miss).

A stall shows in no statistic until it ends, so one more term: when the target has answered
none of this agent's requests for longer than ``STALL_GAPS`` times the expected gap between
two answers, the time it has been silent is added to its queue - a stall that has lasted
``s`` seconds is expected to last about as long again - and new requests go elsewhere
within a few service times instead of queueing behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from adapters.model import ReplicaState
from meshd.score.config import ScoreConfig
from meshd.score.latency import LatencyWindow
from meshd.score.limiter import AdaptiveLimit
from meshd.signals.fused import FusedState, NodeEntry
from meshd.signals.wire import NodeSignals

_INF = float("inf")
_queue_at = attrgetter("queue_at")
EXCLUDING_FLAGS = frozenset({"cordoned", "draining", "quarantined"})
"""Node flags that take a node's replicas out of routing."""
STALL_GAPS = 4.0
"""Expected gaps between two answers a target may stay silent (with requests waiting) before
its silence is added to its predicted queue.  Lower reacts sooner to a stall and mistakes
more ordinary jitter for one."""
STALL_MIN = 0.002
"""Seconds of silence never taken for a stall (timer and scheduling noise)."""
ORPHAN_TTL = 1.0
"""Seconds unanswered orphans keep a target's silence counting.  Requests hedged away from a
stalled target leave it with nothing in flight from this agent; were its silence forgotten
then, the next requests would go to it and stall too.  Longer than the stalls hedges are for;
a target wrongly suspected is avoided at most this long (less when the others get busy)."""


@dataclass(slots=True)
class TargetStats:
    """What this agent learned of one replica from its own requests; survives rebuilds."""

    limit: AdaptiveLimit
    latency: LatencyWindow = field(default_factory=LatencyWindow)
    correction: float = 1.0
    units_per_request: float = 1.0
    """EWMA of the work units of requests sent here (converts a backlog count to work)."""
    failures: int = 0
    outcomes: int = 0
    waiting_since: float = 0.0
    """While requests this agent sent here are in flight: since when the target has answered
    none of them (its last answer, or the first send after it was idle).  Every answer moves
    it, so a long silence means the target has stopped making progress - a stall that no
    statistic shows until it ends."""

    orphans: int = 0
    """Requests cancelled here (a hedge won elsewhere, the client left) that the target is
    presumably still working through: a runtime seldom drops a request it has queued
    (Triton's Python backend runs every one), so the work stays after this agent stops
    counting it in flight.  Without them a replica that just stalled looked idle once its
    requests were hedged away, and took new ones behind its leftover queue."""
    orphans_sent: float = 0.0
    """When the latest orphan was sent: an answer to a later request means (FIFO) the
    orphans are done."""
    hedges: int = 0
    """Hedges this agent sent here that have not ended: work the target has that no
    admission slot counts."""
    attempts: Any = None
    """The scorer's histogram of attempts answered here (``ScoreCounters.attempts`` under
    the target's model and node), once it has one."""

    def sent(self, now: float) -> None:
        """A request was admitted to the target (its in-flight count already includes it)."""
        if self.limit.inflight <= 1 and not self.orphans:
            self.waiting_since = now

    def waiting(self, now: float) -> bool:
        """Whether the target owes this agent answers: requests in flight, or orphans not yet
        answered for (within ``ORPHAN_TTL``)."""
        return self.limit.inflight > 0 or (
            self.orphans > 0 and now - self.orphans_sent < ORPHAN_TTL)

    def stalled_for(self, now: float, gap: float) -> float:
        """Seconds the target has been silent while owing answers, once that is longer than
        ``STALL_GAPS`` expected ``gap``s between answers (and ``STALL_MIN``); else 0."""
        if not self.waiting(now):
            return 0.0
        silent = now - self.waiting_since
        return silent if silent > STALL_MIN and silent > STALL_GAPS * gap else 0.0

    def answered(self, now: float, sent_at: float) -> None:
        """The target answered a request sent at ``sent_at`` (success or error)."""
        self.waiting_since = now
        if self.orphans and sent_at >= self.orphans_sent:
            self.orphans = 0

    def cancelled(self, sent_at: float) -> None:
        """A request sent here at ``sent_at`` was cancelled."""
        if not self.orphans and not self.limit.inflight and sent_at > self.waiting_since:
            self.waiting_since = sent_at
        self.orphans += 1
        if sent_at > self.orphans_sent:
            self.orphans_sent = sent_at

    def runtime_progress(self, backlog: int, at: float) -> None:
        """The runtime reported ``backlog`` requests at ``at``, after the orphans were sent and
        fewer than them: it is working through them (a stall ended)."""
        self.orphans = backlog
        if at > self.waiting_since:
            self.waiting_since = at

    def orphan_backlog(self, now: float, per_request: float, instances: int) -> int:
        """Orphans not yet worked off, at the target's usual pace since the later of its last
        answer and the latest orphan (so they cannot make a target look busy forever)."""
        n = self.orphans
        if not n or per_request <= 0:
            return n
        since = self.waiting_since if self.waiting_since > self.orphans_sent \
            else self.orphans_sent
        n -= int((now - since) * instances / per_request)
        return n if n > 0 else 0


@dataclass(slots=True, eq=False)
class Target:
    """One replica as the scorer sees it.  The ``p_*`` fields are this request's prediction,
    filled in by :meth:`predict` just before a strategy ranks the targets."""

    key: str
    node: str
    endpoint: str
    model: str
    version: str
    zone: str
    local: bool
    rtt: float
    spu: float
    spu_known: bool
    """False: the replica reports no figure and ``spu`` is the model's prior (the median of
    its other replicas'), set at each build."""
    instances: int
    backlog: int
    queue_at: float
    """When the runtime measured ``backlog`` (this agent's clock); 0 when never."""
    gpu_headroom: float | None
    """The smallest free share of GPU memory on the target's node; None without GPUs."""
    stats: TargetStats
    http: str = ""
    """The runtime's HTTP/REST address, when it serves one (``ReplicaState.http``)."""
    p_backlog: int = 0
    p_queue: float = 0.0
    p_service: float = 0.0
    p_seconds: float = 0.0
    p_from: float = 0.0
    p_until: float = 0.0
    """The ``p_*`` fields hold from ``p_from`` until then for a request of ``p_units`` while
    the target owes this agent nothing and its stats are the objects in ``p_stats`` (see
    ``predict_all``); 0: recompute."""
    p_units: int = -1
    p_stats: tuple[float, float] = (0.0, 0.0)

    def work(self, units: float) -> tuple[float, float]:
        """(rtt, uncorrected queue + service seconds) of a request of ``units`` now: what an
        outcome reported without a decision (a client balancing on weights) is compared
        with."""
        stats = self.stats
        backlog = max(self.p_backlog, stats.limit.inflight)
        return self.rtt, (backlog * stats.units_per_request / self.instances + units) * self.spu

    def silent(self, now: float) -> bool:
        """Whether requests wait here and the target has not answered any for longer than
        ``STALL_GAPS`` expected gaps: stalled, as far as this agent can tell."""
        stats = self.stats
        gap = stats.units_per_request * self.spu * stats.correction / self.instances
        return stats.stalled_for(now, gap) > 0.0

    def predict(self, units: int, now: float, own_only: bool = False) -> float:
        """Fill in and return this request's predicted seconds."""
        predict_all((self,), units, now, own_only)
        return self.p_seconds


def predict_all(targets: Iterable[Target], units: int, now: float,
                own_only: bool = False) -> None:
    """Fill in each target's prediction for a request of ``units`` at ``now``.

    The runtime's backlog figure is aged: what it has served since it measured it
    (``age * instances / seconds per request``) is taken off.  Without that, every router
    would steer around a replica for as long as its last report said it was busy and pile
    onto the ones that were idle then (herding on stale signals).  ``own_only`` ignores the
    figure altogether (too old to mean anything).

    This is the scoring path's inner loop (one pass over every target, no call per target).
    Most targets owe this agent nothing (no request in flight, hedge or orphan) and their
    correction and request size have not moved since the last request: their prediction is
    then a step function of time, the aged backlog, so it is kept until the next step
    (``p_until``).  ``correction`` and ``units_per_request`` are compared by identity: every
    update assigns a new float object, and the one held in ``p_stats`` cannot be reused."""
    for t in targets:
        stats = t.stats
        own = stats.limit.inflight
        c = stats.correction
        upr = stats.units_per_request
        if (t.p_from <= now < t.p_until and not own and units == t.p_units and not stats.hedges
                and not own_only
                and not stats.orphans and c is t.p_stats[0] and upr is t.p_stats[1]):
            continue
        spu = t.spu
        instances = t.instances
        per_request = upr * spu
        until = _INF
        backlog = 0 if own_only else t.backlog
        if backlog and per_request > 0:
            drained = (now - t.queue_at) * instances / per_request + 1e-9
            served = int(drained)
            backlog -= served
            if backlog > 0:  # the next request served moves the prediction
                until = now + (served + 1 - drained) * per_request / instances \
                    if drained >= 0 else now
        inflight = own
        orphans = stats.orphans
        if orphans:
            if t.queue_at > stats.orphans_sent and t.backlog < orphans:
                stats.runtime_progress(t.backlog, t.queue_at)
                orphans = stats.orphans
            inflight += stats.orphan_backlog(now, per_request, instances)
        inflight += stats.hedges
        if backlog < inflight:
            backlog = inflight
        gap = per_request * c / instances  # one request's share of the queue
        queue = backlog * gap
        if own or orphans:  # the common idle case costs no call
            queue += stats.stalled_for(now, gap)
        service = units * spu * c
        t.p_backlog = backlog
        t.p_queue = queue
        t.p_service = service
        t.p_seconds = t.rtt + queue + service
        if own or orphans or stats.hedges or own_only:
            t.p_until = 0.0
        else:
            t.p_from = now
            t.p_until = until
            t.p_units = units
            t.p_stats = (c, upr)


@dataclass(slots=True)
class NodeTargets:
    """One node's share of a model's targets, kept until the node's fused entry changes, so
    that one node's telemetry rebuilds one node's targets."""

    targets: list[Target]
    spus: list[float]
    """Its ready replicas' own seconds-per-unit figures (pinned elsewhere or not): the
    model's prior for replicas that report none."""


@dataclass(slots=True)
class ModelTargets:
    """A model's targets at one generation of the fused view."""

    model: str
    generation: tuple[int, int]
    built: float
    """When the targets were last built whole (RTTs and zones are read then)."""
    eligible: list[Target]
    """Targets routing may use, before the per-request staleness and exclusion checks."""
    nodes: dict[str, NodeTargets] = field(default_factory=dict)
    oldest_queue: float = 0.0
    """The oldest queue figure among ``eligible`` (0 when one has none): while it is fresh,
    so are all the others, and the per-request staleness check is one comparison."""


class TargetTable:
    """Builds and caches each model's targets from the fused view.

    ``rtt_of(node)`` is the estimated round trip to a node (None: unknown), ``zone_of(node)``
    its zone, ``pin_of(model, version)`` the ModelPin spec in force (or None),
    ``placement_of(model, version)`` the model's ModelPlacement spec (or None) and
    ``policy_version()`` moves whenever policy (flags, pins) may have changed.
    """

    def __init__(self, fused: FusedState, config: ScoreConfig, *,
                 rtt_of: Callable[[str], float | None], zone_of: Callable[[str], str],
                 pin_of: Callable[[str, str], dict[str, Any] | None],
                 policy_version: Callable[[], int],
                 new_stats: Callable[[], TargetStats],
                 placement_of: Callable[[str, str], dict[str, Any] | None] = lambda m, v: None
                 ) -> None:
        self.fused = fused
        self.config = config
        self.rtt_of = rtt_of
        self.zone_of = zone_of
        self.pin_of = pin_of
        self.placement_of = placement_of
        """The model's ``ModelPlacement`` spec (meshd.models), or None: a replica the placement
        controller is draining gets no new requests, so it can be unloaded with none lost."""
        self.policy_version = policy_version
        self.new_stats = new_stats
        self.stats: dict[str, TargetStats] = {}
        self.by_key: dict[str, Target] = {}
        """Each replica's target as last built (for outcomes reported without a decision)."""
        self._models: dict[str, ModelTargets] = {}
        self.builds = 0

    def targets(self, model: str, now: float) -> ModelTargets:
        """The model's targets: rebuilt whole every ``table_refresh`` and when policy moves;
        when only telemetry moved, just the nodes whose fused entry changed."""
        gen = (self.fused.generation, self.policy_version())
        cached = self._models.get(model)
        changed = None
        if (cached is not None and cached.generation[1] == gen[1]
                and now - cached.built < self.config.table_refresh):
            if cached.generation == gen:
                return cached
            changed = self.fused.changed_since(cached.generation[0])
        built = self._build(model, gen, now) if cached is None or changed is None \
            else self._patch(cached, gen, changed)
        self._models[model] = built
        return built

    def stats_for(self, key: str) -> TargetStats:
        st = self.stats.get(key)
        if st is None:
            st = self.stats[key] = self.new_stats()
        return st

    def replica(self, node: str, key: str) -> Target | None:
        """Replica ``key`` on ``node`` while it is ready, whatever the node's flags and pins
        (a sequence it holds finishes there); None once it is gone or not ready."""
        entry = self.fused.nodes.get(node)
        if entry is None:
            return None
        for rep in entry.signals.replicas:
            if rep.key == key:
                if not rep.ready:
                    return None
                t = self.by_key.get(key)
                if t is None or t.node != node:
                    t = self._target(node, rep, entry.signals, _spu_of(rep))
                return t
        return None

    def _build(self, model: str, gen: tuple[int, int], now: float) -> ModelTargets:
        """The model's targets built whole from every node."""
        nodes = {node: self._node_targets(model, node, entry)
                 for node, entry in self.fused.nodes.items()}
        eligible = [t for part in nodes.values() for t in part.targets]
        return self._finish(model, gen, now, eligible, nodes, eligible)

    def _patch(self, cached: ModelTargets, gen: tuple[int, int],
               changed: set[str]) -> ModelTargets:
        """``cached`` with the targets of the ``changed`` nodes built again: what one node's
        telemetry costs the scoring path (a whole build walks every node)."""
        nodes = cached.nodes.copy()
        eligible = [t for t in cached.eligible if t.node not in changed]
        fresh: list[Target] = []
        for node in changed:
            entry = self.fused.nodes.get(node)
            if entry is None:
                nodes.pop(node, None)
                continue
            part = nodes[node] = self._node_targets(cached.model, node, entry)
            fresh.extend(part.targets)
        eligible.extend(fresh)
        return self._finish(cached.model, gen, cached.built, eligible, nodes, fresh)

    def _finish(self, model: str, gen: tuple[int, int], built: float, eligible: list[Target],
                nodes: dict[str, NodeTargets], fresh: list[Target]) -> ModelTargets:
        """What a build and a patch share: replicas that report no seconds-per-unit get the
        model's median, the ``fresh`` targets are indexed by key, the oldest figure noted."""
        self.builds += 1
        if any(not t.spu_known for t in eligible):
            spus = sorted(x for part in nodes.values() for x in part.spus)
            prior = spus[len(spus) // 2] if spus else self.config.default_spu
            for t in eligible:
                if not t.spu_known and t.spu != prior:
                    t.spu = prior
                    t.p_until = 0.0
        by_key = self.by_key
        for t in fresh:
            by_key[t.key] = t
        if len(by_key) > 4 * len(self.stats) + 1024:
            self.by_key = {k: t for k, t in by_key.items() if k in self.stats}
        oldest = min(map(_queue_at, eligible)) if eligible else 0.0
        return ModelTargets(model, gen, built, eligible, nodes, oldest)

    def _node_targets(self, model: str, node: str, entry: NodeEntry) -> NodeTargets:
        sig = entry.signals
        part = NodeTargets([], [])
        if not any(r.model == model for r in sig.replicas) or EXCLUDING_FLAGS.intersection(
                self.fused.flags_of(node)):
            return part
        for rep in sig.replicas:
            if rep.model != model or not rep.ready:
                continue
            spu = _spu_of(rep)
            if spu is not None:
                part.spus.append(spu)
            if self._pinned_here(rep, node, sig):
                part.targets.append(self._target(node, rep, sig, spu))
        return part

    def _target(self, node: str, rep: ReplicaState, sig: NodeSignals,
                spu: float | None) -> Target:
        local = node == self.fused.node
        rtt = 0.0 if local else (self.rtt_of(node) or 0.0)
        backlog = (rep.queue or 0) + (rep.inflight or 0)
        return Target(key=rep.key, node=node, endpoint=rep.endpoint, model=rep.model,
                      version=rep.version, zone=self.zone_of(node), local=local, rtt=rtt,
                      spu=spu or 0.0, spu_known=spu is not None,
                      instances=max(1, rep.instances), backlog=backlog,
                      queue_at=rep.at.get("queue", 0.0), gpu_headroom=_headroom(sig),
                      stats=self.stats_for(rep.key), http=rep.http)

    def _pinned_here(self, rep: ReplicaState, node: str, sig: NodeSignals) -> bool:
        placed = self.placement_of(rep.model, rep.version)
        if placed is not None and placed["replicas"].get(node, {}).get("state") == "draining":
            return False
        pin = self.pin_of(rep.model, rep.version)
        if pin is None:
            return True
        if pin["nodes"] and node not in pin["nodes"]:
            return False
        if pin["zones"] and self.zone_of(node) not in pin["zones"]:
            return False
        if pin["gpu_types"] and not any(g.name in pin["gpu_types"] for g in sig.gpus):
            return False
        need = pin["min_free_vram_mb"] * 1024 * 1024
        return not need or any(g.memory_free >= need for g in sig.gpus)


def _spu_of(rep: ReplicaState) -> float | None:
    """Seconds per work unit, from the best figure the runtime gives."""
    for value in (rep.spu, rep.compute_seconds, rep.latency_ewma):
        if value is not None and value > 0:
            return value
    return None


def _headroom(sig: NodeSignals) -> float | None:
    shares = [g.memory_free / g.memory_total for g in sig.gpus if g.memory_total > 0]
    return min(shares) if shares else None


def fresh(targets: Iterable[Target], now: float, stale_after: float) -> list[Target]:
    """Targets whose queue figure is younger than ``stale_after``."""
    return [t for t in targets if t.queue_at > 0 and now - t.queue_at <= stale_after]
