"""Automatic quarantine end to end: real meshd processes, real Raft, real mTLS.

No GPU here, so GPU health reaches the agent the way an external collector's would: through
``StatePlane.ReportGpuState``.  From there on everything is the product's path: the signal
plane, the health monitor, the NodeFlags write through Raft, the flag on every node, an
operator's lift, and the automatic lift after a healthy period.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from certs import tls
from proto.mesh.v1 import admin_pb2, state_pb2, state_pb2_grpc
from testbed.cluster import Cluster, Node, parse_metrics
from tests.test_consensus_integration import Mesh, apply, call, get, pytestmark

__all__ = ["pytestmark"]

HOLD = 3.0
"""lift_after_seconds of the test's HealthPolicy."""


def report_gpu(c: Cluster, node: Node, ecc: int, remove: bool = False) -> None:
    with tls.grpc_channel(node.admin, c.client.identity) as channel:  # type: ignore[union-attr]
        stub = state_pb2_grpc.StatePlaneStub(channel)
        ack = stub.ReportGpuState(iter([state_pb2.GpuStateDelta(
            uuid="GPU-test-0", index=0, name="Test GPU", memory_total=80 << 30,
            memory_free=40 << 30, ecc_uncorrected=ecc, remove=remove)]), timeout=5)
    assert ack.accepted == 1


def quarantined(c: Cluster, via: Node, name: str) -> dict[str, Any] | None:
    doc = get(c, via, name, kind="NodeFlags", consistent=False)
    return doc["spec"]["quarantined"] if doc else None


def wait_flag(c: Cluster, nodes: list[Node], name: str, want: Callable[[Any], bool],
              timeout: float, what: str) -> None:
    c.wait_for(lambda: all(want(quarantined(c, n, name)) for n in nodes), timeout, what,
               interval=0.2, on_timeout=lambda: json.dumps(
                   {n.name: quarantined(c, n, name) for n in nodes}))


def test_ecc_errors_quarantine_the_node_operator_lift_sticks_and_health_lifts(
        meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(coordinators=3, plain=1)
    c = mesh.c
    gpu_node = mesh.plain[0]  # a plain node: its write is forwarded to the leader
    apply(c, mesh.coordinators[0], json.dumps({
        "kind": "HealthPolicy", "name": "default", "spec": {"lift_after_seconds": HOLD}}))
    report_gpu(c, gpu_node, ecc=0)
    time.sleep(2.0)
    assert quarantined(c, mesh.coordinators[0], gpu_node.name) is None

    report_gpu(c, gpu_node, ecc=1)
    wait_flag(c, c.nodes, gpu_node.name, lambda q: q is not None and q["auto"], 10.0,
              "the node quarantined itself, seen everywhere")
    q = quarantined(c, mesh.coordinators[1], gpu_node.name)
    assert q is not None
    assert q["reason"] == "auto: 1 uncorrected ECC error on GPU 0 (GPU-test-0)"
    members = call(c, mesh.coordinators[1], "Members", admin_pb2.MembersRequest())
    assert "quarantined" in next(m for m in members.members if m.name == gpu_node.name).flags
    time.sleep(HOLD + 2.0)  # still unhealthy: never lifted
    assert quarantined(c, mesh.coordinators[0], gpu_node.name) is not None

    # The operator has seen it and lifts it: the same error does not quarantine again...
    call(c, mesh.coordinators[0], "Quarantine",
         admin_pb2.NodeFlagRequest(node=gpu_node.name, clear=True))
    time.sleep(3.0)
    assert quarantined(c, mesh.coordinators[0], gpu_node.name) is None
    saved = json.loads((gpu_node.data_dir / "health.json").read_text())
    assert saved == {"ecc_acknowledged": {"GPU-test-0": 1}}
    # ...a new one does, and once the GPU is healthy (here: gone) it is lifted after the hold,
    # doubled because this is the second quarantine in a row.
    report_gpu(c, gpu_node, ecc=2)
    wait_flag(c, [mesh.coordinators[0]], gpu_node.name, lambda q: q is not None and q["auto"],
              10.0, "quarantined again for the new error")
    started = time.monotonic()
    report_gpu(c, gpu_node, ecc=2, remove=True)
    wait_flag(c, c.nodes, gpu_node.name, lambda q: q is None, 2 * HOLD + 10.0,
              "the automatic quarantine lifted after the healthy period")
    assert time.monotonic() - started >= 2 * HOLD - 0.5
    def actions() -> dict[str, float]:
        samples = parse_metrics(c.client.http_get(gpu_node.metrics_url, 5.0))
        return {s[1]["action"]: s[2] for s in samples if s[0] == "meshd_health_actions_total"}
    # The lift is counted once the node's own write returns, which can be just after every
    # copy shows it.
    c.wait_for(lambda: actions().get("lift") == 1, 5.0, "the lift counted")
    assert actions()["quarantine"] == 2, actions()


def test_an_operators_quarantine_is_left_alone(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(coordinators=3, plain=1)
    c = mesh.c
    node = mesh.plain[0]
    apply(c, mesh.coordinators[0], json.dumps({
        "kind": "HealthPolicy", "name": node.name, "spec": {"lift_after_seconds": 1}}))
    call(c, mesh.coordinators[0], "Quarantine",
         admin_pb2.NodeFlagRequest(node=node.name, reason="replacing a DIMM"))
    report_gpu(c, node, ecc=0)
    time.sleep(4.0)  # healthy far longer than lift_after_seconds
    assert quarantined(c, mesh.coordinators[0], node.name) == {
        "reason": "replacing a DIMM", "auto": False}


def test_a_runtime_that_keeps_failing_quarantines_its_node(
        meshes: Callable[..., Mesh], triton_factory: Any) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tests.triton import delay_inputs

    (server,) = triton_factory(1, models=["delay"])
    mesh = meshes(coordinators=3, plain=0, spare=1)
    c = mesh.c
    node = c.add_node(["--triton", server.meshd_spec])
    node.start([c.seed.gossip])
    c.wait_converged(30.0)
    apply(c, mesh.coordinators[0], json.dumps({
        "kind": "HealthPolicy", "name": "default",
        "spec": {"failure_min": 5, "failure_seconds": 10, "lift_after_seconds": HOLD}}))
    server.set_behaviour("delay", fail=True)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        deadline = time.monotonic() + 30.0
        while quarantined(c, mesh.coordinators[0], node.name) is None:
            assert time.monotonic() < deadline, "no quarantine for a failing runtime"
            try:
                client.infer("delay", delay_inputs(64, grpcclient))
            except InferenceServerException:
                pass
            time.sleep(0.1)
    finally:
        client.close()
    q = quarantined(c, mesh.coordinators[0], node.name)
    assert q is not None and q["auto"]
    assert q["reason"].startswith(f"auto: runtime {server.grpc_url}: ") and "failed" in q["reason"]
    # Traffic stops (nothing is routed to a quarantined node); the failures age out of the
    # 10 s window and after HOLD seconds of health the node is back.
    server.clear_behaviour()
    wait_flag(c, c.nodes, node.name, lambda q: q is None, 10.0 + HOLD + 10.0,
              "lifted after the failures aged out and the node was healthy")
