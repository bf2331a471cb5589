"""The scorer: for one request, the ranked targets, the admission verdict and a hedge delay;
for each outcome, what it teaches about its target.

Sans-I/O like the protocol cores: ``now`` is an argument, randomness comes from a seeded
``random.Random``, and the only clock read is the strategy-budget timer (injectable; this
thread's CPU time, so being preempted does not count against a strategy).  The
gRPC service (``meshd/score/service.py``), the in-process router and the benchmarks all call
:meth:`Scorer.score` and :meth:`Scorer.report` directly.

Order of work for one request (each step can shed, with a reason and a retry-after):

1. targets: the model's eligible replicas (ready; node not cordoned, draining or quarantined;
   allowed by its ModelPin) whose queue figure is fresh; when none is fresh, all of them,
   predicted from this agent's own observations only (``degraded``);
2. prediction: seconds-of-work for each (``target.Target.predict``);
3. ranking: the model's strategy, within its time budget (else ``p2c``), and its shadow;
4. admission: the deadline, a standing queue (``standing``: the shortest wait among the ranked
   targets has stayed above the policy's ``standing_queue_ms`` for a second), the tenant's
   quota, the model's limit, then the first ranked target with room in its adaptive limit
   (at the request's priority share) goes first;
5. hedging: a delay when the request is idempotent, its SLO class allows it, a second target
   exists and the model's hedge budget has a token.
"""

from __future__ import annotations

import bisect
import enum
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from adapters.model import work_units
from meshd.score.admission import ADMIT, ModelGate, TenantGate, Verdict, priority_share
from meshd.score.budget import HedgeBudget
from meshd.score.config import DEFAULT_ROUTING, RoutingConfig, ScoreConfig
from meshd.score.decisions import Decision, Decisions
from meshd.score.hedging import hedge_after
from meshd.score.limiter import AdaptiveLimit, LimiterConfig
from meshd.score.sequences import SequenceTable, rendezvous
from meshd.score.shadow import ShadowStats
from meshd.score.standing import SERVICES, StandingQueue
from meshd.score.strategies import FALLBACK, default_registry
from meshd.score.strategy import Context, Registry, Strategy
from meshd.score.target import ModelTargets, Target, TargetStats, TargetTable, predict_all
from meshd.signals.fused import FusedState

STRATEGY_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3)
"""Upper bounds (seconds) of the per-strategy decision-time histogram."""
SHED_REASONS = ("no_targets", "deadline", "standing_queue", "tenant_concurrency", "tenant_rate",
                "model_limit", "target_limit")
"""Why a request is shed (the ``reason`` of a refused verdict)."""
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
"""Upper bounds (seconds) of the request and attempt latency histograms."""
MAX_LATENCY_SERIES = 4096
"""Model (and target) pairs whose latency is kept; more are not counted (a bound on labels)."""

MAX_TEXT = 256


class RepositoryRefused(Exception):
    """A repository call (load or unload through the router) refused: ``code`` is the gRPC
    status name to answer with, the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Repository(Protocol):
    def __call__(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                 peer: str, config: str = "") -> Awaitable[str]:
        """Make ``model`` have at least one replica (``load``; with ``config``, the Triton
        config its replicas load with) or none, on behalf of the caller who presented
        ``certificate_pem`` or ``bearer``; returns who the write was made for, or raises
        :class:`RepositoryRefused`."""
        ...


class ScoreError(ValueError):
    """A request the scorer cannot take as given; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class Status(enum.IntEnum):
    """How a request sent to a target ended (mirrors ``mesh.v1.OutcomeStatus``)."""

    OK = 0
    ERROR = 1
    UNAVAILABLE = 2
    TIMEOUT = 3
    CANCELLED = 4
    OVERLOADED = 5


_STATUS_NAMES = tuple(s.name for s in Status)
"""``Status(i).name`` by value (an enum's ``name`` is a property, slow on the hot path)."""
DROPPED = frozenset({Status.UNAVAILABLE, Status.TIMEOUT, Status.OVERLOADED})
"""Outcomes that mean the target could not take the request: its limit backs off."""


@dataclass(slots=True)
class ScoreRequest:
    model: str
    revision: str = ""
    payload_bytes: int = 0
    tenant: str = ""
    slo_class: str = ""
    deadline: float = 0.0
    """Seconds the request has left; 0 = its SLO class's deadline (or none)."""
    exclude: Collection[str] = ()
    """Replica keys or node names not to return."""
    idempotent: bool = True
    sequence: str = ""
    """A stateful sequence's key (:func:`meshd.score.sequences.sequence_key`): the request
    goes where the sequence lives."""
    sequence_start: bool = False
    sequence_end: bool = False


@dataclass(slots=True)
class Choice:
    """One ranked target, with the prediction it was ranked on."""

    node: str
    endpoint: str
    replica: str
    version: str
    zone: str
    predicted: float
    rtt: float
    queue: float
    service: float
    http: str = ""
    """The runtime's HTTP/REST address (``host:port``), when it serves one: where the
    router's HTTP ingress forwards requests as they came (empty: converted to gRPC)."""


@dataclass(slots=True)
class Scored:
    targets: list[Choice]
    verdict: Verdict
    hedge_after: float = 0.0
    decision_id: int = 0
    strategy: str = ""
    degraded: bool = False
    walk: bool = False
    """A sequence's request with no known home: ``targets`` is the order to try, moving on
    only when a replica answers that it does not hold the sequence."""


@dataclass(slots=True)
class Timing:
    """A histogram's counts, kept here so the hot path touches no exporter lock."""

    bounds: tuple[float, ...]
    count: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1


@dataclass(slots=True)
class ScoreCounters:
    """What the metrics layer exports; plain counters, updated on the hot path."""

    decisions: Counter[str] = field(default_factory=Counter)
    """By strategy that ranked."""
    shed: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(SHED_REASONS, 0)))
    """By reason (every known reason from the start, so a rate of 0 is a series)."""
    fallbacks: Counter[str] = field(default_factory=Counter)
    """Decisions ranked by ``p2c`` instead: ``unknown``, ``over_budget``, ``failed``."""
    degraded: int = 0
    hedges_offered: int = 0
    hedges_sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unknown_outcomes: int = 0
    timing: dict[str, Timing] = field(default_factory=dict)
    """Time each strategy took to rank, by strategy."""
    requests: dict[str, Timing] = field(default_factory=dict)
    """Decision to answer, by model."""
    attempts: dict[tuple[str, str], Timing] = field(default_factory=dict)
    """Each answered attempt's latency, by (model, target node)."""
    hedge_budget_exhausted: Counter[str] = field(default_factory=Counter)
    """By model: hedges that would have been offered but for the budget."""
    shadow: dict[tuple[str, str], ShadowStats] = field(default_factory=dict)


@dataclass(slots=True)
class ModelState:
    gate: ModelGate
    budget: HedgeBudget
    ratio: float
    standing: StandingQueue = field(default_factory=StandingQueue)


@dataclass(slots=True)
class _Lane:
    """What scoring a request for one model looks up - its routing policy, its targets, its
    admission state - as of one policy version and one generation of the fused view, until
    the table's refresh is due: one check a request instead of a lookup each (each a few
    tables the request path would otherwise walk, cold, every time)."""

    policy: int
    generation: int
    until: float
    routing: RoutingConfig
    targets: ModelTargets
    state: ModelState


_INF = float("inf")
_by_queue = attrgetter("p_queue")
_SHARES = tuple(priority_share(p) for p in range(10))
"""``priority_share`` by priority 0..9."""

OVERFLOW_FACTOR = 1.25
"""A request goes past a full target only to one predicted to take at most this many times
as long as the best."""
OVERDRAFT = 4.0
"""How far over its adaptive limit a target may go when no target near the best has room."""
MODEL_HEADROOM = 2.0
"""The model's limit, as a multiple of its targets' summed adaptive limits.  A replica that
stalls takes its capacity away for the stall; at 80% load the others absorb its share only
if they may queue past their limits' knee for that long (``bench/routing`` shed at 1x).
Sustained overload still sheds, at twice the queue the limits mark."""


def _capacity(targets: list[Target], share: float, inflight: int, min_limit: float) -> float:
    """The model's limit at a priority's ``share``: ``MODEL_HEADROOM`` times the sum of its
    targets' adaptive limits.  While ``inflight`` is below what that is with every target at
    ``min_limit``, that lower bound gives the same verdict without the sum."""
    floor = share * MODEL_HEADROOM * min_limit * len(targets)
    if inflight < floor:
        return floor
    total = 0.0
    for t in targets:
        total += t.stats.limit.limit
    return share * total * MODEL_HEADROOM


def _observe(timings: dict[Any, Timing], key: Any, seconds: float) -> None:
    """``seconds`` into ``timings[key]``; a new key only while there are fewer than
    ``MAX_LATENCY_SERIES`` (a bound on the labels they become)."""
    timing = timings.get(key)
    if timing is None:
        if len(timings) >= MAX_LATENCY_SERIES:
            return
        timing = timings[key] = Timing(REQUEST_BUCKETS)
    timing.observe(seconds)


def _key_of(t: Target) -> str:
    return t.key


def _choice(t: Target) -> Choice:
    return Choice(t.node, t.endpoint, t.key, t.version, t.zone, t.p_seconds, t.rtt,
                  t.p_queue, t.p_service, t.http)


class Scorer:
    """Scores requests against a fused view.

    ``policy(kind, name)`` returns a policy spec (None: no such document) and
    ``policy_version()`` moves whenever one may have changed; ``rtt_of(node)`` and
    ``zone_of(node)`` come from the coordinate plane and gossip.  ``quota_share()`` is this
    agent's share of tenant quotas.
    """

    def __init__(self, fused: FusedState, *, zone: str = "",
                 policy: Callable[[str, str], dict[str, Any] | None] = lambda k, n: None,
                 policy_version: Callable[[], int] = lambda: 0,
                 rtt_of: Callable[[str], float | None] = lambda n: None,
                 zone_of: Callable[[str], str] = lambda n: "",
                 quota_share: Callable[[], float] = lambda: 1.0,
                 config: ScoreConfig | None = None, registry: Registry | None = None,
                 limiter: LimiterConfig | None = None, rng: random.Random | None = None,
                 timer: Callable[[], float] = time.thread_time) -> None:
        self.fused = fused
        self.zone = zone
        self.config = config or ScoreConfig()
        self.policy = policy
        self.policy_version = policy_version
        self.registry = registry or default_registry()
        self.limiter = limiter or LimiterConfig()
        self.rng = rng or random.Random()
        self.timer = timer
        self.counters = ScoreCounters()
        self.wanted: Callable[[str, str], bool] = lambda model, version: False
        """Told of a request for a model with no ready replica (scale from zero, set by the
        agent: meshd.models); True when meshd places the model, so a replica may come."""
        self.placed: Callable[[], Collection[str]] = tuple
        """Models meshd places (their ModelPins, set by the agent): listed by :meth:`models`
        even while no replica is loaded, as Triton lists a model it has not loaded."""
        self.repository: Repository | None = None
        """Triton's repository control through the router (set by the agent: meshd.models
        places the replicas, the admin plane checks the caller)."""
        self.table = TargetTable(fused, self.config, rtt_of=rtt_of, zone_of=zone_of,
                                 pin_of=self._pin_of, placement_of=self._placement_of,
                                 policy_version=policy_version,
                                 new_stats=self._new_stats)
        self.tenants = TenantGate(lambda t: policy("TenantQuota", t), policy_version,
                                  quota_share)
        self.decisions = Decisions(self.config.max_open_decisions, self._expire)
        self.sequences = SequenceTable()
        self._models: dict[str, ModelState] = {}
        self._strategies: dict[str, Strategy | None] = {}
        self._routing: dict[str, tuple[int, RoutingConfig]] = {}
        self._lanes: dict[str, _Lane] = {}

    # --- policy lookups ----------------------------------------------------------------------

    def routing(self, model: str) -> RoutingConfig:
        version = self.policy_version()
        cached = self._routing.get(model)
        if cached is not None and cached[0] == version:
            return cached[1]
        spec = self.policy("RoutingPolicy", model) or self.policy("RoutingPolicy", "default")
        cfg = RoutingConfig.from_spec(spec) if spec else DEFAULT_ROUTING
        if len(self._routing) > 4096:
            self._routing.clear()
        self._routing[model] = (version, cfg)
        return cfg

    def _pin_of(self, model: str, version: str) -> dict[str, Any] | None:
        return self.policy("ModelPin", f"{model}:{version}") or self.policy("ModelPin", model)

    def _placement_of(self, model: str, version: str) -> dict[str, Any] | None:
        return (self.policy("ModelPlacement", f"{model}:{version}")
                or self.policy("ModelPlacement", model))

    def _new_stats(self) -> TargetStats:
        return TargetStats(AdaptiveLimit(self.limiter))

    def _model(self, model: str, routing: RoutingConfig) -> ModelState:
        ms = self._models.get(model)
        if ms is None or ms.ratio != routing.hedge_budget:
            budget = HedgeBudget(routing.hedge_budget, self.config.hedge_burst)
            gate = ms.gate if ms is not None else ModelGate()
            standing = ms.standing if ms is not None else StandingQueue()
            ms = self._models[model] = ModelState(gate, budget, routing.hedge_budget, standing)
        return ms

    def _lane(self, model: str, policy: int, now: float) -> _Lane:
        routing = self.routing(model)
        table = self.table.targets(model, now)
        lane = _Lane(policy, table.generation[0], table.built + self.config.table_refresh,
                     routing, table, self._model(model, routing))
        if len(self._lanes) >= 4096:
            self._lanes.clear()
        self._lanes[model] = lane
        return lane

    def strategy(self, name: str) -> Strategy | None:
        if name not in self._strategies:
            self._strategies[name] = self.registry.create(name)
        return self._strategies[name]

    # --- scoring -----------------------------------------------------------------------------

    def candidates(self, req: ScoreRequest, routing: RoutingConfig, now: float,
                   units: int = 0, table: ModelTargets | None = None
                   ) -> tuple[list[Target], bool]:
        """The targets this request may go to, with its prediction filled in (for ``units``
        of work, else the request's), and whether they are degraded (every queue figure
        stale: own observations only).  ``table``: the model's targets, when the caller has
        them (:class:`_Lane`)."""
        if table is None:
            table = self.table.targets(req.model, now)
        eligible = table.eligible
        if not units:
            units = work_units(req.payload_bytes)
        oldest = now - routing.stale_after
        excl = req.exclude
        rev = req.revision
        if not rev and not excl and table.oldest_queue >= oldest and table.oldest_queue > 0:
            # Every figure is fresh: the common case, no loop.  A copy where admission may
            # reorder it (_sent); one target stays where it is.
            out = eligible if len(eligible) == 1 else eligible.copy()
            predict_all(out, units, now)
            return out, False
        out = []
        stale: list[Target] = []
        for t in eligible:
            if (rev and t.version != rev) or (excl and (t.key in excl or t.node in excl)):
                continue
            if t.queue_at >= oldest and t.queue_at > 0:
                out.append(t)
            else:
                stale.append(t)
        if out or not stale:
            predict_all(out, units, now)
            return out, False
        predict_all(stale, units, now, own_only=True)
        return stale, True

    def rank(self, targets: list[Target], ctx: Context) -> tuple[list[Target], str]:
        """The active strategy's ranking (or ``p2c``'s, counted, when it cannot give one)."""
        name = ctx.routing.strategy
        if len(targets) == 1:
            return targets, name  # nothing to rank
        strat = self.strategy(name)
        counters = self.counters
        if strat is None:
            counters.fallbacks["unknown"] += 1
        else:
            t0 = self.timer()
            ctx.deadline = t0 + self.config.strategy_budget
            try:
                ranked = list(strat.rank(targets, ctx))
            except Exception:  # noqa: BLE001 - a plugin's bug must not fail the request
                ranked = []
                counters.fallbacks["failed"] += 1
            else:
                if not ranked:
                    counters.fallbacks["failed"] += 1
            elapsed = self.timer() - t0
            timing = counters.timing.get(name)
            if timing is None:
                timing = counters.timing[name] = Timing(STRATEGY_BUCKETS)
            timing.observe(elapsed)
            if ranked and elapsed > self.config.strategy_budget:
                counters.fallbacks["over_budget"] += 1
                ranked = []
            if ranked:
                return ranked[: ctx.limit], name
        fallback = self.strategy(FALLBACK)
        assert fallback is not None
        return list(fallback.rank(targets, ctx))[: ctx.limit], FALLBACK

    def _shadow(self, model: str, active: list[Target], targets: list[Target],
                ctx: Context) -> None:
        cand = ctx.routing.shadow
        if cand is None or cand == ctx.routing.strategy:
            return
        key = (model, cand)
        stats = self.counters.shadow.get(key)
        if stats is None:
            if len(self.counters.shadow) > 1024:
                return
            stats = self.counters.shadow[key] = ShadowStats(ctx.routing.strategy, cand)
        strat = self.strategy(cand)
        if strat is None:
            stats.failed += 1
            return
        t0 = self.timer()
        try:
            picks = list(strat.rank(targets, ctx))
        except Exception:  # noqa: BLE001 - the shadow never affects the request
            picks = []
        if not picks or self.timer() - t0 > self.config.strategy_budget:
            stats.failed += 1
            return
        stats.record(picks[0] is not active[0], picks[0].p_seconds - active[0].p_seconds)

    def score(self, req: ScoreRequest, now: float) -> Scored:
        if now >= self.decisions.due:
            self.decisions.sweep(now)
        if self.sequences.records:
            self.sequences.sweep(now)
        model = req.model
        if not model or len(model) > MAX_TEXT:
            raise ScoreError("model", f"must be 1-{MAX_TEXT} characters")
        slo = self._slo(req.slo_class) if req.slo_class else None
        deadline: float | None = req.deadline
        if not 0.0 <= req.deadline < _INF:  # NaN fails too
            raise ScoreError("deadline", "must be a finite number of seconds >= 0")
        if not deadline:
            deadline = slo["deadline_ms"] / 1000 if slo else None
        policy = self.policy_version()
        lane = self._lanes.get(model)
        if (lane is None or lane.policy != policy or lane.generation != self.fused.generation
                or now >= lane.until):
            lane = self._lane(model, policy, now)
        routing = lane.routing
        if req.sequence:
            return self._score_sequence(req, slo, deadline, routing, now)
        units = work_units(req.payload_bytes)
        targets, degraded = self.candidates(req, routing, now, units, lane.targets)
        counters = self.counters
        if not targets:
            counters.shed["no_targets"] += 1
            return Scored([], Verdict(False, "no_targets", self.config.retry_after_bounds[1]))
        if degraded:
            counters.degraded += 1
        if len(targets) == 1 and routing.shadow is None:
            ranked, used = targets, routing.strategy  # nothing to rank
        else:
            ctx = Context(model, units, routing.max_targets, self.zone, routing, self.rng, 0.0)
            ranked, used = self.rank(targets, ctx)
            if routing.shadow is not None:
                self._shadow(model, ranked, targets, ctx)
        counters.decisions[used] += 1
        tenant = self.tenants.state(req.tenant, now, policy)
        priority = slo["shed_priority"] if slo else tenant.priority
        ms = lane.state
        verdict, first = self._admit_targets(req, ranked, targets, tenant, priority, deadline,
                                             routing, now, ms)
        if not verdict.admit:
            counters.shed[verdict.reason] += 1
            return Scored([_choice(t) for t in ranked], verdict, strategy=used,
                          degraded=degraded)
        assert first is not None
        delay = 0.0
        if req.idempotent and len(ranked) > 1 and (slo is None or slo["hedging"]):
            if ms.budget.tokens >= 1:
                fixed = slo["hedge_after_ms"] / 1000 if slo and slo["hedge_after_ms"] else None
                delay = hedge_after(first, routing.hedge_quantile, fixed, deadline,
                                    self.config.min_hedge_after)
                if delay:
                    counters.hedges_offered += 1
            else:
                counters.hedge_budget_exhausted[req.model] += 1
        ms.budget.on_request()
        stats = first.stats
        upr = stats.units_per_request
        if units != upr:  # unchanged, the float object stays (predict_all's cache compares it)
            stats.units_per_request = upr + 0.1 * (units - upr)
        c = 1 / stats.correction
        if len(ranked) == 1:  # no comprehension (a function call each) for the common case
            predicted = {first.key: (first.rtt, (first.p_queue + first.p_service) * c)}
            choices = [_choice(first)]
        else:
            predicted = {t.key: (t.rtt, (t.p_queue + t.p_service) * c) for t in ranked}
            choices = [_choice(t) for t in ranked]
        d = self.decisions.open(model, tenant, ms.gate, stats, first.key, predicted, units, now,
                                now + (deadline or self.config.decision_ttl)
                                + self.config.expiry_grace)
        self.fused.observe_start(first.key, now)
        return Scored(choices, ADMIT, delay, d.id, used, degraded)

    def _score_sequence(self, req: ScoreRequest, slo: dict[str, Any] | None,
                        deadline: float | None, routing: RoutingConfig,
                        now: float) -> Scored:
        """A request of a stateful sequence: its one target is where the sequence lives (see
        :mod:`meshd.score.sequences`); admitted like any request, never hedged."""
        counters = self.counters
        key = req.sequence
        table = self.sequences
        walk = False
        rec = None if req.sequence_start else table.get(key, now)
        if rec is not None:
            home = self.table.replica(rec.node, rec.replica)
            if home is None:
                table.end(key)
                counters.shed["sequence_lost"] += 1
                return Scored([Choice(rec.node, rec.endpoint, rec.replica, req.revision, "",
                                      0.0, 0.0, 0.0, 0.0)],
                              Verdict(False, "sequence_lost", 0.0))
            order = [home]
        else:
            eligible = [t for t in self.table.targets(req.model, now).eligible
                        if not req.revision or t.version == req.revision]
            order = rendezvous(key, eligible, _key_of)
            walk = not req.sequence_start
            if not order:
                counters.shed["no_targets"] += 1
                return Scored([], Verdict(False, "no_targets",
                                          self.config.retry_after_bounds[1]))
        units = work_units(req.payload_bytes)
        predict_all(order, units, now)
        tenant = self.tenants.state(req.tenant, now)
        priority = slo["shed_priority"] if slo else tenant.priority
        first = order[:1]
        verdict, _ = self._admit_targets(req, first, order, tenant, priority, deadline,
                                         routing, now)
        if not verdict.admit:
            counters.shed[verdict.reason] += 1
            return Scored([_choice(t) for t in order], verdict, strategy="sequence")
        counters.decisions["sequence"] += 1
        ms = self._models[req.model]
        ms.budget.on_request()
        head = order[0]
        c = 1 / head.stats.correction
        d = Decision(self.decisions.next_id(), req.model, tenant, ms.gate, head.stats,
                     head.key, {t.key: (t.rtt, (t.p_queue + t.p_service) * c) for t in order},
                     units, now, now + (deadline or self.config.decision_ttl)
                     + self.config.expiry_grace, sequence=key,
                     sequence_end=req.sequence_end)
        self.decisions.add(d)
        self.fused.observe_start(head.key, now)
        if req.sequence_start and not req.sequence_end:
            table.put(key, head.key, head.node, head.endpoint, now)
        return Scored([_choice(t) for t in order], ADMIT, 0.0, d.id, "sequence", walk=walk)

    def _sequence_answered(self, d: Decision, replica: str, now: float) -> None:
        """``replica`` answered a request of ``d``'s sequence: the sequence lives there (or,
        after its END, nowhere)."""
        if d.sequence_end:
            self.sequences.end(d.sequence)
            return
        rec = self.sequences.get(d.sequence, now)
        if rec is not None and rec.replica == replica:
            return  # where the record already says (the usual case)
        home = self.table.by_key.get(replica)
        if home is None:
            for node in self.fused.nodes:
                home = self.table.replica(node, replica)
                if home is not None:
                    break
        if home is not None:
            self.sequences.put(d.sequence, replica, home.node, home.endpoint, now)

    @staticmethod
    def _sent(ranked: list[Target], i: int, now: float) -> Target:
        """``ranked[i]`` took the request: it moves to the front."""
        t = ranked[i]
        t.stats.sent(now)
        if i:
            ranked.insert(0, ranked.pop(i))
        return t

    def _slo(self, name: str) -> dict[str, Any] | None:
        if not name:
            return None
        slo = self.policy("SloClass", name)
        if slo is None:
            raise ScoreError("slo_class", f"no SloClass named {name!r}")
        return slo

    def _admit_targets(self, req: ScoreRequest, ranked: list[Target], targets: list[Target],
                       tenant: Any, priority: int, deadline: float | None,
                       routing: RoutingConfig, now: float,
                       ms: ModelState | None = None) -> tuple[Verdict, Target | None]:
        """Admission for a scored request; on success ``ranked[0]`` is the target whose slot
        was taken (moved to the front if a better-ranked one was full)."""
        if deadline is not None and min(t.p_seconds for t in ranked) > deadline:
            return Verdict(False, "deadline", self._drain(ranked)), None
        if ms is None:
            ms = self._model(req.model, routing)
        if routing.standing_queue:
            # The shortest wait among the ranked targets: a strategy that ranks one overloaded
            # replica first (round robin) must not shed what another could take.
            best = min(ranked, key=_by_queue)
            if ms.standing.shed(best.p_queue, max(routing.standing_queue,
                                                  SERVICES * best.p_service), now):
                return Verdict(False, "standing_queue", self._drain(ranked)), None
        v = self.tenants.check(tenant, now)
        if not v.admit:
            lo, hi = self.config.retry_after_bounds
            return Verdict(False, v.reason, min(hi, max(lo, v.retry_after))), None
        share = _SHARES[priority] if 0 <= priority <= 9 else priority_share(priority)
        capacity = _capacity(targets, share, ms.gate.inflight, self.limiter.min_limit)
        if not ms.gate.try_acquire(capacity, routing.max_concurrency):
            self.tenants.release(tenant)
            return Verdict(False, "model_limit", self._drain(ranked)), None
        # The best target with room, among those predicted to be nearly as quick as the best:
        # a full fast replica must not overflow onto one predicted to take many times longer
        # (bench/routing: the 5x replica's queue, filled that way, set the p99).  Failing
        # that, the quickest target under OVERDRAFT times its limit: a target's limit marks
        # where it starts to queue, not what it can hold; the model's limit sheds.
        worst = ranked[0].p_seconds * OVERFLOW_FACTOR
        for i, t in enumerate(ranked):
            if i and t.p_seconds > worst:
                break
            if t.stats.limit.try_acquire(share):
                return ADMIT, self._sent(ranked, i, now)
        for i, t in enumerate(ranked):
            if t.stats.limit.try_acquire(share, OVERDRAFT):
                return ADMIT, self._sent(ranked, i, now)
        ms.gate.release()
        self.tenants.release(tenant)
        return Verdict(False, "target_limit", self._drain(ranked)), None

    def _drain(self, ranked: list[Target]) -> float:
        """Retry-after for a refused request: the shortest predicted queue, within bounds."""
        lo, hi = self.config.retry_after_bounds
        return min(hi, max(lo, min(t.p_queue for t in ranked)))

    def admit(self, model: str, now: float, *, revision: str = "", payload_bytes: int = 0,
              tenant: str = "", slo_class: str = "") -> tuple[Verdict, int]:
        """Admission alone, for gateways that choose targets themselves: tenant quota and the
        model's limit.  Report an outcome (any replica) with ``last`` to release it."""
        self.decisions.sweep(now)
        if not model or len(model) > MAX_TEXT:
            raise ScoreError("model", f"must be 1-{MAX_TEXT} characters")
        slo = self._slo(slo_class)
        routing = self.routing(model)
        req = ScoreRequest(model, revision, payload_bytes, tenant, slo_class)
        targets, _ = self.candidates(req, routing, now)
        if not targets:
            self.counters.shed["no_targets"] += 1
            return Verdict(False, "no_targets", self.config.retry_after_bounds[1]), 0
        st = self.tenants.state(tenant, now)
        lo, hi = self.config.retry_after_bounds
        v = self.tenants.check(st, now)
        if not v.admit:
            self.counters.shed[v.reason] += 1
            return Verdict(False, v.reason, min(hi, max(lo, v.retry_after))), 0
        ms = self._model(model, routing)
        share = priority_share(slo["shed_priority"] if slo else st.priority)
        capacity = _capacity(targets, share, ms.gate.inflight, self.limiter.min_limit)
        if not ms.gate.try_acquire(capacity, routing.max_concurrency):
            self.tenants.release(st)
            self.counters.shed["model_limit"] += 1
            retry = min(hi, max(lo, min(t.p_queue for t in targets)))
            return Verdict(False, "model_limit", retry), 0
        deadline = slo["deadline_ms"] / 1000 if slo else self.config.decision_ttl
        d = Decision(self.decisions.next_id(), model, st, ms.gate, None, "", {},
                     work_units(payload_bytes), now, now + deadline + self.config.expiry_grace,
                     first_open=False)
        self.decisions.add(d)
        return ADMIT, d.id

    # --- outcomes ----------------------------------------------------------------------------

    def report(self, decision_id: int, replica: str, latency: float, status: Status,
               now: float, *, hedge: bool = False, last: bool = True) -> bool:
        """A request sent on a decision's advice ended at ``replica``.  False when the
        decision is unknown (expired, or 0 for a request routed on WatchTargets weights): the
        target still learns from the outcome."""
        ok = status == Status.OK
        if not 0.0 <= latency < _INF:  # NaN, infinite or negative: no sample
            latency = math.nan
        counters = self.counters
        counters.outcomes[_STATUS_NAMES[status]] += 1
        d = self.decisions.get(decision_id)
        stats = self.table.stats.get(replica) if replica else None
        if stats is not None:
            stats.outcomes += 1
            if hedge and d is not None and d.hedge_key == replica:
                self._hedge_ended(d)
            if ok and latency == latency:
                stats.latency.add(latency)
                self._time_attempt(d, replica, latency)
            elif not ok and status != Status.CANCELLED:
                stats.failures += 1
            started = d is not None and d.first_open and d.first_key == replica
            sent_at = now - latency if latency == latency else now
            if status == Status.CANCELLED:
                stats.cancelled(sent_at)
                if started:
                    self.fused.observe_end(replica)
            else:
                stats.answered(now, sent_at)
                self.fused.observe_outcome(replica, latency, ok, now, started)
        pred = d.predicted.get(replica) if d is not None else None
        if pred is None and stats is not None and ok:
            target = self.table.by_key.get(replica)
            if target is not None:
                pred = target.work(stats.units_per_request)
        if stats is not None and ok and latency == latency and pred is not None and pred[1] > 0:
            # ratio = measured / predicted queue + service, clamped to the bounds and to one
            # step either way of the correction now (written out: no min/max calls)
            waited = latency - pred[0]
            ratio = (waited if waited > 0.0 else 0.0) / pred[1]
            cfg = self.config
            lo, hi = cfg.correction_bounds
            c = stats.correction
            step = cfg.correction_step
            if c / step > lo:
                lo = c / step
            if c * step < hi:
                hi = c * step
            ratio = hi if ratio > hi else lo if ratio < lo else ratio
            stats.correction = c + cfg.correction_weight * (ratio - c)
        if d is None:
            if decision_id:  # 0: a client balancing on WatchTargets weights, no decision
                counters.unknown_outcomes += 1
            return False
        if hedge:
            counters.hedges_sent += 1
            ms = self._models.get(d.model)
            if ms is not None:
                ms.budget.charge()
        if d.first_open and replica == d.first_key and d.first is not None:
            d.first_open = False
            if status == Status.CANCELLED or latency != latency:
                d.first.limit.forget()
            else:
                d.first.limit.release(latency, status in DROPPED, now)
        if d.sequence and replica:
            if ok:
                self._sequence_answered(d, replica, now)
            elif d.sequence_end and last:
                self.sequences.end(d.sequence)
        if last:
            self.decisions.close(d.id)
            self._release(d)
            if ok:
                _observe(counters.requests, d.model, now - d.started)
        return True

    def _time_attempt(self, d: Decision | None, replica: str, latency: float) -> None:
        target = self.table.by_key.get(replica)
        if target is not None:
            if d is None or d.model == target.model:
                timing = target.stats.attempts  # the usual case: no key to build and hash
                if timing is None:
                    key = (target.model, target.node)
                    _observe(self.counters.attempts, key, latency)
                    target.stats.attempts = self.counters.attempts.get(key)
                    return
                timing.observe(latency)
                return
            _observe(self.counters.attempts, (d.model, target.node), latency)

    def _release(self, d: Decision) -> None:
        """Give back the slots a decision still holds."""
        if d.first_open and d.first is not None:
            d.first_open = False
            d.first.limit.forget()
            self.fused.observe_end(d.first_key)
        if d.hedge_key:  # its hedge's outcome never came (a router that went away)
            self._hedge_ended(d)
        d.model_gate.release()
        self.tenants.release(d.tenant)

    def _hedge_ended(self, d: Decision) -> None:
        """The hedge :meth:`hedge_target` counted for ``d`` no longer loads its target."""
        st = self.table.stats.get(d.hedge_key)
        if st is not None and st.hedges > 0:
            st.hedges -= 1
        d.hedge_key = ""

    def _expire(self, d: Decision) -> None:
        self._release(d)

    # --- hedging ----------------------------------------------------------------------------

    def hedge_target(self, decision_id: int, first: str, now: float) -> Choice | None:
        """Where a hedge of a decision's request stuck at ``first`` should go now: the
        decision's other target predicted quickest at this moment (the ranking is as old as
        the hedge delay, and a stall elsewhere may have begun since), or None when ``first``
        is still answering (see :meth:`Target.silent`) or no other target with spare capacity
        is predicted to answer before ``first`` is expected to (ask again later), or there is
        no other target.  The hedge counts in its target's backlog until its outcome is
        reported."""
        by_key = self.table.by_key
        stuck = by_key.get(first)
        if stuck is None or not stuck.silent(now):
            return None
        d = self.decisions.get(decision_id)
        if d is None:
            return None
        others = [t for k in d.predicted if k != first and (t := by_key.get(k)) is not None]
        if not others:
            return None
        predict_all(others, d.units, now)
        if d.hedge_key:  # asked again: counted once already
            best = min(others, key=attrgetter("p_seconds"))
        else:
            # Only to a replica with spare capacity (no more than one request's service of
            # queue ahead): a hedge where requests queue delays each of them, and at 80%
            # load, while a replica stalls, the fast ones are the bottleneck - hedging onto
            # them raised p99 by a fifth (bench/routing).  And only if it is predicted to
            # finish before the silent one is expected to answer (a stall that has lasted s
            # seconds is expected to last about s more).  Else ask again later.
            spare = [t for t in others if t.p_queue <= t.p_service]
            if not spare:
                return None
            best = min(spare, key=attrgetter("p_seconds"))
            if best.p_seconds >= now - stuck.stats.waiting_since:
                return None
            best.stats.hedges += 1  # one hedge per decision is counted
            d.hedge_key = best.key
        return _choice(best)

    # --- what the mesh serves ---------------------------------------------------------------

    def models(self, now: float) -> dict[tuple[str, str], bool]:
        """Every (model, version) any node reports, and the models meshd places with no
        replica yet, and whether a routable replica of each is ready: the router's
        RepositoryIndex and ServerReady."""
        seen: dict[tuple[str, str], bool] = {}
        for entry in self.fused.nodes.values():
            for r in entry.signals.replicas:
                seen.setdefault((r.model, r.version), False)
        for model, version in seen:
            seen[(model, version)] = bool(self.weights(model, version, now)[0])
        served = {model for model, _ in seen}
        for key in self.placed():
            name, _, version = key.partition(":")
            if name not in served:
                seen[(name, version)] = False
        return seen

    # --- weights (WatchTargets) --------------------------------------------------------------

    def weights(self, model: str, revision: str, now: float) -> tuple[list[tuple[Choice, float]],
                                                                       bool]:
        """Each target's share for a router that balances locally: proportional to
        1 / predicted seconds of a one-unit request (fast, idle targets get more)."""
        routing = self.routing(model)
        targets, degraded = self.candidates(ScoreRequest(model, revision), routing, now)
        inv = [1 / max(t.p_seconds, 1e-6) for t in targets]
        total = sum(inv)
        return [(_choice(t), w / total) for t, w in zip(targets, inv, strict=True)], degraded
