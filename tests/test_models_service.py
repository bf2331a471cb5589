"""The enactor's load path (meshd/models/service.py) with a fake Triton, fake NVML readings
and a fake control plane: what the load took on the GPUs goes into the record, and sizes the
model's next placements."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from meshd.models.fleet import GIB, Gpu, Model, Node, Pin
from meshd.models.plan import Load, plan
from meshd.models.record import READY, PlacementRecord, Replica, decision_id
from meshd.models.service import ModelService, footprint_of
from meshd.models.store import FORMAT
from policy.store import PolicyStore


class FakeTriton:
    """Loading a model takes ``size`` bytes of GPU-0's memory (as NVML will read it)."""

    def __init__(self, used: dict[str, int], size: int, fail: str = "") -> None:
        self.used, self.size, self.fail = used, size, fail
        self.loaded: list[str] = []

    async def load_model(self, model: str, timeout: float, config: str = "") -> None:
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError(self.fail)
        self.used["GPU-0"] += self.size
        self.loaded.append(model)

    async def unload_model(self, model: str, timeout: float) -> None: ...

    async def served(self, model: str, timeout: float) -> int | None:
        return 0

    def queued(self, model: str) -> int:
        return 0

    def present(self, model: str) -> bool | None:
        return model in self.loaded


class FakeControl:
    """Takes writes; its policy group copy is a real, empty store (no pins)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.views = {"policy": SimpleNamespace(store=PolicyStore())}

    async def write(self, group: str, cmd: dict[str, Any], timeout: float,
                    author: str) -> dict[str, Any]:
        self.writes.append((group, cmd))
        return {"ok": True}


def _service(triton: FakeTriton, used: dict[str, int]) -> tuple[ModelService, FakeControl]:
    control = FakeControl()
    svc = ModelService("n1", control, lambda: None, lambda name: None,  # type: ignore[arg-type]
                       runtime=triton, clock=lambda: 100.0)

    async def read() -> dict[str, int]:
        return dict(used)
    svc.gpu_used = read
    return svc, control


def test_a_load_reports_ready_with_what_it_took_on_the_gpus() -> None:
    used = {"GPU-0": 3 * GIB, "GPU-1": 1 * GIB}
    triton = FakeTriton(used, size=5 * GIB)
    svc, control = _service(triton, used)
    rep = Replica("resnet", "n1", "GPU-0", "loading", decision_id("resnet", 0), 90.0)
    asyncio.run(svc._load(rep))
    assert triton.loaded == ["resnet"]
    ((group, cmd),) = control.writes
    assert group == "policy" and cmd["v"] == FORMAT
    assert cmd["op"] == "report" and cmd["status"] == "ready"
    assert cmd["footprint_bytes"] == 5 * GIB


def test_a_failed_load_reports_triton_s_reason_and_no_footprint() -> None:
    used = {"GPU-0": 0}
    svc, control = _service(FakeTriton(used, GIB, fail="failed to load 'x': no such file"),
                            used)
    asyncio.run(svc._load(Replica("x", "n1", "", "loading", decision_id("x", 0), 90.0)))
    ((_, cmd),) = control.writes
    assert cmd["status"] == "failed" and "no such file" in cmd["reason"]
    assert "footprint_bytes" not in cmd


def test_the_measured_footprint_sizes_the_next_placement() -> None:
    record = PlacementRecord()
    load = {"op": "load", "id": decision_id("big", 0), "model": "big", "base": 0,
            "node": "a", "gpu": "GPU-0", "footprint_bytes": 0, "reason": "pin", "at": 1.0}
    assert record.apply(load)["ok"]
    assert record.footprint("big") is None
    assert record.apply({"op": "report", "model": "big", "node": "a",
                         "load": decision_id("big", 0), "status": "ready", "at": 2.0,
                         "footprint_bytes": 30 * GIB})["changed"]
    assert record.get("big").replicas["a"].state == READY
    assert record.footprint("big") == 30 * GIB
    assert not record.apply({"op": "report", "model": "big", "node": "a", "load": "big#0",
                             "status": "ready", "at": 2.0, "footprint_bytes": -1})["ok"]
    nodes = [Node("a", gpus=(Gpu("GPU-0", "L4", 40 * GIB, 80 * GIB),)),
             Node("b", gpus=(Gpu("GPU-0", "L4", 20 * GIB, 24 * GIB),)),
             Node("c", gpus=(Gpu("GPU-0", "A100", 50 * GIB, 80 * GIB),))]
    p = plan([Model("big", pin=Pin(min_replicas=2), footprint_bytes=record.footprint("big"),
                    footprint_source="measured")], nodes, record, 10.0)
    (added,) = p.of(Load)
    assert added.node == "c"  # b's 20 GiB free cannot hold the 30 GiB it measured


def test_footprint_of_counts_growth_on_gpus_read_both_times() -> None:
    assert footprint_of({"a": 1, "b": 5}, {"a": 4, "b": 2, "c": 9}) == 3
    assert footprint_of(None, {"a": 1}) == 0
