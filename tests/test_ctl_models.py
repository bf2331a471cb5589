"""``meshctl models`` against a real agent: one meshd node (its own Raft coordinator, mTLS)
started with ``--model-control`` beside a real Triton in explicit model control, so the
placement controller really loads what is pinned and its ModelPlacement record is real.

- ``pin``/``scale`` write the ModelPin (read back with ``meshctl policy get``), keeping the
  fields they do not name, and a concurrent change between their read and write is a
  conflict, not lost;
- ``list``/``get`` show a pin without replicas, a replica loaded and ready on the node, and
  a pin to a node that does not exist as refused, with the reason;
- a bad value is the server's INVALID_ARGUMENT, shown as meshctl shows every server error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from meshd.ctl import main as ctl
from meshd.ctl import models as ctl_models
from meshd.dev.triton import TritonServer
from proto.mesh.v1 import admin_pb2
from testbed.cluster import Cluster, node_ip
from testbed.raft import coordinator_args, pick_raft_port
from tests.triton import TritonFactory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]


@dataclass
class Mesh:
    c: Cluster
    triton: TritonServer

    @property
    def base(self) -> list[str]:
        return ["--admin", self.c.seed.admin, "--creds", str(self.c.admin_creds)]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    factory = TritonFactory(tmp_path_factory.mktemp("triton"))
    try:
        server = factory(1, explicit=True, models=[])[0]
        raft = pick_raft_port([node_ip(1)])
        c = Cluster(1, tmp_path_factory.mktemp("mesh"), node_args=lambda i: [
            "--gpu", "off", "--model-control", "--model-slots", "1",
            "--triton", server.meshd_spec, *coordinator_args(1, raft, 1)])
        try:
            c.start()
            c.wait_for(lambda: _leader(c), 30, "a policy leader (consistent reads answer)")
            yield Mesh(c, server)
        finally:
            c.close()
    finally:
        factory.close()


def _call(c: Cluster, method: str, request: Any, timeout: float) -> Any:
    client: Any = c.client  # a local one: the cluster has no network namespace
    return client._call(c.seed.admin, method, request, timeout)


def _leader(c: Cluster) -> bool:
    try:
        _call(c, "PolicyGet", admin_pb2.PolicyGetRequest(
            kind="ModelPin", name="none", consistent=True, timeout_seconds=2), 3.0)
        return True
    except Exception:  # noqa: BLE001 - no leader yet
        return False


def meshctl(m: Mesh, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = ctl.main([*m.base, *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def pin_spec(m: Mesh, capsys: pytest.CaptureFixture[str], model: str) -> dict[str, Any]:
    rc, out, err = meshctl(m, capsys, "policy", "get", "ModelPin", model, "--consistent",
                           "--format", "json")
    assert rc == 0, err
    spec: dict[str, Any] = json.loads(out)["spec"]
    return spec


def rows(out: str) -> dict[str, dict[str, str]]:
    """``models list``'s table by model (WHY, the last column, may hold spaces)."""
    lines = out.splitlines()
    head = lines[0].split()
    assert head == ["MODEL", "PIN", "DESIRED", "PLACED", "READY", "LOADING", "DRAINING",
                    "WHY"], lines
    return {r[0]: dict(zip(head, r, strict=True))
            for r in (line.split(None, len(head) - 1) for line in lines[1:])}


def listed(m: Mesh, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, str]]:
    rc, out, err = meshctl(m, capsys, "models", "list")
    assert rc == 0, err
    return rows(out)


def row_when(m: Mesh, capsys: pytest.CaptureFixture[str], model: str, column: str,
             good: Any) -> dict[str, str]:
    """The model's ``list`` row once ``good(row[column])`` holds (30 s at most)."""
    def check() -> dict[str, str] | None:
        row = listed(m, capsys).get(model)
        return row if row is not None and good(row[column]) else None
    found = m.c.wait_for(check, 30, f"{model}'s {column} in models list")
    assert found is not None
    return found


def test_pin_and_scale_write_the_pin_and_keep_what_they_do_not_name(
        mesh: Mesh, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = meshctl(mesh, capsys, "models", "pin", "resnet50", "--nodes", "gpu-17,gpu-18",
                           "--zones", "z1", "--gpu-types", "A100-SXM4-80GB",
                           "--min-free-vram-mb", "2048", "--max", "4")
    assert rc == 0, err
    assert out.startswith("ModelPin/resnet50 created (version "), out
    assert pin_spec(mesh, capsys, "resnet50") == {
        "nodes": ["gpu-17", "gpu-18"], "zones": ["z1"], "gpu_types": ["A100-SXM4-80GB"],
        "min_free_vram_mb": 2048, "min_replicas": 0, "max_replicas": 4, "config": ""}

    rc, out, err = meshctl(mesh, capsys, "models", "scale", "resnet50", "3")
    assert rc == 0 and "updated" in out and "min 3, max 4" in out, (out, err)
    spec = pin_spec(mesh, capsys, "resnet50")
    assert spec["min_replicas"] == 3 and spec["max_replicas"] == 4, spec
    assert spec["nodes"] == ["gpu-17", "gpu-18"] and spec["min_free_vram_mb"] == 2048, spec

    rc, _, err = meshctl(mesh, capsys, "models", "scale", "resnet50", "2", "--max", "none")
    assert rc == 0, err
    spec = pin_spec(mesh, capsys, "resnet50")
    assert spec["min_replicas"] == 2 and spec["max_replicas"] is None, spec
    rc, _, err = meshctl(mesh, capsys, "models", "pin", "resnet50", "--nodes", "", "--min", "1")
    assert rc == 0, err
    spec = pin_spec(mesh, capsys, "resnet50")
    assert spec["nodes"] == [] and spec["zones"] == ["z1"] and spec["min_replicas"] == 1, spec

    # scale creates the pin when there is none
    rc, out, err = meshctl(mesh, capsys, "models", "scale", "fresh", "0", "--max", "2")
    assert rc == 0 and "ModelPin/fresh created" in out, (out, err)
    assert pin_spec(mesh, capsys, "fresh")["max_replicas"] == 2

    # a bad value is the server's answer, shown as meshctl shows every server error
    with pytest.raises(SystemExit) as parser:  # refused by meshctl's parser, never sent
        meshctl(mesh, capsys, "models", "pin", "resnet50", "--max", "0")
    assert parser.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    rc, out, err = meshctl(mesh, capsys, "models", "scale", "fresh", "5")
    assert rc == 2 and "meshctl: INVALID_ARGUMENT:" in err and "max_replicas" in err, err
    assert pin_spec(mesh, capsys, "fresh")["min_replicas"] == 0


def test_a_change_between_read_and_write_is_a_conflict_not_lost(
        mesh: Mesh, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert meshctl(mesh, capsys, "models", "scale", "racy", "0")[0] == 0
    real = ctl_models._get

    def read_then_someone_writes(stub: Any, args: Any, kind: str,
                                 consistent: bool = False) -> dict[str, Any] | None:
        doc = real(stub, args, kind, consistent)
        if consistent:  # the read of a read-modify-write: another operator writes now
            theirs = admin_pb2.PolicyApplyRequest(text=json.dumps(
                {"kind": "ModelPin", "name": "racy", "spec": {"zones": ["theirs"]}}),
                timeout_seconds=5)
            _call(mesh.c, "PolicyApply", theirs, 8.0)
        return doc

    monkeypatch.setattr(ctl_models, "_get", read_then_someone_writes)
    rc, out, err = meshctl(mesh, capsys, "models", "scale", "racy", "1")
    monkeypatch.undo()
    assert rc == 1 and "meshctl: ABORTED:" in err, (rc, out, err)
    spec = pin_spec(mesh, capsys, "racy")
    assert spec["zones"] == ["theirs"] and spec["min_replicas"] == 0, spec


def test_list_and_get_show_a_pin_without_replicas(
        mesh: Mesh, capsys: pytest.CaptureFixture[str]) -> None:
    assert meshctl(mesh, capsys, "models", "pin", "bert", "--min", "0", "--max", "3",
                   "--zones", "eu-1")[0] == 0
    row = listed(mesh, capsys)["bert"]
    assert row == {"MODEL": "bert", "PIN": "0..3", "DESIRED": "0", "PLACED": "0",
                   "READY": "0", "LOADING": "0", "DRAINING": "0",
                   "WHY": "no demand and no min_replicas"}, row
    rc, out, err = meshctl(mesh, capsys, "models")  # list is the default
    assert rc == 0 and rows(out)["bert"] == row, (out, err)

    rc, out, err = meshctl(mesh, capsys, "models", "get", "bert")
    assert rc == 0, err
    assert "Pin:        min 0, max 3; nodes any; zones eu-1; GPU types any; " \
           "min free VRAM any (ModelPin version " in out, out
    assert "Refused:    no" in out and "Failures:   none" in out, out
    assert "Desired:    0 (no demand and no min_replicas; demand 0.00 s of work/s)" in out, out
    assert "NODE" not in out, out  # no replica table

    rc, out, err = meshctl(mesh, capsys, "models", "list", "--format", "json")
    bert = next(x for x in json.loads(out) if x["model"] == "bert")
    assert bert["pin"]["max_replicas"] == 3 and bert["placed"] == 0 and bert["ready"] == 0

    rc, out, err = meshctl(mesh, capsys, "models", "get", "nothing-here")
    assert rc == 1 and out == "", out
    assert "model 'nothing-here' has neither a ModelPin nor a ModelPlacement" in err, err


def _triton_ready(server: TritonServer, model: str) -> bool:
    return server.model_ready(model)


def test_a_pinned_model_is_loaded_and_shown_ready_on_its_node(
        mesh: Mesh, capsys: pytest.CaptureFixture[str]) -> None:
    assert not _triton_ready(mesh.triton, "add_sub")
    assert meshctl(mesh, capsys, "models", "scale", "add_sub", "1")[0] == 0
    row = row_when(mesh, capsys, "add_sub", "READY", lambda v: v == "1")
    assert row["PIN"] == "1..-" and row["PLACED"] == "1" and row["LOADING"] == "0", row
    assert _triton_ready(mesh.triton, "add_sub")

    rc, out, err = meshctl(mesh, capsys, "models", "get", "add_sub")
    assert rc == 0, err
    assert "Replicas:   1 placed: 1 ready, 0 loading, 0 draining" in out, out
    table = out.split("Replicas:", 1)[1].splitlines()
    assert table[1].split()[:3] == ["NODE", "GPU", "STATE"], out
    node, gpu, state = table[2].split()[:3]
    assert (node, gpu, state) == (mesh.c.seed.name, "cpu", "ready"), out
    assert " ago " in table[2], out

    rc, out, _ = meshctl(mesh, capsys, "models", "get", "add_sub", "--format", "json")
    placement = json.loads(out)["placement"]
    assert placement["replicas"][mesh.c.seed.name]["state"] == "ready", placement


def test_a_pin_to_a_node_that_does_not_exist_is_refused_with_the_reason(
        mesh: Mesh, capsys: pytest.CaptureFixture[str]) -> None:
    assert meshctl(mesh, capsys, "models", "pin", "delay", "--nodes", "nowhere",
                   "--min", "1")[0] == 0
    row = row_when(mesh, capsys, "delay", "WHY", lambda v: "no_node: " in v)
    assert row["PLACED"] == "0" and row["READY"] == "0" and row["DESIRED"] == "1", row
    assert row["WHY"].startswith("min_replicas 1; refused: ") and "nowhere" in row["WHY"], row
    rc, out, err = meshctl(mesh, capsys, "models", "get", "delay")
    assert rc == 0, err
    assert "Refused:    yes, no_node: " in out and "nowhere" in out, out
    assert not _triton_ready(mesh.triton, "delay")
