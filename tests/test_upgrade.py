"""A mesh in the middle of a rolling upgrade: this build's agents beside the previous build's
(:data:`testbed.release.PREVIOUS`, extracted from this repository's history) join one mesh,
form the Raft groups together, take policy writes through either build's coordinators and
this build's plain nodes, agree on every copy, and survive the loss of the leader.

People's writes made on a previous-build plain node are left out on purpose: that build
forwards them without the caller's credential, which this build's coordinators refuse, so
coordinators are upgraded last (docs/security.md, "Forwarded writes")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed import release
from testbed.cluster import metric_sum
from tests.test_consensus_integration import (
    CONVERGE,
    Mesh,
    apply,
    quota,
    wait_ready,
    wait_same_policies,
    write_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if release.commit_of(release.PREVIOUS) is None:
        pytest.skip(f"the previous build ({release.PREVIOUS[:12]}) is not in this clone's "
                    "history (a shallow clone?): `git fetch --unshallow` to run this test")
    return release.extract(release.PREVIOUS, tmp_path_factory.mktemp("builds"))


def test_a_mixed_mesh_joins_writes_agrees_and_fails_over(
        meshes: Callable[..., Mesh], previous: Path) -> None:
    mesh = meshes(3, 2, start=False)
    c = mesh.c
    old = [c.nodes[1], c.nodes[3]]  # n2 (a coordinator) and n4 (a plain node)
    for node in old:
        node.root = previous
    c.start()
    for node in old:  # the previous build's processes run its own tree
        if sys.platform.startswith("linux"):
            assert Path(f"/proc/{node.pid}/cwd").resolve() == previous.resolve()
    c.wait_converged(CONVERGE)  # every node, of either build, sees all five alive
    leaders = wait_ready(mesh, voters=3)
    new_plain = c.nodes[4]
    for i, node in enumerate([*mesh.coordinators, new_plain]):
        apply(c, node, quota(f"q{i}", 10 + i))  # through each coordinator and forwarded
    wait_same_policies(mesh)
    leader = leaders["policy"]
    leader.kill()
    survivors = [n for n in mesh.coordinators if n is not leader]
    write_until(c, [*survivors, new_plain], quota("after", 99), timeout=20.0)
    wait_same_policies(mesh, [n for n in c.nodes if n.running])
    assert all(n.running for n in c.nodes if n is not leader), "an agent exited"
    # This build tags its datagrams with its mesh only to peers that read optional types: the
    # previous build, which drops a whole packet holding a type it does not know, never got one.
    dropped = "meshd_gossip_dropped_packets_total"
    for node in (n for n in c.nodes if n.running):  # not the killed leader
        reason = "unknown_type" if node in old else "other_mesh"
        assert metric_sum(node.metrics(), dropped, reason=reason) == 0, (node, reason)
