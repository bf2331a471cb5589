"""Routing strategies at fleet sizes real servers cannot reach: a queueing simulation.

    .venv/bin/python bench/routing_sim.py [--quick] [--seed N] [--jobs 2]
    .venv/bin/python bench/routing_sim.py --replicas 512 --routers 16 --loads 0.5,0.8 \\
        --staleness 0.1,0.5,2 --strategies least_request,p2c,hybrid --duration 20

A deterministic discrete-event simulation (one heap, simulated seconds) of routers sending an
open-loop Poisson load to Triton-like replicas.  What it measures is the product code: every
simulated router is a real :class:`meshd.score.scorer.Scorer` over its own real
:class:`meshd.signals.fused.FusedState`, with the strategy chosen by a ``RoutingPolicy`` document
validated like the agent's (``policy.model.validate``); admission, adaptive limits, hedge
offers and the outcome feedback (``Scorer.report``) are the scorer's own.

The model:

* **replicas** - FIFO servers with ``--instances`` parallel slots (Lindley's recursion per
  slot, so a request waits for the earliest free slot in arrival order).  Speeds are a mix
  (``--mix``, default 60% 1x, 25% 1.5x, 10% 2x, 5% 5x of ``--base-ms`` 5 ms per request),
  assigned at random; each request's service time is exponential (``--service exp``) or
  lognormal (``--service lognormal --sigma 0.5``) around its replica's mean, and a stall
  (``--stall-ms`` 250 ms) replaces it on ``--stall-prob`` (0.2%) of requests.
* **network** - each router -> replica pair has a round trip drawn uniform in ``--rtt-ms``
  (0.2-2 ms), plus ``--zone-rtt-ms`` (1 ms) when they are in different zones (``--zones``
  4; replicas zoned at random, routers round robin).  Half the RTT before the request
  reaches the replica, half after it finishes.  The scorer is told the true RTT (its
  ``rtt_of``) and zones (``zone_of``; ``hybrid`` adds its zone penalty).
* **signals** - with staleness S, each router takes a snapshot of every replica's true queue
  (waiting requests) and in-flight (executing) every S seconds, at its own phase, and receives
  it U(0, ``--delay-frac`` * S) later as one ``NodeSignals`` per replica node through
  ``FusedState.update(..., "gossip", now)``, with ``ReplicaState.at`` = the measurement time.
  So a figure's age when used runs from 0 to 1.5 S (mean 0.75 S by default).
  ``ReplicaState.spu`` is the replica's true mean service time (stalls included, as Triton's
  statistics would average them) times lognormal noise (``--spu-noise``, 10%) per snapshot.
* **routers** - total rate = load x capacity (capacity = sum of instances / mean service
  time), one Poisson stream whose requests pick a router uniformly (so each router sees a
  Poisson stream of rate/routers).  Each request is scored (``Scorer.score``, 1 work unit);
  refused = shed (the reason is counted); admitted = sent to ``targets[0]``; its outcome is
  reported (``Scorer.report``, status OK) when the response is back at the router.
* **hedging** (on by default, as the product offers it; ``--no-hedge`` sends requests as not
  idempotent, so none is offered) - when the scorer offers ``hedge_after`` and the request is
  not back by then, a copy goes to ``targets[1]``; the first response wins, the winner is
  reported OK (``last=False``) and the loser CANCELLED (``last=True``), each with
  ``hedge=True`` when it is the hedge copy.  The loser is not removed from its replica: it
  still runs (Triton does not abort an executing request; a queued one could be cancelled,
  which this model leaves out, so hedges cost a little more here than they might).

* **the baseline** (``--strategies least_request``) - what users run without meshd: each
  router picks two replicas at random and sends to the one with fewer of its own requests
  outstanding (Envoy's default ``LEAST_REQUEST``); no scorer, signals, admission or hedge.
* **herding** - per run, each replica's share of the requests sent against its share of the
  capacity (1 = its fair share); the table gives the largest and the 99th percentile: where
  routers that share one stale view pile onto the replicas that look best.

Left out: dynamic batching, payload sizes (every request is 1 work unit), request deadlines,
timeouts and errors (no outcome but OK/CANCELLED), replica failures and churn, tenant
quotas and priorities, RTT jitter and coordinate-estimation error, retries of shed requests
(a shed request is gone: open loop), and the routers' own CPU time.

Every random draw comes from ``random.Random`` streams seeded by ``--seed``: the fleet, the
arrival and service-time streams are the same for every strategy (common random numbers),
and the same seed gives the same numbers.  The scorer's strategy-budget timer is a constant
(see ``make_scorer``).  Latency figures count requests that arrived after the warm-up
(10% of the duration); utilisation is each replica's busy time in that window.

Prints one table, writes ``--out`` (JSON) and the same name with ``.md`` (the table and a few
findings).  ``--quick`` runs small sizes and writes nothing unless ``--out`` is given.
Runs (one per strategy x load x staleness) go to ``--jobs`` processes.  The scorer is nearly
all the cost (60-90 us per request at 128 replicas, 160-280 us at 512, on a 2-core Xeon), and
requests grow with the fleet, so cost grows with replicas squared: the defaults are scaled
down to 128 replicas, 8 routers (16 replicas per router; 512/16 has 32) and 10 simulated
seconds, about 4 minutes in 2 processes.  The full-size command above takes about 50 minutes;
``--loads 0.8 --staleness 0.1,2 --duration 3`` at 512/16 about 5.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import multiprocessing
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project (bench/consensus.py): put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from adapters.model import ReplicaState  # noqa: E402
from bench.table import format_table, loadavg, machine_info  # noqa: E402
from meshd.score.limiter import LimiterConfig  # noqa: E402
from meshd.score.scorer import Scorer, ScoreRequest, Status  # noqa: E402
from meshd.signals.fused import FusedState  # noqa: E402
from meshd.signals.wire import NodeSignals  # noqa: E402
from policy.model import validate  # noqa: E402

MODEL = "m"
VERSION = "1"
PAYLOAD_BYTES = 1024
"""One work unit per request."""
START = 100.0
"""Simulated clock at t = 0: ``at`` = 0.0 means "never measured" to the scorer."""
DEFAULT_MIX = ((0.60, 1.0), (0.25, 1.5), (0.10, 2.0), (0.05, 5.0))
"""(share of replicas, service-time multiple of the base)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    strategy: str = "p2c"
    load: float = 0.8
    staleness: float = 0.5
    """Seconds between two snapshots a router receives."""
    replicas: int = 128
    routers: int = 8
    duration: float = 10.0
    """Simulated seconds of arrivals (the run then drains)."""
    warmup_frac: float = 0.1
    seed: int = 1
    instances: int = 1
    base_ms: float = 5.0
    mix: tuple[tuple[float, float], ...] = DEFAULT_MIX
    service: str = "exp"
    sigma: float = 0.5
    stall_prob: float = 0.002
    stall_ms: float = 250.0
    rtt_ms: tuple[float, float] = (0.2, 2.0)
    zones: int = 4
    zone_rtt_ms: float = 1.0
    delay_frac: float = 0.5
    spu_noise: float = 0.1
    hedge: bool = True
    target_limit: bool = True
    """False: the per-target adaptive limits never bind (``--no-target-limit``)."""


@dataclass(slots=True)
class Fleet:
    """What does not depend on the strategy: replicas, zones, RTTs (from the seed only)."""

    nodes: list[str]
    keys: list[str]
    factor: list[float]
    """Service-time multiple of each replica."""
    mean: list[float]
    """True mean service seconds per request (stalls included)."""
    zone: list[str]
    router_zone: list[str]
    rtt: list[list[float]]
    """rtt[router][replica], seconds."""
    capacity: float
    """Requests per second the fleet serves at 100% utilisation."""


def apportion(n: int, shares: list[float]) -> list[int]:
    """Split ``n`` by ``shares`` (largest remainder): counts that sum to ``n``."""
    total = sum(shares)
    exact = [n * s / total for s in shares]
    counts = [int(x) for x in exact]
    order = sorted(range(len(shares)), key=lambda i: -(exact[i] - counts[i]))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def build_fleet(cfg: SimConfig) -> Fleet:
    rng = random.Random(cfg.seed * 7919 + 1)
    counts = apportion(cfg.replicas, [s for s, _ in cfg.mix])
    factors = [f for (_, f), c in zip(cfg.mix, counts, strict=True) for _ in range(c)]
    rng.shuffle(factors)
    base = cfg.base_ms / 1000
    stall = cfg.stall_ms / 1000
    mean = [(1 - cfg.stall_prob) * base * f + cfg.stall_prob * stall for f in factors]
    zones = [f"z{i % cfg.zones}" for i in range(cfg.replicas)]
    rng.shuffle(zones)  # as many replicas in each zone (+-1), speeds spread at random
    router_zone = [f"z{r % cfg.zones}" for r in range(cfg.routers)]
    lo, hi = cfg.rtt_ms
    rtt = [[(rng.uniform(lo, hi) + (cfg.zone_rtt_ms if zones[i] != router_zone[r] else 0.0))
            / 1000 for i in range(cfg.replicas)] for r in range(cfg.routers)]
    nodes = [f"n{i:04d}" for i in range(cfg.replicas)]
    keys = [ReplicaState(MODEL, VERSION, f"{n}:8001").key for n in nodes]
    capacity = sum(cfg.instances / m for m in mean)
    return Fleet(nodes, keys, factors, mean, zones, router_zone, rtt, capacity)


LEAST_REQUEST = "least_request"
"""The client-side baseline, not a meshd strategy: Envoy's default ``LEAST_REQUEST`` (two
random replicas, the one with fewer of this router's own requests outstanding wins).  No
scorer, no signals, no admission, no hedge: what a user's proxy or client library does."""


def routing_spec(strategy: str) -> dict[str, Any]:
    """The ``RoutingPolicy`` spec, validated (defaults filled in) as the agent would hold it
    (the baseline's scorers, unused, get ``p2c``'s)."""
    name = "p2c" if strategy == LEAST_REQUEST else strategy
    doc = validate({"kind": "RoutingPolicy", "name": MODEL, "spec": {"strategy": name}})
    return dict(doc.spec)


UNLIMITED = LimiterConfig(initial=1e12, min_limit=1e12, max_limit=1e12)
"""A limiter configuration that never refuses (for ``--no-target-limit``)."""


def model_limit(scorer: Scorer) -> float:
    """A router's limit for the model: the sum of its targets' adaptive limits."""
    return sum(st.limit.limit for st in scorer.table.stats.values())


def make_scorer(fused: FusedState, fleet: Fleet, router: int, spec: dict[str, Any],
                cfg: SimConfig) -> Scorer:
    rtt = {fleet.nodes[i]: fleet.rtt[router][i] for i in range(len(fleet.nodes))}
    zone = dict(zip(fleet.nodes, fleet.zone, strict=True))
    limits: dict[str, Any] = {}
    if not cfg.target_limit:
        limits["limiter"] = UNLIMITED
    return Scorer(fused, zone=fleet.router_zone[router], **limits,
                  policy=lambda k, n: spec if (k, n) == ("RoutingPolicy", MODEL) else None,
                  rtt_of=rtt.get, zone_of=lambda n: zone.get(n, ""),
                  rng=random.Random(cfg.seed * 1_000_003 + router),
                  # The strategy budget (200 us of wall time) is checked against this timer.
                  # Real time would make the results depend on how fast this machine runs
                  # CPython (a ranking over hundreds of targets crosses 200 us now and then,
                  # and is then replaced by p2c's), so runs would neither repeat nor compare
                  # strategies: the simulation measures the strategies' decisions, not their
                  # speed.  A constant never trips the budget.
                  timer=lambda: 0.0)


class Req:
    __slots__ = ("router", "arrived", "did", "targets", "done", "copies", "spare")

    def __init__(self, router: int, arrived: float, did: int, targets: list[Any],
                 spare: float) -> None:
        self.router = router
        self.arrived = arrived
        self.did = did
        self.targets = targets
        self.done = False
        self.copies: list[Copy] = []
        self.spare = spare
        """The service draw a hedge copy would get (drawn at arrival: common random numbers)."""


class Copy:
    __slots__ = ("req", "replica", "key", "sent", "service", "hedge")

    def __init__(self, req: Req, replica: int, key: str, sent: float, service: float,
                 hedge: bool) -> None:
        self.req = req
        self.replica = replica
        self.key = key
        self.sent = sent
        self.service = service
        self.hedge = hedge


ARRIVE, REACH, DONE, HEDGE, MEASURE, DELIVER = range(6)


def quantile(ordered: list[float], q: float) -> float:
    """Nearest rank of a sorted list (NaN when empty)."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def simulate(cfg: SimConfig) -> dict[str, Any]:
    """One run: one strategy at one load and staleness.  Deterministic in ``cfg``."""
    wall0 = time.perf_counter()
    fleet = build_fleet(cfg)
    n_rep, n_rt = cfg.replicas, cfg.routers
    spec = routing_spec(cfg.strategy)
    fused = [FusedState(f"router{r}") for r in range(n_rt)]
    scorers = [make_scorer(fused[r], fleet, r, spec, cfg) for r in range(n_rt)]
    index = {k: i for i, k in enumerate(fleet.keys)}
    rate = cfg.load * fleet.capacity
    end = START + cfg.duration
    w0 = START + cfg.warmup_frac * cfg.duration
    window = end - w0

    # Streams: arrivals and service draws are the same whatever the strategy.
    arr_rng = random.Random(cfg.seed * 7919 + 2)
    svc_rng = random.Random(cfg.seed * 7919 + 3)
    sig_rng = random.Random(cfg.seed * 7919 + 4)
    pick_rng = random.Random(cfg.seed * 7919 + 5)  # the least-request baseline's two choices
    least_request = cfg.strategy == LEAST_REQUEST
    own = [[0] * n_rep for _ in range(n_rt)]
    """Per router, its requests outstanding at each replica (the least-request baseline's
    only signal)."""
    base = cfg.base_ms / 1000
    stall_s = cfg.stall_ms / 1000
    stall_p = cfg.stall_prob
    lognormal = cfg.service == "lognormal"
    mu = -cfg.sigma ** 2 / 2
    sigma = cfg.sigma
    noise_mu = -cfg.spu_noise ** 2 / 2
    factor = fleet.factor
    rtt = fleet.rtt

    slots: list[list[float]] = [[START] * cfg.instances for _ in range(n_rep)]
    outstanding: list[list[float]] = [[] for _ in range(n_rep)]
    busy = [0.0] * n_rep
    sent_to = [0] * n_rep

    heap: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(t: float, kind: int, obj: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, obj))

    def snapshot(t: float, batch: int) -> list[tuple[str, NodeSignals]]:
        at = {"ready": t, "queue": t, "stats": t}
        out = []
        inst = cfg.instances
        for i in range(n_rep):
            o = outstanding[i]
            while o and o[0] <= t:
                heapq.heappop(o)
            n = len(o)
            running = n if n < inst else inst
            spu = fleet.mean[i]
            if cfg.spu_noise:
                spu *= math.exp(sig_rng.gauss(noise_mu, cfg.spu_noise))
            rs = ReplicaState(MODEL, VERSION, f"{fleet.nodes[i]}:8001", ready=True,
                              queue=n - running, inflight=running, instances=inst, spu=spu,
                              at=at)
            out.append((fleet.nodes[i], NodeSignals(1, batch, [rs])))
        return out

    # Every router starts with a snapshot of the idle fleet, then one every S at its phase.
    first = snapshot(START, 1)
    for r in range(n_rt):
        for node, sig in first:
            fused[r].update(node, sig, "gossip", START)
        push(START + sig_rng.uniform(0, cfg.staleness), MEASURE, (r, 2))
    push(START + arr_rng.expovariate(rate), ARRIVE, None)

    arrived = shed = completed = 0
    w_arrived = w_shed = w_completed = 0
    shed_reasons: Counter[str] = Counter()
    shed_bins: set[tuple[int, int]] = set()
    """(router, 100 ms of simulated time) in which that router shed at least once."""
    limit_at_shed: list[float] = []
    """The router's limit for the model (its targets' limits summed) when it shed a request."""
    latencies: list[float] = []
    hedges = hedge_wins = 0
    events = 0
    # Without hedging the requests say they are not idempotent: the scorer offers no hedge.
    request = ScoreRequest(MODEL, payload_bytes=PAYLOAD_BYTES, idempotent=cfg.hedge)

    def draw() -> float:
        """A service time at a 1x replica; negative: a stall of that many seconds, whatever
        the replica's speed."""
        if stall_p and svc_rng.random() < stall_p:
            return -stall_s
        if lognormal:
            return base * math.exp(svc_rng.gauss(mu, sigma))
        return base * svc_rng.expovariate(1.0)

    def send(req: Req, i: int, key: str, t: float, draw: float, hedge: bool) -> None:
        service = -draw if draw < 0 else draw * factor[i]
        c = Copy(req, i, key, t, service, hedge)
        req.copies.append(c)
        sent_to[i] += 1
        push(t + rtt[req.router][i] / 2, REACH, c)

    while heap:
        t, _, kind, obj = heapq.heappop(heap)
        events += 1
        if kind == ARRIVE:
            nxt = t + arr_rng.expovariate(rate)
            if nxt < end:
                push(nxt, ARRIVE, None)
            r = int(arr_rng.random() * n_rt)
            s1 = draw()
            s2 = draw()
            arrived += 1
            in_window = t >= w0
            w_arrived += in_window
            if least_request:
                a = int(pick_rng.random() * n_rep)
                b = int(pick_rng.random() * (n_rep - 1))
                b += b >= a
                mine = own[r]
                i = a if mine[a] <= mine[b] else b
                mine[i] += 1
                req = Req(r, t, 0, [], s2)
                send(req, i, fleet.keys[i], t, s1, False)
                continue
            scored = scorers[r].score(request, t)
            if not scored.verdict.admit:
                shed += 1
                w_shed += in_window
                shed_reasons[scored.verdict.reason] += 1
                shed_bins.add((r, int((t - START) * 10)))
                limit_at_shed.append(model_limit(scorers[r]))
                continue
            first_t = scored.targets[0]
            req = Req(r, t, scored.decision_id, scored.targets, s2)
            send(req, index[first_t.replica], first_t.replica, t, s1, False)
            if cfg.hedge and scored.hedge_after > 0 and len(scored.targets) > 1:
                push(t + scored.hedge_after, HEDGE, req)
        elif kind == REACH:
            c = obj
            i = c.replica
            sl = slots[i]
            free = heapq.heappop(sl)
            s = free if free > t else t
            f = s + c.service
            heapq.heappush(sl, f)
            heapq.heappush(outstanding[i], f)
            lo = s if s > w0 else w0
            hi = f if f < end else end
            if hi > lo:
                busy[i] += hi - lo
            push(f + rtt[c.req.router][i] / 2, DONE, c)
        elif kind == DONE:
            c = obj
            req = c.req
            if req.done:
                continue  # a hedge's loser, reported CANCELLED when the winner came back
            req.done = True
            completed += 1
            if req.arrived >= w0:
                w_completed += 1
                latencies.append(t - req.arrived)
            if least_request:
                own[req.router][c.replica] -= 1
                continue
            sc = scorers[req.router]
            others = [o for o in req.copies if o is not c]
            if not others:
                sc.report(req.did, c.key, t - c.sent, Status.OK, t)
                continue
            hedge_wins += c.hedge
            sc.report(req.did, c.key, t - c.sent, Status.OK, t, hedge=c.hedge, last=False)
            loser = others[0]
            sc.report(req.did, loser.key, t - loser.sent, Status.CANCELLED, t,
                      hedge=loser.hedge, last=True)
        elif kind == HEDGE:
            req = obj
            if req.done:
                continue
            hedges += 1
            tgt = req.targets[1]
            send(req, index[tgt.replica], tgt.replica, t, req.spare, True)
        elif kind == MEASURE:
            r, batch = obj
            if t < end:
                delay = sig_rng.uniform(0, cfg.delay_frac * cfg.staleness)
                push(t + delay, DELIVER, (r, snapshot(t, batch)))
                push(t + cfg.staleness, MEASURE, (r, batch + 1))
        else:  # DELIVER
            r, sigs = obj
            fr = fused[r]
            for node, sig in sigs:
                fr.update(node, sig, "gossip", t)

    latencies.sort()
    util = [b / (window * cfg.instances) for b in busy]
    mean_util = sum(util) / n_rep
    by_class: dict[str, dict[str, float]] = {}
    for _, f in cfg.mix:
        idx = [i for i in range(n_rep) if factor[i] == f]
        if idx:
            by_class[f"{f:g}x"] = {
                "replicas": len(idx),
                "util_mean": sum(util[i] for i in idx) / len(idx),
                "traffic_share": sum(sent_to[i] for i in idx) / max(1, sum(sent_to))}
    counters = [s.counters for s in scorers]
    fallbacks: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    for k in counters:
        fallbacks.update(k.fallbacks)
        decisions.update(k.decisions)
    model_limits = [model_limit(s) for s in scorers]
    # Herding: each replica's share of the requests sent against its share of the capacity
    # (1 = its fair share); the largest is where routers piled on.
    sent_total = max(1, sum(sent_to))
    cap_share = [1 / factor[i] for i in range(n_rep)]
    cap_total = sum(cap_share)
    herd = [(sent_to[i] / sent_total) / (cap_share[i] / cap_total) for i in range(n_rep)]
    target_limits = [st.limit.limit for s in scorers for st in s.table.stats.values()]
    return {
        "strategy": cfg.strategy, "load": cfg.load, "staleness_s": cfg.staleness,
        "arrived": arrived, "shed": shed, "completed": completed,
        "window": {"arrived": w_arrived, "shed": w_shed, "completed": w_completed,
                   "seconds": window},
        "p50_ms": quantile(latencies, 0.5) * 1000, "p99_ms": quantile(latencies, 0.99) * 1000,
        "p999_ms": quantile(latencies, 0.999) * 1000,
        "mean_ms": sum(latencies) / len(latencies) * 1000 if latencies else math.nan,
        "max_ms": (latencies[-1] if latencies else math.nan) * 1000,
        "throughput_rps": w_completed / window, "offered_rps": rate,
        "shed_rate": w_shed / max(1, w_arrived), "shed_reasons": dict(shed_reasons),
        "util_mean": mean_util, "util_max": max(util),
        "imbalance": max(util) / mean_util if mean_util > 0 else math.nan,
        "herd_max": max(herd), "herd_p99": sorted(herd)[int(0.99 * (n_rep - 1))],
        "by_class": by_class,
        "hedges": hedges, "hedge_wins": hedge_wins, "hedge_rate": hedges / max(1, completed),
        "decisions": dict(decisions), "fallbacks": dict(fallbacks),
        "degraded": sum(k.degraded for k in counters),
        "unknown_outcomes": sum(k.unknown_outcomes for k in counters),
        "model_limit": _spread(model_limits), "target_limit": _spread(target_limits),
        "model_limit_at_shed": _spread(limit_at_shed) | (
            {"median": sorted(limit_at_shed)[len(limit_at_shed) // 2]} if limit_at_shed else {}),
        "shed_intervals": len(shed_bins),
        "shed_interval_share": len(shed_bins) / (n_rt * math.ceil(cfg.duration * 10)),
        "capacity_rps": fleet.capacity, "events": events,
        "wall_s": time.perf_counter() - wall0,
    }


def _spread(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"min": min(xs), "mean": sum(xs) / len(xs), "max": max(xs)}


def _run(cfg: SimConfig) -> dict[str, Any]:
    return simulate(cfg)


# --- reporting ----------------------------------------------------------------------------------

HEAD = ("load", "staleness s", "strategy", "p50 ms", "p99 ms", "p99.9 ms", "throughput req/s",
        "shed %", "util max/mean", "traffic/capacity share max (p99)", "hedged %")


def _ms(x: float) -> str:
    return "-" if x != x else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def build_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in sorted(results, key=_order):
        rows.append([f"{r['load']:g}", f"{r['staleness_s']:g}", r["strategy"], _ms(r["p50_ms"]),
                     _ms(r["p99_ms"]), _ms(r["p999_ms"]), f"{r['throughput_rps']:,.0f}",
                     f"{r['shed_rate'] * 100:.2f}", f"{r['imbalance']:.2f}",
                     f"{r['herd_max']:.2f} ({r['herd_p99']:.2f})",
                     f"{r['hedge_rate'] * 100:.1f}"])
    return rows


_STRATEGY_ORDER: dict[str, int] = {}


def _order(r: dict[str, Any]) -> tuple[float, float, int, str]:
    return (r["load"], r["staleness_s"], _STRATEGY_ORDER.get(r["strategy"], 99), r["strategy"])


def build_findings(results: list[dict[str, Any]]) -> list[str]:
    """A few statements computed from the results; the explanations are printed only when the
    numbers show what they explain."""
    cells: dict[tuple[float, float], dict[str, dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["load"], r["staleness_s"]), {})[r["strategy"]] = r
    loads = sorted({r["load"] for r in results})
    stales = sorted({r["staleness_s"] for r in results})
    out = []
    best = []
    for (load, stale), by in sorted(cells.items()):
        top = min(by.values(), key=lambda r: r["p99_ms"])
        line = f"{load:g}/{stale:g} s {top['strategy']} {_ms(top['p99_ms'])}"
        rr = by.get("baseline_rr")
        if rr is not None and top is not rr and top["p99_ms"] > 0:
            line += f" ({rr['p99_ms'] / top['p99_ms']:.0f}x under baseline_rr)"
        best.append(line)
    out.append("Lowest p99 (ms) per load/staleness: " + "; ".join(best) + ".")

    pairs = [(k, by["hybrid"], by["p2c"]) for k, by in sorted(cells.items())
             if "hybrid" in by and "p2c" in by]
    if pairs:
        def cell(k: tuple[float, float], h: dict[str, Any], p: dict[str, Any]) -> str:
            return f"{k[0]:g}/{k[1]:g} s {_ms(h['p99_ms'])} vs {_ms(p['p99_ms'])}"

        lower = [k for k, h, p in pairs if h["p99_ms"] < 0.95 * p["p99_ms"]]
        tie = [cell(k, h, p) for k, h, p in pairs
               if 0.95 * p["p99_ms"] <= h["p99_ms"] <= 1.05 * p["p99_ms"]]
        higher = [cell(k, h, p) for k, h, p in pairs if h["p99_ms"] > 1.05 * p["p99_ms"]]
        p50 = sum(h["p50_ms"] < p["p50_ms"] for _, h, p in pairs)
        text = (f"hybrid vs p2c p99: lower by more than 5% in {len(lower)} of {len(pairs)} "
                f"cells" + (f", within 5% in {'; '.join(tie)}" if tie else "")
                + (f", HIGHER in {'; '.join(higher)}" if higher else "")
                + f"; p50 lower in {p50} of {len(pairs)}")
        busiest = [(h, p) for k, h, p in pairs if k[0] == loads[-1]]
        slow = [(h["by_class"].get("5x"), p["by_class"].get("5x")) for h, p in busiest]
        if slow and all(a and b for a, b in slow):
            hu = sum(a["util_mean"] for a, _ in slow if a) / len(slow)
            pu = sum(b["util_mean"] for _, b in slow if b) / len(slow)
            if pu > hu:
                text += (f".  p2c keeps every speed class about equally busy (5x replicas "
                         f"{pu:.0%} busy at load {loads[-1]:g}, vs {hu:.0%} under hybrid): a "
                         f"request that lands there waits behind 5x-slower work, and those "
                         f"requests make its tail")
        out.append(text + ".")

    if len(stales) > 1:
        parts, flips = [], []
        for name in ("hybrid", "least_queue", "p2c"):
            seq = [cells[(loads[-1], st)].get(name) for st in stales]
            if any(x is None for x in seq):
                continue
            p99 = [x["p99_ms"] for x in seq if x is not None]
            parts.append(f"{name} {'/'.join(_ms(v) for v in p99)}")
            if min(p99[1:]) < 0.8 * p99[0]:
                flips.append(name)
        if parts:
            text = (f"p99 (ms) at load {loads[-1]:g} by staleness "
                    f"{'/'.join(f'{s:g}' for s in stales)} s: {', '.join(parts)}")
            if flips:
                text += (f".  Fresher is not always better for {', '.join(flips)}: the scorer "
                         f"takes a reported backlog at face value until the next snapshot "
                         f"(max(reported, own in-flight), not aged by what the replica drained "
                         f"since), so routers shun replicas that were busy at the snapshot and "
                         f"pile onto those that were idle, for a period worth tens of service "
                         f"times")
            out.append(text + ".")

    shed = [r for r in results if r["shed"]]
    if shed:
        reasons: Counter[str] = Counter()
        for r in shed:
            reasons.update(r["shed_reasons"])
        worst: dict[str, dict[str, Any]] = {}
        for r in shed:
            if r["strategy"] not in worst or r["shed_rate"] > worst[r["strategy"]]["shed_rate"]:
                worst[r["strategy"]] = r
        limits = [r["model_limit_at_shed"]["median"] for r in shed
                  if r.get("model_limit_at_shed")]
        text = (f"Shedding in {len(shed)} of {len(results)} runs ({dict(reasons)}); worst per "
                f"strategy: " + ", ".join(
                    f"{n} {r['shed_rate'] * 100:.1f}% ({r['load']:g}/{r['staleness_s']:g} s)"
                    for n, r in worst.items()))
        if limits and reasons.get("model_limit", 0) >= sum(reasons.values()) / 2:
            text += (f".  Nearly all is the model's limit, the sum of its targets' adaptive "
                     f"limits (median when shedding {sorted(limits)[len(limits) // 2]:.0f})")
        out.append(text + ".")
    else:
        out.append("No request was shed in any run.")
    rrs = [r for r in results if r["strategy"] == "baseline_rr" and "5x" in r["by_class"]]
    if rrs:
        u = max(rrs, key=lambda r: (r["load"], r["staleness_s"]))
        out.append(f"baseline_rr (context only) at load {u['load']:g}: the 5x replicas are "
                   f"{u['by_class']['5x']['util_mean']:.0%} busy while the fleet averages "
                   f"{u['util_mean']:.0%}; their queues (per-target limits reach "
                   f"{u['target_limit'].get('max', 0):.0f} per router, from 20: Gradient2 takes "
                   f"a lasting latency as the new baseline) make the p99, and the model's "
                   f"limit then sheds {u['shed_rate']:.0%} of all requests, healthy replicas' "
                   f"included.")
    return out


def _git() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout
        return ""

    dirty = [line[3:] for line in run("status", "--porcelain").splitlines() if line.strip()]
    return {"commit": run("rev-parse", "HEAD").strip(), "dirty_files": dirty}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _mix(text: str) -> tuple[tuple[float, float], ...]:
    """``0.6:1,0.25:1.5`` -> ((0.6, 1.0), (0.25, 1.5))."""
    out = []
    for part in text.split(","):
        share, _, mult = part.partition(":")
        out.append((float(share), float(mult)))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes (32 replicas, 4 routers, 4 s), a smoke check")
    ap.add_argument("--replicas", type=int, default=0, help="default 128 (quick 32)")
    ap.add_argument("--routers", type=int, default=0, help="default 8 (quick 4)")
    ap.add_argument("--loads", default="0.5,0.8", help="offered load, share of capacity")
    ap.add_argument("--staleness", default="0.1,0.5,2",
                    help="seconds between the snapshots a router receives")
    ap.add_argument("--strategies", default="baseline_rr,least_queue,p2c,hybrid")
    ap.add_argument("--duration", type=float, default=0.0,
                    help="simulated seconds of arrivals (default 10; quick 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instances", type=int, default=1, help="parallel slots per replica")
    ap.add_argument("--base-ms", type=float, default=5.0, help="mean service of a 1x replica")
    ap.add_argument("--mix", type=_mix, default=DEFAULT_MIX,
                    help="share:multiple,... of replica speeds (default 0.6:1,0.25:1.5,"
                         "0.1:2,0.05:5)")
    ap.add_argument("--service", choices=("exp", "lognormal"), default="exp")
    ap.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma")
    ap.add_argument("--stall-prob", type=float, default=0.002)
    ap.add_argument("--stall-ms", type=float, default=250.0)
    ap.add_argument("--rtt-ms", type=_floats, default=[0.2, 2.0], help="lo,hi")
    ap.add_argument("--zones", type=int, default=4)
    ap.add_argument("--zone-rtt-ms", type=float, default=1.0)
    ap.add_argument("--delay-frac", type=float, default=0.5,
                    help="delivery delay U(0, frac * staleness)")
    ap.add_argument("--spu-noise", type=float, default=0.1)
    ap.add_argument("--no-hedge", action="store_true", help="requests not idempotent")
    ap.add_argument("--no-target-limit", action="store_true",
                    help="the scorer's per-target adaptive limits never refuse")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results (and .md beside it); default "
                         "bench/results/routing_sim.json, none with --quick")
    args = ap.parse_args(argv)
    q = args.quick
    out: Path | None = args.out or (None if q else ROOT / "bench" / "results" /
                                    "routing_sim.json")
    strategies = [s for s in args.strategies.split(",") if s]
    _STRATEGY_ORDER.update({s: i for i, s in enumerate(strategies)})
    base = SimConfig(replicas=args.replicas or (32 if q else 128),
                     routers=args.routers or (4 if q else 8),
                     duration=args.duration or (4.0 if q else 10.0), seed=args.seed,
                     instances=args.instances, base_ms=args.base_ms, mix=args.mix,
                     service=args.service, sigma=args.sigma, stall_prob=args.stall_prob,
                     stall_ms=args.stall_ms, rtt_ms=(args.rtt_ms[0], args.rtt_ms[1]),
                     zones=args.zones, zone_rtt_ms=args.zone_rtt_ms,
                     delay_frac=args.delay_frac, spu_noise=args.spu_noise,
                     hedge=not args.no_hedge,
                     target_limit=not args.no_target_limit)
    for s in strategies:
        routing_spec(s)  # fails early on a name the policy schema refuses
    runs = [replace(base, strategy=s, load=load, staleness=stale)
            for load in _floats(args.loads) for stale in _floats(args.staleness)
            for s in strategies]
    started = time.perf_counter()
    print(f"routing_sim: {len(runs)} runs in {args.jobs} processes{' (quick)' if q else ''}, "
          f"{base.replicas} replicas, {base.routers} routers, {base.duration:g} s, "
          f"seed {base.seed}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    if args.jobs <= 1:
        for cfg in runs:
            results.append(_run(cfg))
            _progress(results[-1])
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs) as pool:
            for r in pool.imap_unordered(_run, runs):
                results.append(r)
                _progress(r)
    results.sort(key=_order)
    wall = time.perf_counter() - started
    rows = build_rows(results)
    findings = build_findings(results)
    fleet = build_fleet(base)
    title = (f"Routing strategies, simulated: {base.replicas} replicas, {base.routers} routers, "
             f"{base.duration:g} s{', QUICK sizes' if q else ''}")
    setup_line = (f"Real Scorer per router (timer fixed).  Replicas: 1 slot x "
                  f"{base.instances}, {base.service} service, base {base.base_ms:g} ms, mix "
                  f"{', '.join(f'{s:.0%} {m:g}x' for s, m in base.mix)}, stalls "
                  f"{base.stall_ms:g} ms on {base.stall_prob:.1%}; capacity "
                  f"{fleet.capacity:,.0f} req/s.  RTT {base.rtt_ms[0]:g}-{base.rtt_ms[1]:g} ms "
                  f"+ {base.zone_rtt_ms:g} ms across {base.zones} zones.  Signals every "
                  f"'staleness' s, delivered U(0, {base.delay_frac:g} x staleness) later, spu "
                  f"noise {base.spu_noise:.0%}.  Hedging {'on' if base.hedge else 'off'}"
                  f"{'' if base.target_limit else ', target limits off'}.  "
                  f"Latency over arrivals after {base.warmup_frac:.0%} warm-up.")
    print(f"\n{title}\n{setup_line}\n")
    table = format_table(HEAD, rows)
    print(table)
    for f in findings:
        print(f"\n* {f}")
    print(f"\nwall time {wall:.0f} s")
    if out is None:
        return 0
    report = {
        "benchmark": "routing_sim", "quick": q, "argv": sys.argv if argv is None else argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": _git(), "wall_s": wall,
        "setup": asdict(base) | {"strategy": None, "load": None, "staleness": None,
                                 "loads": _floats(args.loads),
                                 "staleness_s": _floats(args.staleness),
                                 "strategies": strategies, "capacity_rps": fleet.capacity,
                                 "start_offset_s": START, "payload_bytes": PAYLOAD_BYTES,
                                 "routing_policy": {s: routing_spec(s) for s in strategies}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "findings": findings, "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    md = out.with_suffix(".md")
    argv_text = " ".join(["bench/routing_sim.py", *(sys.argv[1:] if argv is None else argv)])
    lines = [f"# {title}", "",
             f"{report['when']}, {report['cpu_count']} CPUs ({report['cpu_model']}), Python "
             f"{report['python']}, commit {report['git']['commit'][:12]}"
             + (f" + uncommitted changes in {len(report['git']['dirty_files'])} paths (listed "
                f"in the JSON)" if report["git"]["dirty_files"] else "") + ".", "",
             f"`{argv_text}`", "", setup_line, "", table, "",
             *[f"* {f}" for f in findings], "",
             f"Wall time {wall:.0f} s ({args.jobs} processes). Full data: `{out.name}`.", ""]
    md.write_text("\n".join(lines))
    for p in (out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 0


def _progress(r: dict[str, Any]) -> None:
    print(f"  {r['strategy']:<12} load {r['load']:g} staleness {r['staleness_s']:g} s: "
          f"p99 {_ms(r['p99_ms'])} ms, shed {r['shed_rate'] * 100:.2f}% "
          f"({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
