"""Hardening of the control plane, end to end with real meshd processes (testbed/cluster.py, the
``meshes`` factory of tests/test_consensus_integration.py):

- a write that a node without a Raft member forwards carries its caller's credential, and the
  coordinator judges that caller by its own RBAC policy: the forwarding node's looser policy
  does not let a viewer write, and an operator's write is theirs;
- a coordinator's restart is not a security event: a restarted coordinator's Raft starts
  from its saved configuration before gossip names its peers, and its peers see it hang up;
  neither is counted as a refusal (``meshd_security_refusals_total{channel="raft"}``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from certs.spiffe import SpiffeId
from proto.mesh.v1 import admin_pb2
from testbed.cluster import TRUST_DOMAIN, Cluster, Node, RpcFailed, _LocalClient
from tests.test_consensus_integration import (
    Mesh,
    apply,
    call,
    get,
    quota,
    restart,
    wait_ready,
    wait_same_policies,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]

LOOSE = """[roles]
admin = ["*"]
viewer = ["Members", "Whoami", "PolicyGet", "PolicyList", "PolicyApply"]
operator = ["Members", "Whoami", "PolicyGet", "PolicyList", "PolicyApply", "Cordon"]
node = ["Members", "RaftStatus", "State", "Subscribe", "Propose", "Follow", "Status",
        "ReportModelState", "ReportGpuState", "ReportCommStats"]
"""
"""The plain node's policy: viewers may write there.  The coordinator keeps the default."""


def person(c: Cluster, name: str, role: str) -> _LocalClient:
    out = c.workdir / f"person-{name}"
    c.ca.mint(SpiffeId(TRUST_DOMAIN, "user", name), [role]).save(out)
    return _LocalClient(out)


def refusals(node: Node, channel: str) -> dict[str, float]:
    """reason -> count of ``meshd_security_refusals_total`` on ``channel`` (none: {})."""
    return {labels["reason"]: value for name, labels, value in node.metrics()
            if name == "meshd_security_refusals_total" and labels.get("channel") == channel
            and value}


def test_forwarded_writes_are_judged_by_the_coordinator(meshes: Callable[..., Mesh],
                                                        tmp_path: Path) -> None:
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE)
    mesh = meshes(1, 1, extra={2: ["--rbac-policy", str(loose)]})
    c = mesh.c
    coordinator, plain = mesh.coordinators[0], mesh.plain[0]
    operator, viewer = person(c, "olga", "operator"), person(c, "vera", "viewer")
    try:
        version = apply(c, plain, quota("by-operator", 5), client=operator)
        doc = get(c, coordinator, "by-operator")
        assert doc is not None and doc["version"] == version
        assert doc["author"] == f"spiffe://{TRUST_DOMAIN}/user/olga via {plain.name}", doc

        with pytest.raises(RpcFailed) as refused:
            apply(c, plain, quota("by-viewer", 5), client=viewer)
        assert refused.value.code == "PERMISSION_DENIED", refused.value
        details = refused.value.details
        assert "PolicyApply" in details and f"spiffe://{TRUST_DOMAIN}/user/vera" in details
        assert get(c, coordinator, "by-viewer") is None
        with pytest.raises(RpcFailed) as cordon:
            call(c, plain, "Cordon", admin_pb2.NodeFlagRequest(node=plain.name),
                 client=viewer)
        assert cordon.value.code == "PERMISSION_DENIED"  # b's own policy: no Cordon for viewers
    finally:
        operator.close()
        viewer.close()
    assert refusals(coordinator, "forwarded") == {"permission_denied": 1}
    audit = [json.loads(x) for x in (coordinator.data_dir / "audit.log").read_text().splitlines()]
    mine = [(x["method"], x["principal"], x["allowed"]) for x in audit
            if x["detail"].startswith("forwarded by") or "(forwarded by" in x["detail"]]
    assert ("PolicyApply", f"spiffe://{TRUST_DOMAIN}/user/olga", True) in mine, mine
    assert ("PolicyApply", f"spiffe://{TRUST_DOMAIN}/user/vera", False) in mine, mine


def test_a_coordinator_restart_is_not_a_security_event(meshes: Callable[..., Mesh]) -> None:
    """Kill a follower, then the leader, and start each again from its disk: every node's
    Raft refusals stay at zero, and writes go on."""
    mesh = meshes(3, 0)
    c = mesh.c
    apply(c, mesh.coordinators[0], quota("before", 1))
    before = {n.name: refusals(n, "raft") for n in mesh.coordinators}
    assert before == {n.name: {} for n in mesh.coordinators}, before
    leaders = wait_ready(mesh, voters=3)
    followers = [n for n in mesh.coordinators if n not in leaders.values()]
    for k, victim in enumerate([followers[0] if followers else mesh.coordinators[1],
                                leaders["policy"]]):
        victim.kill()
        time.sleep(1.0)
        restart(mesh, victim)
        wait_ready(mesh, voters=3)
        apply(c, victim, quota(f"after-{k}", 2))
        wait_same_policies(mesh, mesh.coordinators)
        time.sleep(1.0)  # the last reconnects
        after = {n.name: refusals(n, "raft") for n in mesh.coordinators}
        assert after == {n.name: {} for n in mesh.coordinators}, (
            f"a restart of {victim.name} counted security refusals: {after}")
        deferred = [e["msg"] for e in victim.logs() if "to be tried again" in e.get("msg", "")]
        print(f"{victim.name} restarted; deferred connections: {len(deferred)}")
