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
from typing import Any

from adapters.model import ReplicaState
from meshd.fused import FusedState
from meshd.score.config import ScoreConfig
from meshd.score.latency import LatencyWindow
from meshd.score.limiter import AdaptiveLimit
from meshd.signal_wire import NodeSignals

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
    instances: int
    backlog: int
    queue_at: float
    """When the runtime measured ``backlog`` (this agent's clock); 0 when never."""
    gpu_headroom: float | None
    """The smallest free share of GPU memory on the target's node; None without GPUs."""
    stats: TargetStats
    p_backlog: int = 0
    p_queue: float = 0.0
    p_service: float = 0.0
    p_seconds: float = 0.0

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
    figure altogether (too old to mean anything).  One loop for all targets: this is the
    scoring path's inner loop, so it avoids a call per target."""
    for t in targets:
        stats = t.stats
        own = stats.limit.inflight
        spu = t.spu
        instances = t.instances
        per_request = stats.units_per_request * spu
        backlog = 0 if own_only else t.backlog
        if backlog and per_request > 0:
            backlog -= int((now - t.queue_at) * instances / per_request + 1e-9)
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
        c = stats.correction
        gap = per_request * c / instances  # one request's share of the queue
        queue = backlog * gap
        if own or orphans:  # the common idle case costs no call
            queue += stats.stalled_for(now, gap)
        service = units * spu * c
        t.p_backlog = backlog
        t.p_queue = queue
        t.p_service = service
        t.p_seconds = t.rtt + queue + service


@dataclass(slots=True)
class ModelTargets:
    """A model's targets at one generation of the fused view."""

    generation: tuple[int, int]
    built: float
    eligible: list[Target]
    """Targets routing may use, before the per-request staleness and exclusion checks."""


class TargetTable:
    """Builds and caches each model's targets from the fused view.

    ``rtt_of(node)`` is the estimated round trip to a node (None: unknown), ``zone_of(node)``
    its zone, ``pin_of(model, version)`` the ModelPin spec in force (or None) and
    ``policy_version()`` moves whenever policy (flags, pins) may have changed.
    """

    def __init__(self, fused: FusedState, config: ScoreConfig, *,
                 rtt_of: Callable[[str], float | None], zone_of: Callable[[str], str],
                 pin_of: Callable[[str, str], dict[str, Any] | None],
                 policy_version: Callable[[], int],
                 new_stats: Callable[[], TargetStats]) -> None:
        self.fused = fused
        self.config = config
        self.rtt_of = rtt_of
        self.zone_of = zone_of
        self.pin_of = pin_of
        self.policy_version = policy_version
        self.new_stats = new_stats
        self.stats: dict[str, TargetStats] = {}
        self.by_key: dict[str, Target] = {}
        """Each replica's target as last built (for outcomes reported without a decision)."""
        self._models: dict[str, ModelTargets] = {}
        self.builds = 0

    def targets(self, model: str, now: float) -> ModelTargets:
        gen = (self.fused.generation, self.policy_version())
        cached = self._models.get(model)
        if (cached is not None and cached.generation == gen
                and now - cached.built < self.config.table_refresh):
            return cached
        built = self._build(model, gen, now)
        self._models[model] = built
        return built

    def stats_for(self, key: str) -> TargetStats:
        st = self.stats.get(key)
        if st is None:
            st = self.stats[key] = self.new_stats()
        return st

    def _build(self, model: str, gen: tuple[int, int], now: float) -> ModelTargets:
        self.builds += 1
        eligible: list[Target] = []
        spus: list[float] = []
        flags_cache: dict[str, bool] = {}
        for node, entry in self.fused.nodes.items():
            sig = entry.signals
            if not any(r.model == model for r in sig.replicas):
                continue
            excluded = flags_cache.get(node)
            if excluded is None:
                excluded = flags_cache[node] = bool(
                    EXCLUDING_FLAGS.intersection(self.fused.flags_of(node)))
            if excluded:
                continue
            for rep in sig.replicas:
                if rep.model != model or not rep.ready:
                    continue
                spu = _spu_of(rep)
                if spu is not None:
                    spus.append(spu)
                if not self._pinned_here(rep, node, sig):
                    continue
                eligible.append(self._target(node, rep, sig, spu))
        spus.sort()
        prior = spus[len(spus) // 2] if spus else self.config.default_spu
        for t in eligible:
            if t.spu <= 0:
                t.spu = prior
            self.by_key[t.key] = t
        if len(self.by_key) > 4 * len(self.stats) + 1024:
            self.by_key = {k: t for k, t in self.by_key.items() if k in self.stats}
        return ModelTargets(gen, now, eligible)

    def _target(self, node: str, rep: ReplicaState, sig: NodeSignals,
                spu: float | None) -> Target:
        local = node == self.fused.node
        rtt = 0.0 if local else (self.rtt_of(node) or 0.0)
        backlog = (rep.queue or 0) + (rep.inflight or 0)
        return Target(key=rep.key, node=node, endpoint=rep.endpoint, model=rep.model,
                      version=rep.version, zone=self.zone_of(node), local=local, rtt=rtt,
                      spu=spu or 0.0, instances=max(1, rep.instances), backlog=backlog,
                      queue_at=rep.at.get("queue", 0.0), gpu_headroom=_headroom(sig),
                      stats=self.stats_for(rep.key))

    def _pinned_here(self, rep: ReplicaState, node: str, sig: NodeSignals) -> bool:
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
