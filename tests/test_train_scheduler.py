"""The scheduler's pure decisions (:func:`meshd.train.scheduler.plan`): which leases to reap,
which queued jobs go where, in what order, within tenant quotas."""

from __future__ import annotations

from typing import Any

from meshd.train.placement import GpuSlot
from meshd.train.scheduler import EXPIRE_GRACE, TRIED_AFTER, Trainer, cpu_slots, plan
from meshd.train.spec import parse_job


def job(name: str, state: str = "queued", *, priority: int = 5, submitted: float = 1.0,
        gpus: int = 1, tenant: str = "default", tried: list[str] | None = None,
        token: int = 0, cancel: bool = False, queued: float | None = None) -> dict[str, Any]:
    spec = parse_job({"id": name, "model": "m", "command": ["x"], "priority": priority,
                      "gpus": {"count": gpus}, "tenant": tenant}).doc
    return {"name": name, "job": spec, "state": state, "submitted_at": submitted,
            "queued_at": submitted if queued is None else queued, "tried": tried or [],
            "token": token, "cancel": cancel}


def gpu_trainer(node: str, count: int, schedulable: bool = True) -> Trainer:
    return Trainer(node, tuple(GpuSlot(node, f"GPU-{node}-{i}", "L4", 24_000, 24_000)
                               for i in range(count)), schedulable)


def placed(cmds: list[dict[str, Any]]) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for c in cmds:
        if c["op"] == "acquire":
            [part] = c["parts"]  # these jobs fit on one node
            out[c["job"]] = (part["node"], part["gpus"])
    return out


def test_higher_priority_then_older_jobs_take_the_free_gpus_first() -> None:
    jobs = [job("late", submitted=3.0), job("urgent", priority=9, submitted=5.0),
            job("early", submitted=2.0)]
    got = placed(plan(jobs, {}, [gpu_trainer("a", 2)], now=10.0))
    assert set(got) == {"urgent", "early"}
    assert len({g for _, gs in got.values() for g in gs}) == 2  # never one GPU twice a tick


def test_leased_gpus_and_unschedulable_nodes_are_skipped() -> None:
    placements = {"old": {"node": "a", "gpus": ["GPU-a-0"],
                          "lease": {"expires_unix": 100.0}}}
    jobs = [job("old", "running", token=1), job("new")]
    trainers = [gpu_trainer("a", 1), gpu_trainer("b", 1, schedulable=False)]
    assert plan(jobs, placements, trainers, now=10.0) == []
    got = placed(plan(jobs, placements, [*trainers, gpu_trainer("c", 1)], now=10.0))
    assert got == {"new": ("c", ["GPU-c-0"])}


def test_lapsed_leases_are_reaped_after_the_grace() -> None:
    placements = {"j": {"node": "a", "gpus": ["GPU-a-0"], "lease": {"expires_unix": 10.0}}}
    jobs = [job("j", "running", token=7)]
    assert plan(jobs, placements, [gpu_trainer("a", 1)], now=10.0 + EXPIRE_GRACE / 2) == []
    cmds = plan(jobs, placements, [gpu_trainer("a", 1)], now=10.0 + EXPIRE_GRACE * 2)
    assert cmds == [{"op": "expire", "job": "j", "token": 7, "at": 10.0 + EXPIRE_GRACE * 2}]


def test_a_node_where_the_lease_lapsed_is_the_last_resort() -> None:
    trainers = [gpu_trainer("a", 1), gpu_trainer("b", 1)]
    assert placed(plan([job("j", tried=["a"], queued=1.0)], {}, trainers, 1.0))["j"][0] == "b"
    # only nodes it lapsed on: it waits TRIED_AFTER for another, then goes back to one
    for tried, fleet in ((["a", "b"], trainers), (["a"], trainers[:1])):
        j = job("j", tried=tried, queued=1.0)
        assert plan([j], {}, fleet, 1.0 + TRIED_AFTER - 0.1) == []
        assert placed(plan([j], {}, fleet, 1.0 + TRIED_AFTER))["j"][0] in tried


def test_cpu_jobs_take_cpu_slots_and_gpu_jobs_gpus() -> None:
    trainers = [Trainer("c", cpu_slots("c", 1)), gpu_trainer("g", 1)]
    got = placed(plan([job("cpu", gpus=0), job("gpu")], {}, trainers, 1.0))
    assert got == {"cpu": ("c", ["cpu0"]), "gpu": ("g", ["GPU-g-0"])}
    # A job asking for more than any trainer offers is left queued (the API refuses it).
    assert plan([job("big", gpus=4)], {}, trainers, 1.0) == []


def test_cancelled_and_running_jobs_are_not_placed() -> None:
    jobs = [job("c", cancel=True), job("r", "running", token=1)]
    assert plan(jobs, {}, [gpu_trainer("a", 4)], 1.0) == []


def test_tenant_quotas_hold_jobs_back_and_let_others_go_ahead() -> None:
    trainers = [gpu_trainer("a", 4), gpu_trainer("b", 4)]
    placements = {"t1": {"node": "a", "gpus": ["GPU-a-0", "GPU-a-1"],
                         "lease": {"expires_unix": 100.0}}}
    jobs = [job("t1", "running", gpus=2, tenant="team", token=1),
            job("t2", priority=9, gpus=2, tenant="team"),
            job("t3", priority=8, gpus=1, tenant="team"),
            job("o1", priority=1, gpus=2, tenant="other")]
    got = placed(plan(jobs, placements, trainers, 10.0, quotas={"team": 3, "other": None}))
    # team holds 2 of its 3: t2 (2 more) waits, t3 (1 more) fits, and o1 is not held back.
    assert set(got) == {"t3", "o1"}
    assert placed(plan(jobs, placements, trainers, 10.0)).keys() == {"t2", "t3", "o1"}
    assert placed(plan(jobs, placements, trainers, 10.0, quotas={"team": 0})).keys() == {"o1"}


def test_gpu_trainers_offer_each_gpu_or_each_mig_slice() -> None:
    from adapters.model import GpuState, MigProfile
    from meshd.train.scheduler import gpu_slots

    gib = 1 << 30
    whole = GpuState("GPU-a", 0, "NVIDIA L4", 24 * gib, 20 * gib, sm_util=50.0)
    a100 = "NVIDIA A100-SXM4-40GB"
    carved = GpuState("GPU-b", 1, a100, 40 * gib, 40 * gib, mig=(
        MigProfile("MIG-1", "1g.5gb", 5 * gib, 5 * gib),
        MigProfile("MIG-2", "3g.20gb", 20 * gib, 19 * gib)))
    slots = gpu_slots("n", [whole, carved], "z")
    assert [(s.gpu, s.gpu_type, s.vram_total_mb, s.vram_free_mb) for s in slots] == [
        ("GPU-a", "NVIDIA L4", 24576, 20480), ("MIG-1", f"{a100} MIG 1g.5gb", 5120, 5120),
        ("MIG-2", f"{a100} MIG 3g.20gb", 20480, 19456)]
    assert slots[0].inference_load == 0.5 and slots[0].zone == "z"
    spec = parse_job({"id": "s", "model": "m", "command": ["x"],
                      "gpus": {"count": 1, "type": f"{a100} MIG 3g.20gb"}}).doc
    j = {"name": "s", "job": spec, "state": "queued", "submitted_at": 1.0, "tried": [],
         "token": 0, "cancel": False}
    assert placed(plan([j], {}, [Trainer("n", slots)], 2.0)) == {"s": ("n", ["MIG-2"])}
