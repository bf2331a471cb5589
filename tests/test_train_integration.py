"""Training jobs end to end: real meshd processes (3 coordinators, 2 CPU trainers), real Raft,
mTLS, child processes running the NumPy sample job with checkpoints.

- a job submitted on any node is placed, runs, reports loss and checkpoints, and ends done;
- bad specs are INVALID_ARGUMENT naming the field; a job no trainer could hold is refused;
- a trainer killed mid-job (SIGKILL: its job dies with it) -> the lease lapses, the job
  resumes on the other trainer from its last checkpoint, and never runs twice at once;
- cancel stops a running job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proto.mesh.v1 import admin_pb2
from tests.cluster import Node, RpcFailed
from tests.test_consensus_integration import Mesh, call, meshes  # noqa: F401 - fixture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]

TTL = 5.0  # meshd.train.scheduler.TTL


def _mesh(meshes: Callable[..., Mesh]) -> Mesh:  # noqa: F811
    return meshes(3, 2, extra={4: ["--role", "trainer", "--gpu", "off"],
                               5: ["--role", "trainer", "--gpu", "off"]})


def spec(jid: str, tmp: Any, **hp: Any) -> str:
    return json.dumps({"id": jid, "model": "logreg", "entry": "meshd.train.sample:main",
                       "checkpoints": str(tmp / jid), "hyperparameters": {"steps": 40, **hp},
                       "gpus": {"count": 0}})


def submit(mesh: Mesh, node: Node, text: str) -> list[admin_pb2.JobStatus]:
    stream = call(mesh.c, node, "SubmitJob", admin_pb2.SubmitJobRequest(
        spec=text, timeout_seconds=5), 10)
    try:
        return list(stream)
    except Exception as exc:  # grpc.RpcError from a streaming call
        raise RpcFailed(exc.code().name, exc.details()) from None  # type: ignore[attr-defined]


def job(mesh: Mesh, node: Node, jid: str) -> admin_pb2.JobStatus:
    return call(mesh.c, node, "GetJob", admin_pb2.JobRequest(id=jid), 5)


def wait_job(mesh: Mesh, node: Node, jid: str, pred: Callable[[admin_pb2.JobStatus], bool],
             timeout: float, what: str) -> admin_pb2.JobStatus:
    return mesh.c.wait_for(lambda: (lambda s: s if pred(s) else None)(job(mesh, node, jid)),
                           timeout, what, interval=0.1)


def _running_in(workdir: Path) -> list[int]:
    """Pids of processes whose working directory is ``workdir`` (Linux /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == workdir:
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def wait_trainers(mesh: Mesh) -> None:
    mesh.c.wait_for(lambda: len(mesh.c.seed.members(role=["trainer"])) == 2, 20,
                    "two trainers visible")


def test_jobs_run_resume_after_a_trainer_dies_and_cancel(meshes: Callable[..., Mesh],  # noqa: F811
                                                          tmp_path: Any) -> None:
    mesh = _mesh(meshes)
    wait_trainers(mesh)
    plain = mesh.c.node("n4")

    # Bad input: the field is named; a job nobody could hold is refused, not queued.
    with pytest.raises(RpcFailed) as bad:
        submit(mesh, mesh.c.seed, json.dumps({"id": "x", "model": "m", "command": ["a"],
                                              "gpus": {"count": -1}}))
    assert bad.value.code == "INVALID_ARGUMENT" and "gpus.count" in bad.value.details
    with pytest.raises(RpcFailed) as huge:
        submit(mesh, mesh.c.seed, json.dumps({"id": "y", "model": "m", "command": ["a"],
                                              "gpus": {"count": 2}}))
    assert huge.value.code == "FAILED_PRECONDITION" and "gpus.count" in huge.value.details

    # A short job runs to the end.
    t0 = time.monotonic()
    first = submit(mesh, plain, spec("short", tmp_path))
    assert first[0].state == "queued"
    running = wait_job(mesh, mesh.c.seed, "short", lambda s: s.state in ("running", "done"),
                       10, "short job running")
    to_running = time.monotonic() - t0
    done = wait_job(mesh, mesh.c.seed, "short", lambda s: s.state == "done", 30,
                    "short job done")
    assert done.progress == 1.0 and done.step == 40 and done.HasField("loss")
    assert done.loss < 0.69 and done.checkpoint.endswith("step-00000040.npz")
    print(f"\nsubmit -> running: {to_running:.2f}s on {running.node}")

    # A long job: kill its trainer mid-way; it resumes elsewhere from its checkpoint.
    submit(mesh, plain, spec("long", tmp_path, steps=400, step_seconds=0.03,
                             checkpoint_every=10))
    s = wait_job(mesh, mesh.c.seed, "long", lambda s: s.state == "running" and s.step >= 30,
                 30, "long job past its first checkpoints")
    victim = mesh.c.node(s.node)
    survivor = "n5" if victim.name == "n4" else "n4"
    observer = mesh.c.seed
    workdir = (victim.data_dir / "jobs" / "long").resolve()
    assert _running_in(workdir), "the job's process was not found before the kill"
    victim.kill()
    t_kill = time.monotonic()
    # The job dies with its trainer (PR_SET_PDEATHSIG): no orphan keeps training unfenced.
    mesh.c.wait_for(lambda: not _running_in(workdir), 2, "the orphaned job process gone")
    moved = wait_job(mesh, observer, "long",
                     lambda s: s.state == "running" and s.node == survivor, TTL + 20,
                     "long job running on the other trainer")
    failover = time.monotonic() - t_kill
    assert moved.attempt == 2 and list(moved.tried) == [victim.name]
    done = wait_job(mesh, observer, "long", lambda s: s.state == "done", 60, "long job done")
    log = (tmp_path / "long").glob("step-*.npz")
    assert any(True for _ in log)
    out = (mesh.c.node(survivor).data_dir / "jobs" / "long" / "attempt-2.log").read_text()
    assert '"resumed from step' in out, out[:500]
    resumed = json.loads(out.splitlines()[0])["step"]
    assert resumed >= 30, resumed
    print(f"trainer kill -> running elsewhere: {failover:.2f}s (resumed from step {resumed})")

    # Cancel stops a running job.
    submit(mesh, observer, spec("stop", tmp_path, steps=10_000, step_seconds=0.01))
    wait_job(mesh, observer, "stop", lambda s: s.state == "running", 20, "stop running")
    call(mesh.c, observer, "CancelJob", admin_pb2.JobRequest(id="stop"), 5)
    wait_job(mesh, observer, "stop", lambda s: s.state == "cancelled", 15, "stop cancelled")
