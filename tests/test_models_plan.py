"""The model placement controller's pure core: sizing (:mod:`meshd.models.sizing`), where
replicas go (:func:`meshd.models.plan.plan`) and the replicated record its decisions are
applied to (:class:`meshd.models.record.PlacementRecord`).

Each test drives the planner as the policy group's leader would: plan, apply the commands
to the record, let nodes report, plan again."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from meshd.models.config import PlacementConfig
from meshd.models.fleet import GIB, Gpu, Model, Node, Pin
from meshd.models.plan import Forget, Load, MarkLow, Plan, Refuse, Unload, plan
from meshd.models.record import (
    DRAINING,
    LOADING,
    READY,
    PlacementRecord,
    decision_id,
    report_command,
)
from meshd.models.sizing import size
from policy.model import validate

CFG = PlacementConfig(target_utilisation=0.7, hysteresis=0.1, cool_down_s=120.0,
                      request_hold_s=60.0, backoff_s=60.0, load_timeout_s=600.0)


def gpu_node(name: str, zone: str = "z1", free_gib: tuple[float, ...] = (40.0,),
             gpu_type: str = "NVIDIA A100-SXM4-80GB", *, cordoned: bool = False,
             draining: bool = False, quarantined: bool = False) -> Node:
    gpus = tuple(Gpu(f"GPU-{name}-{i}", gpu_type, int(f * GIB), 80 * GIB)
                 for i, f in enumerate(free_gib))
    return Node(name, zone, cordoned=cordoned, draining=draining, quarantined=quarantined,
                gpus=gpus)


def model(name: str = "llama", *, gib: float | None = 10.0, demand: float = 0.0,
          **pin: object) -> Model:
    return Model(name, pin=Pin(**pin),  # type: ignore[arg-type]
                 footprint_bytes=None if gib is None else int(gib * GIB),
                 footprint_source="unknown" if gib is None else "measured", demand=demand)


def step(models: list[Model], nodes: list[Node], rec: PlacementRecord, now: float,
         cfg: PlacementConfig = CFG, *, report: bool = True) -> Plan:
    """One leader tick: plan, commit every command, then (``report``) every node finishes
    what the record asks of it: loads become ready, drained replicas are unloaded."""
    p = plan(models, nodes, rec, now, cfg)
    for cmd in p.commands(now):
        json.dumps(cmd)  # commands travel through Raft as JSON
        result = rec.apply(cmd)
        assert result["ok"] and result["changed"], (cmd, result)
    if report:
        alive = {n.name for n in nodes if n.alive}
        for r in list(rec.replicas()):
            if r.node not in alive:
                continue
            if r.state == LOADING:
                rec.apply(report_command(r.model, r.node, r.load, "ready", now))
            elif r.state == DRAINING:
                rec.apply(report_command(r.model, r.node, r.load, "unloaded", now))
    return p


def loads(p: Plan) -> list[Load]:
    return [d for d in p.decisions if isinstance(d, Load)]


def unloads(p: Plan) -> list[Unload]:
    return [d for d in p.decisions if isinstance(d, Unload)]


def where(rec: PlacementRecord, key: str = "llama", state: str | None = None) -> list[str]:
    return sorted(n for n, r in rec.get(key).replicas.items()
                  if state is None or r.state == state)


# --- pins -----------------------------------------------------------------------------------

def test_a_pin_of_two_on_three_servers_loads_exactly_two_on_distinct_nodes() -> None:
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    rec = PlacementRecord()
    p = step([model(min_replicas=2)], nodes, rec, 10.0)
    assert len(loads(p)) == 2
    assert len({d.node for d in loads(p)}) == 2
    assert where(rec, state=READY) == sorted(d.node for d in loads(p))
    assert p.models["llama"].desired == 2 and p.models["llama"].placed == 2
    assert "min_replicas 2" in p.models["llama"].why
    again = step([model(min_replicas=2)], nodes, rec, 20.0)
    assert again.decisions == ()
    assert again.models["llama"].ready == 2


def test_a_dead_server_s_replica_is_placed_elsewhere_and_drained() -> None:
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    rec = PlacementRecord()
    first = step([model(min_replicas=2)], nodes, rec, 10.0)
    dead = loads(first)[0].node
    spare = ({"a", "b", "c"} - {d.node for d in loads(first)}).pop()
    nodes = [replace(n, alive=False) if n.name == dead else n for n in nodes]
    p = step([model(min_replicas=2)], nodes, rec, 20.0)
    assert [(d.node, "down" in d.reason) for d in unloads(p)] == [(dead, True)]
    assert [d.node for d in loads(p)] == [spare]
    assert where(rec, state=READY) == sorted({"a", "b", "c"} - {dead})
    assert rec.get("llama").replicas[dead].state == DRAINING  # unloads if it comes back
    assert step([model(min_replicas=2)], nodes, rec, 30.0).decisions == ()
    back = [replace(n, alive=True) for n in nodes]
    step([model(min_replicas=2)], back, rec, 40.0)  # the node returns and unloads it
    assert where(rec) == sorted({"a", "b", "c"} - {dead})


def test_a_replica_on_a_node_that_left_the_fleet_is_forgotten_and_replaced() -> None:
    nodes = [gpu_node("a"), gpu_node("b")]
    rec = PlacementRecord()
    step([model(min_replicas=1)], nodes, rec, 10.0)
    [gone] = where(rec)
    rest = [n for n in nodes if n.name != gone]
    p = step([model(min_replicas=1)], rest, rec, 20.0)
    assert [type(d) for d in p.decisions] == [Forget, Load]
    assert where(rec) == [rest[0].name]


# --- demand ---------------------------------------------------------------------------------

def test_a_demand_surge_adds_replicas_at_once() -> None:
    nodes = [gpu_node(n) for n in "abcdef"]
    rec = PlacementRecord()
    step([model(demand=0.5)], nodes, rec, 10.0)
    assert len(where(rec)) == 1
    p = step([model(demand=3.0)], nodes, rec, 11.0)
    want = math.ceil(3.0 / (0.7 * 1.1))
    assert len(loads(p)) == want - 1 and len(where(rec, state=READY)) == want
    assert "demand 3.00 s/s" in p.models["llama"].why


def test_demand_gone_removes_replicas_only_after_the_cool_down_drain_first() -> None:
    nodes = [gpu_node(n) for n in "abcd"]
    rec = PlacementRecord()
    step([model(demand=2.0)], nodes, rec, 0.0)
    assert len(where(rec)) == 3
    quiet = [model(demand=0.0)]
    p = step(quiet, nodes, rec, 100.0)
    assert unloads(p) == [] and [type(d) for d in p.decisions] == [MarkLow]
    assert rec.get("llama").low_since == 100.0
    assert step(quiet, nodes, rec, 219.0).decisions == ()  # 119 s: not yet
    p = plan(quiet, nodes, rec, 220.0, CFG)
    assert len(unloads(p)) == 3 and all("scale down" in d.reason for d in unloads(p))
    for cmd in p.commands(220.0):
        assert rec.apply(cmd)["ok"]
    # drain then unload: routers stop sending at once, the replica goes when the node says
    assert rec.routable("llama") == [] and set(where(rec, state=DRAINING)) == set(where(rec))
    for r in list(rec.replicas()):
        rec.apply(report_command(r.model, r.node, r.load, "unloaded", 230.0))
    assert where(rec) == []


def test_demand_back_during_the_cool_down_cancels_it() -> None:
    nodes = [gpu_node(n) for n in "abc"]
    rec = PlacementRecord()
    step([model(demand=1.2)], nodes, rec, 0.0)
    step([model(demand=0.1)], nodes, rec, 10.0)
    assert rec.get("llama").low_since == 10.0
    step([model(demand=1.2)], nodes, rec, 60.0)
    assert rec.get("llama").low_since is None
    assert unloads(step([model(demand=0.1)], nodes, rec, 150.0)) == []  # a new window


def test_scale_down_goes_to_the_busiest_moment_of_the_window() -> None:
    nodes = [gpu_node(n) for n in "abcdef"]
    rec = PlacementRecord()
    step([model(demand=3.5)], nodes, rec, 0.0)
    have = len(where(rec))
    step([model(demand=0.0)], nodes, rec, 10.0)
    step([model(demand=1.5)], nodes, rec, 50.0)  # still below the band: the peak rises
    peak = rec.get("llama").low_peak
    assert 0 < peak < have
    p = step([model(demand=0.0)], nodes, rec, 131.0)
    assert len(unloads(p)) == have - peak


def test_hysteresis_keeps_a_boundary_demand_from_flapping() -> None:
    nodes = [gpu_node(n) for n in "abcd"]
    rec = PlacementRecord()
    step([model(demand=1.5)], nodes, rec, 0.0)
    n = len(where(rec))
    for i in range(1, 40):  # around 2 * 0.7 = 1.4, the boundary of ceil(d / target)
        p = step([model(demand=1.35 if i % 2 else 1.45)], nodes, rec, i * 10.0)
        assert loads(p) == [] and unloads(p) == []
    assert len(where(rec)) == n


def test_max_replicas_caps_demand() -> None:
    nodes = [gpu_node(n) for n in "abcdef"]
    rec = PlacementRecord()
    p = step([model(demand=10.0, max_replicas=3)], nodes, rec, 0.0)
    assert len(loads(p)) == 3 and p.models["llama"].desired == 3
    assert "max_replicas 3 caps demand" in p.models["llama"].why
    p = step([model(demand=10.0, max_replicas=2)], nodes, rec, 1.0)  # the cap lowered
    assert len(unloads(p)) == 1


def test_a_request_from_zero_loads_one_replica_and_it_goes_after_the_cool_down() -> None:
    nodes = [gpu_node("a"), gpu_node("b")]
    rec = PlacementRecord()
    asked = replace(model(), requested_at=100.0)
    p = step([asked], nodes, rec, 100.5)
    assert len(loads(p)) == 1 and "requested" in p.models["llama"].why
    assert unloads(step([asked], nodes, rec, 150.0)) == []
    step([asked], nodes, rec, 161.0)  # the request no longer holds it: the cool-down starts
    assert unloads(step([asked], nodes, rec, 280.0)) == []
    assert len(unloads(step([asked], nodes, rec, 281.0))) == 1


# --- a new leader -----------------------------------------------------------------------

def test_a_leader_killed_mid_placement_neither_loads_twice_nor_loses_a_decision() -> None:
    nodes = [gpu_node(n, zone=f"z{i % 2}") for i, n in enumerate("abcde")]
    models = [model(min_replicas=3), model("bert", gib=2.0, min_replicas=2)]
    rec = PlacementRecord()
    old = plan(models, nodes, rec, 10.0, CFG)
    cmds = old.commands(10.0)
    assert len(cmds) == 5
    for cmd in cmds[:2]:  # the old leader dies after two commits
        assert rec.apply(cmd)["ok"]
    new = plan(models, nodes, rec, 11.0, CFG)
    assert new.decisions == old.decisions[2:]  # same state, same decisions, same ids
    for cmd in new.commands(11.0):
        assert rec.apply(cmd)["changed"]
    for cmd in cmds:  # the old leader's proposals arrive late, or are retried
        result = rec.apply(cmd)
        assert result["ok"] and not result["changed"] and result["duplicate"]
    assert len(where(rec)) == 3 and len(where(rec, "bert")) == 2
    assert plan(models, nodes, rec, 12.0, CFG).decisions == ()


def test_a_deposed_leader_s_decision_is_refused_as_stale() -> None:
    nodes = [gpu_node(n) for n in "abcd"]
    rec = PlacementRecord()
    step([model(min_replicas=1)], nodes, rec, 0.0)
    # two leaders plan from the same record; one commits first, on another node
    mine = plan([model(min_replicas=2)], nodes, rec, 1.0, CFG)
    theirs = plan([model(min_replicas=2)],
                  [replace(n, cordoned=n.name == loads(mine)[0].node) for n in nodes],
                  rec, 1.0, CFG)
    assert loads(mine)[0].node != loads(theirs)[0].node
    assert rec.apply(theirs.commands(1.0)[0])["changed"]
    result = rec.apply(mine.commands(1.0)[0])
    assert not result["ok"] and result["error"] == "stale"
    assert len(where(rec)) == 2


def test_planning_is_deterministic_whatever_the_input_order() -> None:
    rng = random.Random(7)
    nodes = [gpu_node(f"n{i}", zone=f"z{i % 3}", free_gib=(rng.choice([20, 40, 70]),) * 2)
             for i in range(12)]
    models = [model(f"m{i}", gib=rng.choice([None, 5, 15, 30]), demand=rng.random() * 3,
                    min_replicas=rng.choice([0, 1, 2])) for i in range(20)]
    base = plan(models, nodes, PlacementRecord(), 5.0, CFG)
    for _ in range(3):
        rng.shuffle(nodes)
        rng.shuffle(models)
        assert plan(models, nodes, PlacementRecord(), 5.0, CFG) == base


# --- where replicas go ----------------------------------------------------------------

def test_too_large_for_any_gpu_is_refused_naming_the_sizes() -> None:
    nodes = [gpu_node("a", free_gib=(40.0, 22.5)), gpu_node("b", free_gib=(12.0,))]
    rec = PlacementRecord()
    p = step([model("huge", gib=48.0, min_replicas=1)], nodes, rec, 0.0)
    [refuse] = [d for d in p.decisions if isinstance(d, Refuse)]
    assert refuse.code == "too_large" and loads(p) == []
    assert "48.0 GiB" in refuse.reason and "40.0 GiB" in refuse.reason
    assert "a GPU GPU-a-0" in refuse.reason and "measured footprint" in refuse.reason
    assert rec.get("huge").refused == "too_large"
    again = step([model("huge", gib=48.0, min_replicas=1)], nodes, rec, 1.0)
    assert again.decisions == () and again.models["huge"].refused == "too_large"
    assert "48.0 GiB" in again.models["huge"].why
    roomy = [*nodes, gpu_node("c", free_gib=(60.0,))]
    p = step([model("huge", gib=48.0, min_replicas=1)], roomy, rec, 2.0)
    assert [d.node for d in loads(p)] == ["c"]
    assert [(d.code, d.reason) for d in p.decisions if isinstance(d, Refuse)] == [("", "")]


def test_replicas_spread_across_zones() -> None:
    nodes = [gpu_node(f"a{i}", zone="za") for i in range(4)] + \
        [gpu_node("b0", zone="zb"), gpu_node("c0", zone="zc")]
    rec = PlacementRecord()
    p = step([model(min_replicas=3)], nodes, rec, 0.0)
    assert sorted(d.node for d in loads(p)) == ["a0", "b0", "c0"]
    p = step([model(min_replicas=4)], nodes, rec, 1.0)
    assert [d.node for d in loads(p)] == ["a1"]  # zb and zc have no second node


def test_cordoned_draining_and_quarantined_nodes_take_no_replica() -> None:
    nodes = [gpu_node("a", cordoned=True), gpu_node("b", draining=True),
             gpu_node("c", quarantined=True), gpu_node("d")]
    rec = PlacementRecord()
    p = step([model(min_replicas=2)], nodes, rec, 0.0)
    assert [d.node for d in loads(p)] == ["d"]
    assert p.models["llama"].refused == "few_nodes"


def test_a_replica_on_a_quarantined_node_is_replaced_and_a_cordoned_one_kept() -> None:
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    rec = PlacementRecord()
    step([model(min_replicas=2, nodes=frozenset({"a", "b", "c"}))], nodes, rec, 0.0)
    first, second = where(rec)
    flagged = [replace(n, quarantined=n.name == first, cordoned=n.name == second)
               for n in nodes]
    p = step([model(min_replicas=2)], flagged, rec, 1.0)
    assert [d.node for d in loads(p)] == ["c"] and unloads(p) == []


def test_gpu_types_are_honoured() -> None:
    nodes = [gpu_node("t4", gpu_type="Tesla T4", free_gib=(15.0,)),
             gpu_node("mixed", free_gib=(70.0, 30.0)), gpu_node("l4", gpu_type="NVIDIA L4")]
    nodes[1] = replace(nodes[1], gpus=(replace(nodes[1].gpus[0], type="NVIDIA L4"),
                                        nodes[1].gpus[1]))
    rec = PlacementRecord()
    want = model(min_replicas=3, gpu_types=frozenset({"NVIDIA A100-SXM4-80GB"}))
    p = step([want], nodes, rec, 0.0)
    assert [(d.node, d.gpu) for d in loads(p)] == [("mixed", "GPU-mixed-1")]
    other = model("bert", min_replicas=1, gpu_types=frozenset({"NVIDIA H100 80GB HBM3"}))
    p = step([want, other], nodes, rec, 1.0)
    [refuse] = [d for d in p.decisions if isinstance(d, Refuse)]
    assert refuse.code == "gpu_type" and "NVIDIA H100 80GB HBM3" in refuse.reason


def test_best_fit_gpu_for_a_known_footprint_most_free_for_an_unknown_one() -> None:
    nodes = [gpu_node("a", free_gib=(20.0, 80.0, 35.0, 50.0))]
    p = plan([model(gib=30.0, min_replicas=1)], nodes, PlacementRecord(), 0.0, CFG)
    assert [d.gpu for d in loads(p)] == ["GPU-a-2"]
    p = plan([model(gib=None, min_replicas=1)], nodes, PlacementRecord(), 0.0, CFG)
    assert [d.gpu for d in loads(p)] == ["GPU-a-1"]
    p = plan([model(gib=None, min_replicas=1, min_free_vram_mb=90 * 1024)], nodes,
             PlacementRecord(), 0.0, CFG)
    assert loads(p) == [] and p.models["llama"].refused == "too_large"


def test_memory_decided_or_still_loading_is_not_counted_twice() -> None:
    nodes = [gpu_node("a", free_gib=(40.0,)), gpu_node("b", free_gib=(40.0,))]
    models = [model("m1", gib=30.0, min_replicas=1), model("m2", gib=30.0, min_replicas=1),
              model("m3", gib=30.0, min_replicas=1)]
    rec = PlacementRecord()
    p = step(models, nodes, rec, 0.0, report=False)  # the loads stay in flight
    assert sorted(d.node for d in loads(p)) == ["a", "b"]
    assert p.models["m3"].refused == "too_large"
    assert loads(plan(models, nodes, rec, 1.0, CFG)) == []  # NVML does not show them yet


def test_floors_are_placed_before_demand() -> None:
    nodes = [gpu_node("a", free_gib=(40.0,))]
    models = [model("busy", gib=30.0, demand=5.0), model("pinned", gib=30.0, min_replicas=1)]
    p = plan(models, nodes, PlacementRecord(), 0.0, CFG)
    assert [d.model for d in loads(p)] == ["pinned"]
    assert p.models["busy"].refused == "too_large"


def test_a_failed_load_is_reported_and_retried_on_another_node() -> None:
    nodes = [gpu_node("a"), gpu_node("b")]
    rec = PlacementRecord()
    p = step([model(min_replicas=1)], nodes, rec, 0.0, report=False)
    [first] = loads(p)
    result = rec.apply(report_command("llama", first.node, first.id, "failed", 5.0,
                                      "CUDA out of memory"))
    assert result["changed"] and where(rec) == []
    assert rec.get("llama").failures[first.node].reason == "CUDA out of memory"
    p = step([model(min_replicas=1)], nodes, rec, 6.0)
    [retry] = loads(p)
    assert retry.node != first.node
    assert f"load on {first.node} failed (CUDA out of memory)" in p.models["llama"].why


def test_a_node_in_back_off_is_tried_again_after_it() -> None:
    nodes = [gpu_node("a")]
    rec = PlacementRecord()
    [first] = loads(step([model(min_replicas=1)], nodes, rec, 0.0, report=False))
    rec.apply(report_command("llama", "a", first.id, "failed", 1.0, "bad config"))
    p = step([model(min_replicas=1)], nodes, rec, 30.0)
    assert loads(p) == [] and p.models["llama"].refused == "backoff"
    assert "bad config" in p.models["llama"].why
    p = step([model(min_replicas=1)], nodes, rec, 61.0)
    assert [d.node for d in loads(p)] == ["a"]
    assert rec.get("llama").failures == {}  # a good load ends the back-off


def test_a_load_that_never_finishes_is_drained_as_failed() -> None:
    nodes = [gpu_node("a"), gpu_node("b")]
    rec = PlacementRecord()
    [first] = loads(step([model(min_replicas=1)], nodes, rec, 0.0, report=False))
    assert step([model(min_replicas=1)], nodes, rec, 600.0, report=False).decisions == ()
    p = step([model(min_replicas=1)], nodes, rec, 601.0, report=False)
    [drain] = unloads(p)
    assert drain.node == first.node and drain.failed
    assert [d.node for d in loads(p)] != [first.node]
    rec.apply(report_command("llama", first.node, first.id, "unloaded", 602.0))
    assert "did not finish" in rec.get("llama").failures[first.node].reason


def test_cpu_only_nodes_take_models_of_unknown_footprint_by_slot_count() -> None:
    nodes = [Node("cpu1", "z1", cpu_slots=1), Node("cpu2", "z2", cpu_slots=1)]
    rec = PlacementRecord()
    models = [model(f"m{i}", gib=None, min_replicas=1) for i in range(3)]
    p = step(models, nodes, rec, 0.0)
    assert sorted((d.model, d.node, d.gpu) for d in loads(p)) == [
        ("m0", "cpu1", ""), ("m1", "cpu2", "")]
    assert p.models["m2"].refused == "too_large"
    assert "no eligible node has a GPU or a free CPU slot" in p.models["m2"].why
    p = step([model("gpu", gib=4.0, min_replicas=1)], nodes, rec, 1.0)
    assert loads(p) == [] and p.models["gpu"].refused == "too_large"


def test_a_replica_outside_a_changed_pin_is_replaced_before_it_is_unloaded() -> None:
    nodes = [gpu_node("a", zone="za"), gpu_node("b", zone="zb")]
    rec = PlacementRecord()
    step([model(min_replicas=1, zones=frozenset({"zb"}))], nodes, rec, 0.0)
    assert where(rec) == ["b"]
    moved = model(min_replicas=1, zones=frozenset({"za"}))
    p = step([moved], nodes, rec, 1.0, report=False)
    assert [d.node for d in loads(p)] == ["a"] and unloads(p) == []  # make before break
    a = rec.get("llama").replicas["a"]
    rec.apply(report_command("llama", "a", a.load, "ready", 2.0))
    p = step([moved], nodes, rec, 3.0)
    assert [d.node for d in unloads(p)] == ["b"] and where(rec) == ["a"]


def test_a_model_meshd_did_not_load_counts_but_is_never_unloaded() -> None:
    nodes = [replace(gpu_node("a"), loaded=frozenset({"llama"})), gpu_node("b")]
    rec = PlacementRecord()
    p = step([model(min_replicas=2)], nodes, rec, 0.0)
    assert [d.node for d in loads(p)] == ["b"] and p.models["llama"].ready == 1
    p = step([model(min_replicas=0)], nodes, rec, 1.0)
    p = step([model(min_replicas=0)], nodes, rec, 200.0)
    assert [d.node for d in unloads(p)] == ["b"]


# --- sizing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("demand, pin, current, want", [
    (0.0, Pin(), 0, 0),
    (0.0, Pin(min_replicas=2), 0, 2),
    (0.7, Pin(), 0, 1),
    (2.0, Pin(), 0, 3),  # 2 / (0.7 * 1.1) = 2.6
    (2.0, Pin(min_replicas=5), 0, 5),
    (2.0, Pin(max_replicas=2), 0, 2),
    (100.0, Pin(min_replicas=1, max_replicas=4), 2, 4),
    (0.0, Pin(max_replicas=2), 5, 2),  # a lowered cap applies at once
])
def test_desired_replicas(demand: float, pin: Pin, current: int, want: int) -> None:
    got = size(Model("m", pin=pin, demand=demand), current, 0.0, CFG)
    assert got.desired == want


def test_pin_fields_come_from_a_validated_model_pin() -> None:
    doc = validate({"kind": "ModelPin", "name": "llama", "spec": {
        "nodes": ["a"], "zones": ["z1"], "gpu_types": ["NVIDIA L4"], "min_free_vram_mb": 100,
        "min_replicas": 1, "max_replicas": 3}})
    assert Pin.from_spec(doc.spec) == Pin(1, 3, frozenset({"a"}), frozenset({"z1"}),
                                          frozenset({"NVIDIA L4"}), 100)
    assert Pin.from_spec(validate({"kind": "ModelPin", "name": "m"}).spec) == Pin()


# --- the record ---------------------------------------------------------------------------

def test_record_commands_are_checked_and_never_raise() -> None:
    rec = PlacementRecord()
    ok = {"op": "load", "id": decision_id("m", 0), "model": "m", "base": 0, "node": "a",
          "gpu": "0", "footprint_bytes": 1, "reason": "", "at": 1.0}
    bad: object
    for bad in (None, [], {"op": "drop"}, {**ok, "id": "m#1"}, {**ok, "base": -1},
                {**ok, "at": float("nan")}, {**ok, "node": 5}, {**ok, "footprint_bytes": True},
                {"op": "report", "model": "m", "node": "a", "load": "m#0", "status": "gone",
                 "at": 1.0}):
        result = rec.apply(bad)
        assert not result["ok"] and result["error"] == "invalid", bad
    assert rec.models == {}
    assert rec.apply(ok)["changed"]
    again = {**ok, "id": decision_id("m", 1), "base": 1}
    assert rec.apply(again)["error"] == "conflict"  # one replica per node
    assert rec.apply({**ok, "node": "b"})["error"] == "stale"  # same id, another decision
    assert rec.apply({**again, "base": 5, "id": decision_id("m", 5)})["error"] == "stale"


def test_reports_are_idempotent_and_ignore_an_older_replica() -> None:
    rec = PlacementRecord()
    rec.apply(Load("m", 0, "a", "0", 1, "").command(1.0))
    assert rec.apply(report_command("m", "a", "m#9", "ready", 2.0))["changed"] is False
    assert rec.apply(report_command("m", "a", "m#0", "ready", 2.0))["changed"]
    assert rec.apply(report_command("m", "a", "m#0", "ready", 3.0))["changed"] is False
    assert rec.routable("m") == ["a"]
    rec.apply(Unload("m", 1, "a", "scale down").command(4.0))
    assert rec.routable("m") == [] and rec.on_node("a")[0].state == DRAINING
    assert rec.apply(report_command("m", "a", "m#0", "unloaded", 5.0))["changed"]
    assert rec.apply(report_command("m", "a", "m#0", "unloaded", 5.0))["changed"] is False
    assert rec.get("m").replicas == {} and rec.get("m").failures == {}


def test_the_record_survives_a_snapshot() -> None:
    nodes = [gpu_node(n) for n in "abc"]
    rec = PlacementRecord()
    step([model(demand=2.0)], nodes, rec, 0.0, report=False)
    first = rec.on_node(where(rec)[0])[0]
    rec.apply(report_command("llama", first.node, first.load, "failed", 1.0, "oom"))
    step([model(demand=0.0)], nodes, rec, 2.0, report=False)
    copy = PlacementRecord.restore(json.loads(json.dumps(rec.snapshot())))
    assert copy.snapshot() == rec.snapshot() and copy.models == rec.models
    assert plan([model(demand=0.0)], nodes, copy, 3.0, CFG) == \
        plan([model(demand=0.0)], nodes, rec, 3.0, CFG)
