"""When a node republishes its telemetry through gossip: only material changes, rate-limited.

Every gossip publication is a broadcast every member relays, so a node whose queue wobbles by
one request must not flood the mesh.  A change is *material* when it could change a routing
decision (readiness, the replica set, a queue that moved by a few requests or a quarter, an SPU
or latency that moved by a fifth, GPU memory that moved by 5% of the card, new ECC errors or
throttling).  Material changes are published at most every ``min_interval`` and repeated once
after ``echo``; any other change is folded in at the next ``refresh``.  Routers that need
fresher figures subscribe instead (:mod:`meshd.signals.plane`), which pushes every poll.  Pure: time
is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.model import CommStats, GpuState, ReplicaState
from meshd.signals.wire import NodeSignals


@dataclass(frozen=True, slots=True)
class PublishConfig:
    min_interval: float = 0.5
    """Seconds between two gossip publications, however material the changes."""
    refresh: float = 5.0
    """A non-material change is published after at most this long."""
    echo: float = 1.0
    """A material publication is sent again (with fresh ages) after this long, unless another
    went out first.  One gossip epidemic misses a node now and then (each broadcast is relayed
    a bounded number of times), and a miss would otherwise leave that node wrong until the
    next change or refresh; a second, independent epidemic makes a miss rare."""
    queue_abs: int = 2
    """A queue change of at least this many requests is material ..."""
    queue_rel: float = 0.25
    """... or of at least this fraction of the previous queue."""
    estimate_rel: float = 0.2
    """SPU, latency and rate changes of this fraction are material."""
    memory_rel: float = 0.05
    """GPU free memory moving by this fraction of the card is material."""
    temperature_c: float = 5.0


def _moved(old: float | None, new: float | None, rel: float) -> bool:
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    return abs(new - old) > rel * max(abs(old), 1e-9)


def replica_reason(a: ReplicaState, b: ReplicaState, cfg: PublishConfig) -> str | None:
    if a.ready != b.ready:
        return "ready"
    if (a.instances, a.max_batch, a.dynamic_batching) != (b.instances, b.max_batch,
                                                          b.dynamic_batching):
        return "config"
    if a.http != b.http:
        return "http"  # where routers forward HTTP requests: gone means convert to gRPC now
    for name, qa, qb in (("queue", a.queue, b.queue), ("inflight", a.inflight, b.inflight)):
        if (qa is None) != (qb is None):
            return name
        if qa is not None and qb is not None and abs(qb - qa) >= max(
                cfg.queue_abs, cfg.queue_rel * qa):
            return name
    for name, ea, eb in (("spu", a.spu, b.spu), ("latency", a.latency_ewma, b.latency_ewma),
                         ("rate", a.rate, b.rate)):
        if _moved(ea, eb, cfg.estimate_rel):
            return name
    if (a.failures == 0) != (b.failures == 0):
        return "failures"
    return None


def gpu_reason(a: GpuState, b: GpuState, cfg: PublishConfig) -> str | None:
    if abs(a.memory_free - b.memory_free) > cfg.memory_rel * max(b.memory_total, 1):
        return "gpu_memory"
    if (a.ecc_uncorrected, a.throttle, a.mig) != (b.ecc_uncorrected, b.throttle, b.mig):
        return "gpu_health"
    if a.temperature_c is not None and b.temperature_c is not None and abs(
            a.temperature_c - b.temperature_c) >= cfg.temperature_c:
        return "gpu_temperature"
    return None


def comm_changed(old: list[CommStats], new: list[CommStats]) -> bool:
    """Whether a trainer reported new collective timings (each report is news)."""
    return [(c.job, c.op, c.at) for c in old] != [(c.job, c.op, c.at) for c in new]


def material(old: NodeSignals | None, new: NodeSignals, cfg: PublishConfig) -> str | None:
    """Why ``new`` is worth a gossip publication after ``old`` (None: it is not)."""
    if old is None:
        return "first"
    if old.cpu_only != new.cpu_only:
        return "gpu_mode"
    olds = {r.key: r for r in old.replicas}
    news = {r.key: r for r in new.replicas}
    if olds.keys() != news.keys():
        return "replicas"
    for key, b in news.items():
        reason = replica_reason(olds[key], b, cfg)
        if reason:
            return reason
    oldg = {g.uuid: g for g in old.gpus}
    if oldg.keys() != {g.uuid for g in new.gpus}:
        return "gpus"
    for g in new.gpus:
        reason = gpu_reason(oldg[g.uuid], g, cfg)
        if reason:
            return reason
    if comm_changed(old.comm, new.comm):
        return "comm"
    return None


class PublishGate:
    """Decides, poll by poll, whether to publish (and remembers what was published)."""

    def __init__(self, cfg: PublishConfig | None = None) -> None:
        self.cfg = cfg or PublishConfig()
        self.published: NodeSignals | None = None
        self.published_at = float("-inf")
        self.pending_since: float | None = None
        self.held = False
        """A material change is waiting for ``min_interval`` to pass."""
        self.echo_at: float | None = None
        self.reasons: dict[str, int] = {}

    def offer(self, current: NodeSignals, now: float, changed: bool = True) -> str | None:
        """Whether to publish ``current`` now; the reason when yes (then it counts as sent)."""
        if changed and self.pending_since is None:
            self.pending_since = now
        reason = None
        if self.pending_since is not None:
            reason = material(self.published, current, self.cfg)
        self.held = reason is not None and now - self.published_at < self.cfg.min_interval
        if self.held:
            return None
        if reason is None:
            if self.echo_at is not None and now >= self.echo_at:
                reason = "echo"
            elif self.pending_since is not None and now - self.pending_since >= self.cfg.refresh:
                reason = "refresh"
            else:
                return None
        self.echo_at = None if reason in ("echo", "refresh") else now + self.cfg.echo
        self.published, self.published_at, self.pending_since = current, now, None
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return reason

    def next_due(self) -> float | None:
        """The earliest time :meth:`offer` may publish without a new change (None: only after
        one), so the caller can wake then instead of at its next poll."""
        times = [t for t in (
            self.published_at + self.cfg.min_interval if self.held else None,
            self.echo_at,
            self.pending_since + self.cfg.refresh if self.pending_since is not None else None,
        ) if t is not None]
        return min(times) if times else None
