"""The scorer: eligibility, prediction, strategies, admission, hedging, outcomes."""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.model import GpuState, ReplicaState
from meshd.score.config import ScoreConfig
from meshd.score.scorer import ScoreError, Scorer, ScoreRequest, Status
from meshd.score.strategies import default_registry
from meshd.score.strategy import Context, Registry
from meshd.score.target import Target
from meshd.signals.fused import FusedState
from meshd.signals.wire import NodeSignals
from policy.model import validate

NOW = 1000.0


def rep(endpoint: str, *, model: str = "m", version: str = "1", queue: int = 0,
        spu: float = 0.01, instances: int = 1, ready: bool = True, at: float = NOW,
        inflight: int | None = None) -> ReplicaState:
    return ReplicaState(model=model, version=version, endpoint=endpoint, ready=ready,
                        queue=queue, inflight=inflight, instances=instances, spu=spu,
                        at={"ready": at, "queue": at, "stats": at})


class Mesh:
    """A real FusedState and policy documents, as the agent would hand the scorer."""

    def __init__(self) -> None:
        self.flags: dict[str, list[str]] = {}
        self.fused = FusedState("r", lambda n: self.flags.get(n, []))
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.rtt: dict[str, float] = {}
        self.zones: dict[str, str] = {}
        self.seq = 0

    def node(self, name: str, *reps: ReplicaState, gpus: Sequence[GpuState] = ()) -> None:
        self.seq += 1
        self.fused.update(name, NodeSignals(1, self.seq, list(reps), list(gpus)), "gossip",
                          NOW)

    def put(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        self.docs[(kind, name)] = validate({"kind": kind, "name": name, "spec": spec}).spec
        self.version += 1

    def scorer(self, **kw: Any) -> Scorer:
        kw.setdefault("rng", random.Random(7))
        return Scorer(self.fused, zone=kw.pop("zone", "z1"),
                      policy=lambda k, n: self.docs.get((k, n)),
                      policy_version=lambda: self.version,
                      rtt_of=self.rtt.get, zone_of=lambda n: self.zones.get(n, "z1"), **kw)


def names(scored: Any) -> list[str]:
    return [t.endpoint for t in scored.targets]


def test_prediction_is_seconds_of_work() -> None:
    mesh = Mesh()
    mesh.rtt["a"] = 0.005
    mesh.node("a", rep("a:1", queue=4, spu=0.01, instances=2))
    s = mesh.scorer()
    out = s.score(ScoreRequest("m", payload_bytes=3 * 32 * 1024), NOW)
    t = out.targets[0]
    # queue 4 requests of 1 unit over 2 instances, then this request's 3 units
    assert t.queue == pytest.approx(4 * 0.01 / 2)
    assert t.service == pytest.approx(3 * 0.01)
    assert t.rtt == pytest.approx(0.005)
    assert t.predicted == pytest.approx(0.005 + 0.02 + 0.03)
    assert out.verdict.admit and out.decision_id > 0


def test_a_reported_backlog_drains_as_it_ages() -> None:
    """A queue of 10 measured 40 ms ago at 10 ms a request has 4 requests left in it: routers
    do not keep steering around a replica for as long as its last report said it was busy."""
    mesh = Mesh()
    mesh.node("a", rep("a:1", queue=10, spu=0.01, at=NOW - 0.04))
    t = mesh.scorer().score(ScoreRequest("m"), NOW).targets[0]
    assert t.queue == pytest.approx(6 * 0.01)
    t = mesh.scorer().score(ScoreRequest("m"), NOW + 0.5).targets[0]
    assert t.queue == pytest.approx(0.0)


def test_ineligible_targets_are_left_out() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.node("b", rep("b:1", ready=False))
    mesh.node("c", rep("c:1"))
    mesh.node("d", rep("d:1"))
    mesh.node("e", rep("e:1"))
    mesh.node("f", rep("f:1", model="other"))
    mesh.flags = {"c": ["cordoned"], "d": ["draining"], "e": ["quarantined"]}
    s = mesh.scorer()
    assert names(s.score(ScoreRequest("m"), NOW)) == ["a:1"]
    mesh.put("ModelPin", "m", {"nodes": ["c", "e"]})
    out = s.score(ScoreRequest("m"), NOW)
    assert out.targets == [] and out.verdict.reason == "no_targets"
    mesh.flags = {}
    mesh.version += 1
    assert sorted(names(s.score(ScoreRequest("m"), NOW))) == ["c:1", "e:1"]


def test_pins_by_zone_and_gpu_memory() -> None:
    mesh = Mesh()
    gib = 1 << 30
    mesh.zones = {"a": "z1", "b": "z2"}
    mesh.node("a", rep("a:1"), gpus=[GpuState("g-a", 0, "A100", 80 * gib, 2 * gib)])
    mesh.node("b", rep("b:1"), gpus=[GpuState("g-b", 0, "A100", 80 * gib, 40 * gib)])
    s = mesh.scorer()
    mesh.put("ModelPin", "m:1", {"min_free_vram_mb": 10 * 1024})
    assert names(s.score(ScoreRequest("m"), NOW)) == ["b:1"]
    mesh.put("ModelPin", "m:1", {"zones": ["z1"]})
    assert names(s.score(ScoreRequest("m"), NOW)) == ["a:1"]


def test_revision_and_exclude() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", version="1"), rep("a:1", version="2"))
    mesh.node("b", rep("b:1", version="2"))
    s = mesh.scorer()
    got = s.score(ScoreRequest("m", revision="2", exclude=frozenset({"b"})), NOW)
    assert [(t.endpoint, t.version) for t in got.targets] == [("a:1", "2")]
    got = s.score(ScoreRequest("m", exclude=frozenset({"a:1/m/1", "a:1/m/2"})), NOW)
    assert names(got) == ["b:1"]


def test_stale_targets_are_dropped_until_all_are_stale() -> None:
    mesh = Mesh()
    mesh.put("RoutingPolicy", "m", {"stale_after_ms": 1000})
    mesh.node("a", rep("a:1", at=NOW - 5))
    mesh.node("b", rep("b:1"))
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    assert names(out) == ["b:1"] and not out.degraded
    # later, both are stale: decisions go on from own observations, and say so
    out = s.score(ScoreRequest("m"), NOW + 10)
    assert sorted(names(out)) == ["a:1", "b:1"] and out.degraded
    assert s.counters.degraded == 1


def test_degraded_mode_ignores_stale_backlog() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", queue=50, at=NOW - 60))
    mesh.node("b", rep("b:1", queue=0, at=NOW - 60))
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    assert out.degraded
    assert all(t.queue == 0 for t in out.targets)


def _spread(mesh: Mesh, strategy: str, n: int = 400, **kw: Any) -> dict[str, int]:
    mesh.put("RoutingPolicy", "m", {"strategy": strategy, **kw})
    s = mesh.scorer()
    counts: dict[str, int] = {}
    for _ in range(n):
        out = s.score(ScoreRequest("m"), NOW)
        counts[out.targets[0].endpoint] = counts.get(out.targets[0].endpoint, 0) + 1
        # answered as predicted: outcomes confirm the telemetry, the ranking stays its own
        s.report(out.decision_id, out.targets[0].replica, out.targets[0].predicted, Status.OK,
                 NOW)
    return counts


def test_round_robin_rotates() -> None:
    mesh = Mesh()
    for n in "abcd":
        mesh.node(n, rep(f"{n}:1", queue=10 if n == "a" else 0))
    assert _spread(mesh, "baseline_rr", 400) == {f"{n}:1": 100 for n in "abcd"}


def test_least_queue_takes_the_shortest_backlog() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", queue=3))
    mesh.node("b", rep("b:1", queue=1))
    mesh.node("c", rep("c:1", queue=5))
    assert _spread(mesh, "least_queue", 50) == {"b:1": 50}


def test_least_queue_breaks_ties_at_random() -> None:
    mesh = Mesh()
    for n in "abcd":
        mesh.node(n, rep(f"{n}:1", queue=2))
    mesh.node("e", rep("e:1", queue=3))
    counts = _spread(mesh, "least_queue", 400)
    assert set(counts) == {f"{n}:1" for n in "abcd"}
    assert all(60 < c < 140 for c in counts.values()), counts


def test_p2c_never_picks_the_worst_of_two() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.002))
    mesh.node("c", rep("c:1", spu=0.1))
    counts = _spread(mesh, "p2c", 600)
    assert "c:1" not in counts  # c loses every pair it is in
    assert counts["a:1"] > counts["b:1"] > 0  # b wins only against c


def test_hybrid_spreads_among_near_equals_only() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.010))
    mesh.node("b", rep("b:1", spu=0.0105))
    mesh.node("c", rep("c:1", spu=0.02))
    counts = _spread(mesh, "hybrid", 400, randomization=0.1)
    # b wins when its jitter beats a's by its 0.5 ms handicap: 1/8 of the time
    assert set(counts) == {"a:1", "b:1"} and 25 <= counts["b:1"] <= 75


def test_hybrid_prefers_its_zone_and_gpu_headroom() -> None:
    mesh = Mesh()
    gib = 1 << 30
    mesh.zones = {"a": "z2", "b": "z1", "c": "z1"}
    mesh.node("a", rep("a:1"))
    mesh.node("b", rep("b:1"), gpus=[GpuState("g", 0, "T4", 16 * gib, gib // 4)])
    mesh.node("c", rep("c:1", spu=0.0115), gpus=[GpuState("g2", 0, "T4", 16 * gib, 8 * gib)])
    counts = _spread(mesh, "hybrid", 100, randomization=0.0, zone_penalty_ms=5)
    assert counts == {"c:1": 100}


def test_ranking_returns_max_targets_for_failover() -> None:
    mesh = Mesh()
    for i in range(10):
        mesh.node(f"n{i}", rep(f"n{i}:1", spu=0.001 * (i + 1)))
    for strategy in ("baseline_rr", "least_queue", "p2c", "hybrid"):
        mesh.put("RoutingPolicy", "m", {"strategy": strategy, "max_targets": 3})
        out = mesh.scorer().score(ScoreRequest("m"), NOW)
        assert len(out.targets) == 3 and len({t.replica for t in out.targets}) == 3, strategy


class SlowStrategy:
    name = "slow"

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        self.clock[0] += 0.01  # "took" 10 ms
        return sorted(targets, key=lambda t: -t.p_seconds)


class BrokenStrategy:
    name = "broken"

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        raise RuntimeError("bug")


def test_over_budget_unknown_and_failing_strategies_fall_back_to_p2c() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.1))
    clock = [0.0]
    reg = default_registry(plugins=False)
    reg.register("slow", lambda: SlowStrategy(clock))
    reg.register("broken", BrokenStrategy)
    s = mesh.scorer(registry=reg, timer=lambda: clock[0])
    for name, why in (("slow", "over_budget"), ("nope", "unknown"), ("broken", "failed")):
        mesh.put("RoutingPolicy", "m", {"strategy": name})
        out = s.score(ScoreRequest("m"), NOW)
        assert out.strategy == "p2c" and s.counters.fallbacks[why] == 1, name
        assert names(out)[0] == "a:1"  # p2c of two: the better one
        s.report(out.decision_id, out.targets[0].replica, 0.01, Status.OK, NOW)
    assert s.counters.timing["slow"].count == 1


def test_plugin_strategies_load_from_entry_points(tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "meshd_test_plugin.py"
    pkg.write_text(
        "class Reverse:\n"
        "    name = 'reverse'\n"
        "    def rank(self, targets, ctx):\n"
        "        return sorted(targets, key=lambda t: -t.p_seconds)\n")
    dist = tmp_path / "meshd_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: meshd-test-plugin\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[meshd.strategies]\nreverse = meshd_test_plugin:Reverse\n"
        "hybrid = meshd_test_plugin:Reverse\nbad = meshd_test_plugin:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    reg.register("hybrid", lambda: None)  # type: ignore[arg-type,return-value]
    assert reg.load_plugins() == ["reverse"]
    assert "bad" in reg.load_errors and "hybrid" not in reg.load_errors
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.1))
    mesh.put("RoutingPolicy", "m", {"strategy": "reverse"})
    out = mesh.scorer(registry=default_registry()).score(ScoreRequest("m"), NOW)
    assert out.strategy == "reverse" and names(out) == ["b:1", "a:1"]
    sys.modules.pop("meshd_test_plugin", None)


def test_shadow_counts_how_often_and_how_much_picks_differ() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.004))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "shadow": "baseline_rr",
                                    "randomization": 0})
    s = mesh.scorer()
    for _ in range(100):
        out = s.score(ScoreRequest("m"), NOW)
        assert names(out)[0] == "a:1"  # the shadow never changes the answer
        s.report(out.decision_id, out.targets[0].replica, 0.001, Status.OK, NOW)
    sh = s.counters.shadow[("m", "baseline_rr")]
    assert sh.compared == 100 and sh.differed == 50
    assert sh.diff_sum == pytest.approx(50 * 0.003)


def test_full_targets_move_down_and_then_shed_with_retry_after() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.003))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    from meshd.score.limiter import LimiterConfig
    s = mesh.scorer(limiter=LimiterConfig(initial=3, min_limit=3, max_limit=3))
    got = [s.score(ScoreRequest("m"), NOW) for _ in range(11)]
    # priority 5 may fill 0.78 of a limit: 3 per target (in flight 0, 1, 2 < 2.33).  hybrid
    # charges half a request's own service: a (1 ms) leads until its queue outweighs b's
    # 1.5 ms, so the 3rd goes to b.  Full, a overdraws its limit for the 5th (b would take
    # 6 ms, over 1.25x a's 4 ms) and passes the 6th to b (6 ms, within 1.25x a's 5 ms).
    assert [names(o)[0] for o in got[:6]] == ["a:1", "a:1", "b:1", "a:1", "a:1", "b:1"]
    # The model's limit is twice its targets' summed (2 * 0.78 * 6 = 9.4): the 11th is shed.
    assert [o.verdict.admit for o in got] == [True] * 10 + [False]
    assert got[10].verdict.reason == "model_limit"
    assert 0.01 <= got[10].verdict.retry_after <= 5
    # one fast target and two far slower ones, one target returned per decision: the fast
    # one overdraws its limit up to 4x (in flight < 9.4), then sheds as full
    mesh.node("b", rep("b:1", spu=0.05))
    mesh.node("c", rep("c:1", spu=0.05))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0, "max_targets": 1})
    s = mesh.scorer(limiter=LimiterConfig(initial=3, min_limit=3, max_limit=3))
    got = [s.score(ScoreRequest("m"), NOW) for _ in range(11)]
    assert [names(o)[0] for o in got[:10]] == ["a:1"] * 10
    assert [o.verdict.admit for o in got] == [True] * 10 + [False]
    assert got[10].verdict.reason == "target_limit"
    assert s.counters.shed["target_limit"] == 1

def test_priority_shares_the_limit() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.put("SloClass", "gold", {"deadline_ms": 1000, "shed_priority": 9})
    mesh.put("SloClass", "bulk", {"deadline_ms": 1000, "shed_priority": 0})
    from meshd.score.limiter import LimiterConfig
    s = mesh.scorer(limiter=LimiterConfig(initial=10, min_limit=10, max_limit=10))
    # the model's limit is twice its targets' (20): bulk fills half of it, gold the rest
    bulk = [s.score(ScoreRequest("m", slo_class="bulk"), NOW).verdict.admit for _ in range(15)]
    assert bulk == [True] * 10 + [False] * 5
    gold = [s.score(ScoreRequest("m", slo_class="gold"), NOW).verdict.admit for _ in range(15)]
    assert gold == [True] * 10 + [False] * 5


def test_tenant_quotas() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.put("TenantQuota", "t1", {"requests_per_second": 10, "burst": 3})
    mesh.put("TenantQuota", "t2", {"concurrency": 2})
    s = mesh.scorer()
    got = [s.score(ScoreRequest("m", tenant="t1"), NOW) for _ in range(4)]
    assert [g.verdict.admit for g in got] == [True, True, True, False]
    assert got[3].verdict.reason == "tenant_rate"
    assert got[3].verdict.retry_after == pytest.approx(0.1)
    assert s.score(ScoreRequest("m", tenant="t1"), NOW + 0.1).verdict.admit
    d = [s.score(ScoreRequest("m", tenant="t2"), NOW) for _ in range(3)]
    assert [x.verdict.admit for x in d] == [True, True, False]
    assert d[2].verdict.reason == "tenant_concurrency"
    s.report(d[0].decision_id, d[0].targets[0].replica, 0.01, Status.OK, NOW)
    assert s.score(ScoreRequest("m", tenant="t2"), NOW).verdict.admit
    # an unknown tenant is not limited, and costs no table entry
    for i in range(20):
        out = s.score(ScoreRequest("m", tenant=f"x{i}"), NOW)
        assert out.verdict.admit
        s.report(out.decision_id, out.targets[0].replica, 0.01, Status.OK, NOW)
    assert len(s.tenants._tenants) == 2


def test_quota_is_split_between_routers() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.put("TenantQuota", "t", {"concurrency": 10})
    s = mesh.scorer(quota_share=lambda: 0.25)
    got = [s.score(ScoreRequest("m", tenant="t"), NOW).verdict.admit for _ in range(4)]
    assert got == [True, True, False, False]  # round(10 * 0.25) = round(2.5) = 2


def test_model_concurrency_cap() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.node("b", rep("b:1"))
    mesh.put("RoutingPolicy", "m", {"max_concurrency": 3})
    s = mesh.scorer()
    got = [s.score(ScoreRequest("m"), NOW).verdict for _ in range(4)]
    assert [v.admit for v in got] == [True, True, True, False]
    assert got[3].reason == "model_limit"


def test_deadline_that_cannot_be_met_is_shed() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", queue=100, spu=0.01))
    s = mesh.scorer()
    out = s.score(ScoreRequest("m", deadline=0.5), NOW)
    assert not out.verdict.admit and out.verdict.reason == "deadline"
    assert out.verdict.retry_after == pytest.approx(1.0)  # the backlog's drain time
    assert s.score(ScoreRequest("m", deadline=2.0), NOW).verdict.admit


def test_bad_requests_name_the_field() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    s = mesh.scorer()
    with pytest.raises(ScoreError, match="slo_class"):
        s.score(ScoreRequest("m", slo_class="nope"), NOW)
    with pytest.raises(ScoreError, match="model"):
        s.score(ScoreRequest(""), NOW)
    with pytest.raises(ScoreError, match="deadline"):
        s.score(ScoreRequest("m", deadline=math.inf), NOW)


def test_outcomes_release_slots_and_correct_the_estimate() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.01))
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    key = out.targets[0].replica
    stats = s.table.stats[key]
    assert stats.limit.inflight == 1 and s.fused.observed[key].inflight == 1
    assert s.report(out.decision_id, key, 0.04, Status.OK, NOW + 0.04)
    assert stats.limit.inflight == 0 and s.fused.observed[key].inflight == 0
    assert stats.correction > 1  # it took 4x the prediction
    assert not s.report(out.decision_id, key, 0.04, Status.OK, NOW)  # closed already
    for _ in range(60):
        o = s.score(ScoreRequest("m"), NOW)
        s.report(o.decision_id, key, 0.04, Status.OK, NOW)
    assert stats.correction == pytest.approx(4.0, rel=0.02)  # the bound
    assert s.score(ScoreRequest("m"), NOW).targets[0].predicted == pytest.approx(0.04, rel=0.02)


def test_failover_reports_keep_the_admission_until_the_last() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.node("b", rep("b:1"))
    mesh.put("TenantQuota", "t", {"concurrency": 1})
    s = mesh.scorer()
    out = s.score(ScoreRequest("m", tenant="t"), NOW)
    first, second = out.targets[0].replica, out.targets[1].replica
    s.report(out.decision_id, first, 0.5, Status.UNAVAILABLE, NOW, last=False)
    assert s.table.stats[first].limit.inflight == 0
    assert not s.score(ScoreRequest("m", tenant="t"), NOW).verdict.admit  # still held
    s.report(out.decision_id, second, 0.01, Status.OK, NOW, last=True)
    assert s.score(ScoreRequest("m", tenant="t"), NOW).verdict.admit


def test_unreported_decisions_expire_and_release() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.put("TenantQuota", "t", {"concurrency": 1})
    s = mesh.scorer(config=ScoreConfig(decision_ttl=5, expiry_grace=1))
    out = s.score(ScoreRequest("m", tenant="t"), NOW)
    assert not s.score(ScoreRequest("m", tenant="t"), NOW + 5).verdict.admit
    assert s.score(ScoreRequest("m", tenant="t"), NOW + 6.1).verdict.admit
    assert s.decisions.expired == 1
    assert not s.report(out.decision_id, out.targets[0].replica, 0.1, Status.OK, NOW + 7)


def test_hedge_after_is_capped_by_the_prediction() -> None:
    """A replica that stalls now and then has a tail inflated by its stalls: its requests
    are hedged once three times later than predicted, not at that tail."""
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.001))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    s = mesh.scorer()
    for key in ("a:1/m/1", "b:1/m/1"):
        window = s.table.stats_for(key).latency
        for i in range(200):
            window.add(0.5 if i % 50 == 0 else 0.001)  # 2% of 500 ms stalls: p99 is 0.5 s
        window.refresh()
        assert window.quantile(0.99) == 0.5
    out = s.score(ScoreRequest("m"), NOW)
    assert out.targets[0].replica in ("a:1/m/1", "b:1/m/1")
    assert out.hedge_after == pytest.approx(3 * out.targets[0].predicted)
    assert out.hedge_after < 0.01


def test_a_silent_target_looks_busier_the_longer_it_stays_silent() -> None:
    """A stall shows in no statistic until it ends: a target that has answered none of the
    requests sent to it for several service times gets its silence added to its queue."""
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.005))
    mesh.node("b", rep("b:1", spu=0.010))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    s = mesh.scorer()
    first = s.score(ScoreRequest("m"), NOW)
    assert first.targets[0].replica == "a:1/m/1"
    quiet = s.score(ScoreRequest("m", exclude=("b",)), NOW + 0.01)  # a: 2 waiting
    a = s.table.by_key["a:1/m/1"]
    a.predict(1, NOW + 0.01)
    assert a.p_queue == pytest.approx(2 * 0.005)  # 10 ms of silence is 2 gaps: no stall yet
    a.predict(1, NOW + 0.2)
    assert a.p_queue == pytest.approx(2 * 0.005 + 0.2)  # 200 ms without an answer: a stall
    assert s.score(ScoreRequest("m"), NOW + 0.2).targets[0].replica == "b:1/m/1"
    s.report(first.decision_id, "a:1/m/1", 0.2, Status.OK, NOW + 0.2)  # it answers
    a.predict(1, NOW + 0.201)
    assert a.p_queue < 0.05
    s.report(quiet.decision_id, "a:1/m/1", 0.2, Status.OK, NOW + 0.21)
    a.predict(1, NOW + 5)
    assert a.p_queue == 0.0  # nothing waiting: idle, not silent


def test_a_hedge_goes_out_only_from_a_silent_target_to_the_quickest_other_now() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.002))
    mesh.node("b", rep("b:1", spu=0.004))
    mesh.node("c", rep("c:1", spu=0.006))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    assert names(out) == ["a:1", "b:1", "c:1"]
    assert s.hedge_target(out.decision_id, "a:1/m/1", NOW + 0.004) is None  # still answering
    busy = s.score(ScoreRequest("m", exclude=("a",)), NOW)  # b now has one in flight
    assert names(busy)[0] == "b:1"
    to = s.hedge_target(out.decision_id, "a:1/m/1", NOW + 0.1)  # a silent for 100 ms
    assert to is not None and to.replica == "c:1/m/1"  # b's queue makes c the quicker now
    c = s.table.by_key["c:1/m/1"]
    assert c.stats.hedges == 1
    c.predict(1, NOW + 0.1)
    assert c.p_backlog == 1  # the hedge is work c has
    s.report(0, "c:1/m/1", 0.006, Status.OK, NOW + 0.106, hedge=True)  # someone else's
    assert c.stats.hedges == 1
    s.report(out.decision_id, "c:1/m/1", 0.006, Status.OK, NOW + 0.106, hedge=True,
             last=False)
    assert c.stats.hedges == 0
    s.report(out.decision_id, "a:1/m/1", 0.106, Status.CANCELLED, NOW + 0.106)
    a = s.table.by_key["a:1/m/1"]
    assert a.stats.orphans == 1  # a still has that request to run, and has not answered
    assert a.silent(NOW + 0.2)
    a.predict(1, NOW + 0.2)
    assert a.p_queue > 0.1  # nothing of ours in flight there, yet it looks stalled
    mesh.node("a", rep("a:1", spu=0.002, queue=0, at=NOW + 0.25))  # its runtime: queue empty
    s.score(ScoreRequest("m", exclude=("a", "b", "c")), NOW + 0.26)  # no target: rebuilds
    a = s.table.by_key["a:1/m/1"]
    a.predict(1, NOW + 0.26)
    assert a.stats.orphans == 0 and not a.silent(NOW + 0.26) and a.p_queue < 0.01


def test_a_hedge_count_is_given_back_when_its_decision_closes_or_expires() -> None:
    """A hedge whose outcome never comes (the first answered, the router closed the
    decision; or the router went away) must not leave its target looking busy."""
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.004))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    s = mesh.scorer(config=ScoreConfig(decision_ttl=5, expiry_grace=1))
    closed = s.score(ScoreRequest("m"), NOW)
    expired = s.score(ScoreRequest("m"), NOW)
    for out in (closed, expired):
        first = out.targets[0].replica
        assert first == "a:1/m/1"
        to = s.hedge_target(out.decision_id, first, NOW + 0.1)
        assert to is not None and to.replica != first
    other = s.table.by_key[s.hedge_target(closed.decision_id, closed.targets[0].replica,
                             NOW + 0.1).replica]  # asked again: counted once
    assert other.stats.hedges == 2
    # the first answered; the router closed the decision without the hedge's outcome
    s.report(closed.decision_id, closed.targets[0].replica, 0.1, Status.OK, NOW + 0.1)
    assert other.stats.hedges == 1
    # nobody reports the other decision: it expires, and its hedge with it
    s.score(ScoreRequest("m"), NOW + 6.1)
    assert s.decisions.expired >= 1 and other.stats.hedges == 0


def test_hedge_after_follows_the_observed_quantile() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.05))  # predictions far above the quantile tested
    mesh.node("b", rep("b:1", spu=0.1))
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0,
                                    "hedge_quantile": 0.9})
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    assert out.hedge_after == pytest.approx(3 * out.targets[0].predicted)  # no data yet
    key = out.targets[0].replica
    s.report(out.decision_id, key, 0.001, Status.OK, NOW)
    for i in range(100):
        o = s.score(ScoreRequest("m"), NOW)
        s.report(o.decision_id, o.targets[0].replica, 0.001 * (i + 1), Status.OK, NOW)
    s.table.stats[key].latency.refresh()
    out = s.score(ScoreRequest("m"), NOW)
    assert out.targets[0].replica == key and 3 * out.targets[0].predicted > 0.1
    assert out.hedge_after == pytest.approx(0.09, abs=0.002)
    assert s.score(ScoreRequest("m", idempotent=False), NOW).hedge_after == 0
    mesh.put("SloClass", "fixed", {"deadline_ms": 1000, "hedge_after_ms": 20})
    assert s.score(ScoreRequest("m", slo_class="fixed"), NOW).hedge_after == 0.02
    mesh.put("SloClass", "never", {"deadline_ms": 100, "hedging": False})
    assert s.score(ScoreRequest("m", slo_class="never"), NOW).hedge_after == 0
    mesh.put("SloClass", "tight", {"deadline_ms": 50})
    assert s.score(ScoreRequest("m", slo_class="tight"), NOW).hedge_after == 0  # 90 ms > 50


def test_no_hedge_with_one_target() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    assert mesh.scorer().score(ScoreRequest("m"), NOW).hedge_after == 0


def test_hedges_stay_within_the_budget() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    mesh.node("b", rep("b:1"))
    mesh.put("RoutingPolicy", "m", {"hedge_budget": 0.05})
    s = mesh.scorer()
    hedges = 0
    for _ in range(4000):
        out = s.score(ScoreRequest("m"), NOW)
        if out.hedge_after:  # the router always hedges when offered
            hedges += 1
            s.report(out.decision_id, out.targets[1].replica, 0.01, Status.CANCELLED, NOW,
                     hedge=True, last=False)
        s.report(out.decision_id, out.targets[0].replica, 0.01, Status.OK, NOW)
    assert 0.04 * 4000 <= hedges <= 0.05 * 4000 + 10
    assert s.counters.hedges_sent == hedges


def test_weights_favour_fast_idle_targets() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.003))
    weights, degraded = mesh.scorer().weights("m", "", NOW)
    w = {c.endpoint: x for c, x in weights}
    assert not degraded and sum(w.values()) == pytest.approx(1)
    assert w["a:1"] == pytest.approx(0.75)


def test_targets_are_rebuilt_on_change_not_per_request() -> None:
    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    s = mesh.scorer()
    for _ in range(50):
        s.score(ScoreRequest("m"), NOW)
    assert s.table.builds == 1
    mesh.node("b", rep("b:1"))
    assert len(s.score(ScoreRequest("m"), NOW).targets) == 2 and s.table.builds == 2
    s.score(ScoreRequest("m"), NOW + 1)  # the refresh interval
    assert s.table.builds == 3


def test_one_nodes_telemetry_rebuilds_only_its_targets() -> None:
    """A telemetry update patches the model's targets: the other nodes' targets (and what
    they cache) are kept, and the result is what a whole build gives."""
    mesh = Mesh()
    for n in "abc":
        mesh.node(n, rep(f"{n}:1", queue=2))
    s = mesh.scorer()
    s.score(ScoreRequest("m"), NOW)
    before = {t.key: t for t in s.table.targets("m", NOW).eligible}
    mesh.node("b", rep("b:1", queue=5), rep("b:2", spu=0.0))
    mesh.fused.forget("c")
    patched = {t.key: t for t in s.table.targets("m", NOW).eligible}
    assert patched["a:1/m/1"] is before["a:1/m/1"] and patched["b:1/m/1"] is not before["b:1/m/1"]
    assert sorted(patched) == ["a:1/m/1", "b:1/m/1", "b:2/m/1"]
    assert patched["b:1/m/1"].backlog == 5
    assert patched["b:2/m/1"].spu == pytest.approx(0.01)  # no figure: the model's median
    whole = mesh.scorer().table.targets("m", NOW)
    assert {t.key: (t.backlog, t.spu, t.queue_at) for t in whole.eligible} == {
        k: (t.backlog, t.spu, t.queue_at) for k, t in patched.items()}
    assert s.table.targets("m", NOW).oldest_queue == whole.oldest_queue


def test_a_change_log_too_short_falls_back_to_a_whole_build() -> None:
    from meshd.signals.fused import CHANGE_LOG

    mesh = Mesh()
    mesh.node("a", rep("a:1"))
    gen = mesh.fused.generation
    mesh.node("b", rep("b:1"))
    assert mesh.fused.changed_since(gen) == {"b"}
    assert mesh.fused.changed_since(gen + 1) == set()
    for _ in range(CHANGE_LOG):
        mesh.node("a", rep("a:1"))
    assert mesh.fused.changed_since(gen) is None
    s = mesh.scorer()
    assert len(s.score(ScoreRequest("m"), NOW).targets) == 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["score", "ok", "fail", "cancel", "hedge", "tick", "telemetry", "units",
                     "weights"]),
    st.integers(0, 9)), max_size=60))
def test_kept_predictions_equal_fresh_ones(ops: list[tuple[str, int]]) -> None:
    """``predict_all`` keeps a target's prediction while nothing it depends on moved: after
    any sequence of requests, outcomes, hedges, cancellations, telemetry and time, what it
    returns is exactly what computing every target afresh returns."""
    from meshd.score.target import predict_all

    mesh = Mesh()
    for i, n in enumerate("abcd"):
        mesh.node(n, rep(f"{n}:1", queue=3 * i, spu=0.002 * (i + 1), instances=1 + i % 2))
    s = mesh.scorer()
    now = NOW
    units = 1
    open_: list[tuple[int, list[str]]] = []
    for op, i in ops:
        if op == "score":
            out = s.score(ScoreRequest("m", payload_bytes=units * 32 * 1024), now)
            if out.verdict.admit:
                open_.append((out.decision_id, [t.replica for t in out.targets]))
        elif op == "tick":
            now += i * 0.001  # whole milliseconds: never within rounding of a step
        elif op == "units":
            units = 1 + i % 3
        elif op == "weights":  # a client balancing on weights: an outcome with no decision
            s.report(0, f"{'abcd'[i % 4]}:1/m/1", 0.004 * (i + 1), Status.OK, now)
        elif op == "telemetry":
            n = "abcd"[i % 4]
            mesh.node(n, rep(f"{n}:1", queue=i, spu=0.002 * (1 + i % 4), at=now))
        elif op == "hedge" and open_:
            did, reps = open_[i % len(open_)]
            s.hedge_target(did, reps[0], now + 1)
        elif open_:
            did, reps = open_.pop(i % len(open_))
            status = {"ok": Status.OK, "fail": Status.UNAVAILABLE, "cancel": Status.CANCELLED}[op]
            s.report(did, reps[0], 0.001 * (i + 1), status, now)
        targets = s.table.targets("m", now).eligible
        predict_all(targets, units, now)
        kept = [(t.p_backlog, t.p_queue, t.p_service, t.p_seconds) for t in targets]
        for t in targets:
            t.p_until = 0.0
        predict_all(targets, units, now)
        assert kept == [(t.p_backlog, t.p_queue, t.p_service, t.p_seconds) for t in targets]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["score", "ok", "fail", "cancel", "tick", "admit"]),
                          st.integers(0, 5), st.floats(0, 2, allow_nan=False)),
                max_size=80))
def test_slots_always_balance(ops: list[tuple[str, int, float]]) -> None:
    """Whatever routers do (report, fail over, forget, let decisions expire), every slot a
    decision took is given back exactly once."""
    mesh = Mesh()
    for n in "abc":
        mesh.node(n, rep(f"{n}:1"))
    mesh.put("TenantQuota", "t", {"concurrency": 4})
    s = mesh.scorer(config=ScoreConfig(decision_ttl=3, expiry_grace=0))
    now = NOW
    open_: list[tuple[int, list[str]]] = []
    for op, i, x in ops:
        if op == "score":
            out = s.score(ScoreRequest("m", tenant="t", deadline=x), now)
            if out.verdict.admit:
                open_.append((out.decision_id, [t.replica for t in out.targets]))
        elif op == "admit":
            v, did = s.admit("m", now, tenant="t")
            if v.admit:
                open_.append((did, [""]))
        elif op == "tick":
            now += x * 3
        elif open_:
            did, reps = open_.pop(i % len(open_))
            status = {"ok": Status.OK, "fail": Status.UNAVAILABLE, "cancel": Status.CANCELLED}[op]
            s.report(did, reps[i % len(reps)], x, status, now, last=op != "cancel" or i % 2 == 0)
        stats = s.table.stats.values()
        assert all(t.limit.inflight >= 0 for t in stats)
        held = sum(1 for d in s.decisions._open.values() if d.first_open)
        assert sum(t.limit.inflight for t in stats) == held
        tenant = s.tenants.state("t", now)
        assert tenant.inflight == len(s.decisions)
    s.decisions.sweep(now + 1e6)
    assert sum(t.limit.inflight for t in s.table.stats.values()) == 0
    assert s.tenants.state("t", now).inflight == 0
    assert all(ob.inflight == 0 for ob in s.fused.observed.values())


def test_metrics_expose_decisions_sheds_fallbacks_and_shadow() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from meshd.metrics.routing import RoutingCollector
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.001))
    mesh.node("b", rep("b:1", spu=0.004))
    mesh.put("RoutingPolicy", "m", {"strategy": "nope", "shadow": "least_queue"})
    mesh.put("TenantQuota", "t", {"concurrency": 1})
    s = mesh.scorer()
    for _ in range(3):
        s.score(ScoreRequest("m", tenant="t"), NOW)
    reg = CollectorRegistry()
    from meshd.router.counters import RouterCounters
    processes = {"agent": RouterCounters(requests=3, completed=3),
                 "r/41/7": RouterCounters(requests=2, failed={"UNAVAILABLE": 2})}
    reg.register(RoutingCollector("r", s, lambda: processes,
                                  lambda: {"score": 4, "reports": 3, "malformed": 1}))
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for fam in text_string_to_metric_families(generate_latest(reg).decode())
               for x in fam.samples}
    assert samples[("meshd_score_decisions_total", (("node", "r"), ("strategy", "p2c")))] == 3
    assert samples[("meshd_score_fallback_decisions_total",
                    (("node", "r"), ("why", "unknown")))] == 3
    assert samples[("meshd_score_shed_requests_total",
                    (("node", "r"), ("reason", "tenant_concurrency")))] == 2
    assert samples[("meshd_score_open_decisions", (("node", "r"),))] == 1
    assert samples[("meshd_score_shadow_compared_decisions_total", (
        ("active", "nope"), ("candidate", "least_queue"), ("model", "m"), ("node", "r")))] == 3
    assert ("meshd_score_decision_seconds_count", (("node", "r"), ("strategy", "nope"))) \
        not in samples  # an unknown strategy never ran
    # the router's counters sum its processes, and each process's requests show
    assert samples[("meshd_router_requests_total", (("node", "r"),))] == 5
    assert samples[("meshd_router_failed_requests_total",
                    (("code", "UNAVAILABLE"), ("node", "r")))] == 2
    assert samples[("meshd_router_process_requests_total",
                    (("node", "r"), ("process", "r/41/7")))] == 2
    assert samples[("meshd_router_link_messages_total",
                    (("kind", "malformed"), ("node", "r")))] == 1


def test_a_hedge_goes_only_where_there_is_spare_capacity_and_it_would_answer_sooner() -> None:
    """A hedge that joins a queue delays every request behind it: it goes only to a target
    with no more than one service of queue ahead, and only where it is predicted to finish
    before the silent target is expected to answer (a stall that has lasted s seconds is
    expected to last about s more)."""
    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.002))
    mesh.node("b", rep("b:1", spu=0.004, queue=10, at=NOW))  # fast, but 40 ms queued
    mesh.node("c", rep("c:1", spu=0.030))  # slow and idle
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0})
    s = mesh.scorer()
    out = s.score(ScoreRequest("m"), NOW)
    second = s.score(ScoreRequest("m"), NOW)
    assert names(out)[0] == names(second)[0] == "a:1"
    b, c = s.table.by_key["b:1/m/1"], s.table.by_key["c:1/m/1"]
    assert s.hedge_target(out.decision_id, "a:1/m/1", NOW + 0.02) is None  # c: 30 ms > 20
    assert b.stats.hedges == c.stats.hedges == 0  # nothing sent, nothing counted
    to = s.hedge_target(out.decision_id, "a:1/m/1", NOW + 0.035)  # silent 35 ms
    assert to is not None and to.replica == "c:1/m/1" and c.stats.hedges == 1  # not b

    # 200 ms on, a is still silent, b still has its queue and c has one too: no spare
    mesh.node("b", rep("b:1", spu=0.004, queue=10, at=NOW + 0.19))
    mesh.node("c", rep("c:1", spu=0.030, queue=3, at=NOW + 0.19))
    s.score(ScoreRequest("m", exclude=("a", "b", "c")), NOW + 0.19)  # no target: rebuilds
    assert s.hedge_target(second.decision_id, "a:1/m/1", NOW + 0.2) is None
    mesh.node("b", rep("b:1", spu=0.004, queue=0, at=NOW + 0.2))  # b has caught up
    s.score(ScoreRequest("m", exclude=("a", "b", "c")), NOW + 0.2)
    to = s.hedge_target(second.decision_id, "a:1/m/1", NOW + 0.21)
    assert to is not None and to.replica == "b:1/m/1"


def test_a_standing_queue_is_shed_and_a_passing_one_is_not() -> None:
    """A queue that has stayed above standing_queue_ms for a second is overload: requests
    that would wait longer are shed, with a retry-after, until it has stayed below for a
    second; a queue that drains sooner (a pause, a burst) sheds nothing."""
    from meshd.score.standing import INTERVAL

    mesh = Mesh()
    mesh.node("a", rep("a:1", spu=0.005, queue=40, at=NOW))  # 200 ms queued
    mesh.put("RoutingPolicy", "m", {"strategy": "hybrid", "randomization": 0,
                                    "standing_queue_ms": 100})
    s = mesh.scorer()

    def verdict(at: float, queue: int) -> Any:
        mesh.node("a", rep("a:1", spu=0.005, queue=queue, at=at))
        out = s.score(ScoreRequest("m"), at)
        if out.verdict.admit:
            s.report(out.decision_id, out.targets[0].replica, 0.005, Status.OK, at)
        return out.verdict

    assert verdict(NOW, 40).admit and verdict(NOW + 0.5, 40).admit  # not yet a second
    assert verdict(NOW + 0.9, 2).admit  # it drained: passing
    assert verdict(NOW + 1.5, 40).admit  # above again, the clock starts over
    shed = verdict(NOW + 1.5 + INTERVAL, 40)
    assert not shed.admit and shed.reason == "standing_queue"
    assert 0.01 <= shed.retry_after <= 5
    assert s.counters.shed["standing_queue"] == 1
    assert verdict(NOW + 3.0, 10).admit  # 50 ms: below the target, admitted while shedding
    assert not verdict(NOW + 3.1, 40).admit  # still shedding what would wait long
    assert verdict(NOW + 3.2, 10).admit
    assert verdict(NOW + 3.2 + INTERVAL, 10).admit  # a second below: shedding ends
    assert verdict(NOW + 4.3, 40).admit  # and takes another standing second to start again
    mesh.put("RoutingPolicy", "m", {"standing_queue_ms": 0})  # off
    assert all(verdict(NOW + 6 + i, 400).admit for i in range(3))


def test_the_standing_queue_target_grows_with_the_service_time() -> None:
    from meshd.score.standing import SERVICES, StandingQueue

    q = StandingQueue()
    assert not q.shed(0.5, 0.1, 0.0) and q.shed(0.5, 0.1, 1.0)
    slow = StandingQueue()  # a model whose requests take 1 s: 3 s queued is not overload
    target = max(0.1, SERVICES * 1.0)
    assert not slow.shed(3.0, target, 0.0) and not slow.shed(3.0, target, 5.0)
    assert not StandingQueue().shed(9.0, 0.0, 0.0)  # target 0: off
