"""A network partition that cuts a trainer off from every other node, in a network namespace.

The trainer's job must be stopped (by the trainer's lease keeper, which can no longer renew)
before the lease lapses at the coordinators and the job starts on the other trainer; after
the partition heals, nothing of the old lease runs again.  When each copy ran is read from
the canary job's own records (:mod:`meshd.train.canary`).  Needs Linux, root, ``ip``,
``iptables`` with owner/connmark matching and ``setpriv``; skips with the reason otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proto.mesh.v1 import admin_pb2
from tests.test_consensus_integration import (  # noqa: F401 - fixtures
    Mesh,
    call,
    heal,
    isolate,
    meshes,
    partition_netns,
    start_partitionable,
    wait_ready,
)
from tests.test_train_integration import TTL, canary, submit, wait_job

pytestmark = [pytest.mark.netns, pytest.mark.slow]

TRAINER = ["--role", "trainer", "--gpu", "off"]


def test_a_partitioned_trainer_is_fenced_before_its_job_runs_elsewhere(
        partition_netns: str, meshes: Callable[..., Mesh],  # noqa: F811
        tmp_path: Path) -> None:
    from meshd.train.canary import audit, runs

    ns = partition_netns
    mesh = meshes(3, 2, netns=ns, start=False, extra={4: TRAINER, 5: TRAINER})
    c = mesh.c
    start_partitionable(mesh, ns)
    wait_ready(mesh, voters=3)
    c.wait_for(lambda: len(c.seed.members(role=["trainer"])) == 2, 20, "two trainers")

    submit(mesh, c.seed, canary("cut", tmp_path, 120.0))
    s = wait_job(mesh, c.seed, "cut", lambda s: s.state == "running", 20, "cut running")
    victim = c.node(s.node)
    time.sleep(1.0)
    t_cut = time.time()
    isolate(ns, mesh, victim)
    moved = wait_job(mesh, c.seed, "cut", lambda s: s.state == "running" and s.node != victim.name,
                     TTL + 25, "the job running on the other trainer")
    assert moved.attempt == 2 and list(moved.tried) == [victim.name]
    c.wait_for(lambda: len(runs(tmp_path / "cut")) == 2, 5, "the second run")
    first, second = sorted(runs(tmp_path / "cut"), key=lambda r: r.start)
    assert first.node == victim.name and second.node == moved.node
    assert first.end < second.start, (first, second)
    assert first.end - t_cut < TTL
    print(f"\npartitioned {victim.name}: its job stopped {first.end - t_cut:.2f}s after the cut; "
          f"the copy on {second.node} started {second.start - first.end:.2f}s after that")

    heal(ns)
    time.sleep(3.0)  # the healed trainer hears it lost the lease and starts nothing
    assert audit(runs(tmp_path)) == []
    assert len(runs(tmp_path / "cut")) == 2
    call(c, c.seed, "CancelJob", admin_pb2.JobRequest(id="cut"), 5)
    wait_job(mesh, c.seed, "cut", lambda s: s.state == "cancelled", 20, "cut cancelled")
