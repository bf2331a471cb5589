"""What the scorer is told: the agent-wide :class:`ScoreConfig` and each model's
:class:`RoutingConfig` (from its ``RoutingPolicy`` document, see ``policy/model.py``).

Every default is documented where it is declared, as gossip's ``Config`` does; the numbers
are starting points for a LAN fleet of Triton replicas, and the field docs say what moving
them trades.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policy.model import defaults


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """One model's routing policy (a ``RoutingPolicy`` spec, defaults filled in)."""

    strategy: str = "hybrid"
    shadow: str | None = None
    max_targets: int = 4
    stale_after: float = 10.0
    """Seconds; ``stale_after_ms`` in the policy."""
    hedge_budget: float = 0.05
    hedge_quantile: float = 0.99
    randomization: float = 0.1
    zone_penalty: float = 0.002
    """Seconds; ``zone_penalty_ms`` in the policy."""
    max_concurrency: int | None = None
    standing_queue: float = 0.1
    """Seconds; ``standing_queue_ms`` in the policy (0: off)."""

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> RoutingConfig:
        return cls(strategy=spec["strategy"], shadow=spec["shadow"],
                   max_targets=spec["max_targets"], stale_after=spec["stale_after_ms"] / 1000,
                   hedge_budget=spec["hedge_budget"], hedge_quantile=spec["hedge_quantile"],
                   randomization=spec["randomization"],
                   zone_penalty=spec["zone_penalty_ms"] / 1000,
                   max_concurrency=spec["max_concurrency"],
                   standing_queue=spec["standing_queue_ms"] / 1000)


DEFAULT_ROUTING = RoutingConfig.from_spec(defaults("RoutingPolicy"))


@dataclass(frozen=True, slots=True)
class ScoreConfig:
    """Agent-wide scorer settings (not policy: they bound the scorer's own cost)."""

    decision_ttl: float = 30.0
    """Seconds a decision without a deadline stays open for ReportOutcome.  An unreported
    decision (a router that died) releases its admission slots when it expires."""

    expiry_grace: float = 1.0
    """Seconds past a request's deadline before its decision expires: outcomes of requests
    that ran to their deadline still arrive."""

    max_open_decisions: int = 200_000
    """Decisions held at once; beyond it the oldest are expired early, so a router that never
    reports cannot grow the agent without bound."""

    strategy_budget: float = 0.0002
    """Seconds a strategy may take to rank one request.  One that takes longer has its answer
    thrown away for ``p2c``'s (counted): a slow plugin must not become everyone's latency."""

    table_refresh: float = 0.5
    """Seconds between rebuilds of a model's targets when nothing changed (RTT estimates and
    GPU headroom move slowly; telemetry and policy changes rebuild at once)."""

    default_spu: float = 0.01
    """Seconds per work unit assumed for a target nothing is known about yet (and no other
    replica of the model reports one): a guess that lets a new replica take traffic and be
    measured."""

    correction_weight: float = 0.1
    """EWMA weight of one outcome in a target's observed/predicted ratio ("refined by observed
    latency")."""

    correction_bounds: tuple[float, float] = (0.2, 10.0)
    """The ratio's clamp.  Wide enough for outcomes to overrule telemetry that is wrong (a
    replica slowed by something its statistics do not show yet), bounded so one burst of
    outliers cannot make a target look unusable forever."""

    correction_step: float = 2.0
    """One outcome's ratio is first clamped to within this factor of the current correction,
    so the correction moves by at most ``correction_weight * (step - 1)`` of itself per
    outcome.  A lasting change still gets through in a few dozen outcomes; the handful of
    requests queued behind a stall (each 10-50x its prediction) no longer make a healthy
    replica look several times slower for seconds after it (``bench/routing``: they pushed
    load onto the slowest replica, whose queue then set the p99)."""

    retry_after_bounds: tuple[float, float] = (0.01, 5.0)
    """Seconds: retry-after hints are kept in this range."""

    min_hedge_after: float = 0.001
    """Seconds: no hedge is sent sooner (a hedge at once only doubles load)."""

    hedge_burst: float = 10.0
    """Hedge tokens a model's budget can bank (its burst)."""
