"""Models placed across a real mesh (issue 28): real Triton servers in explicit model control,
real agents, real Raft.

Three agents, all coordinators, each beside its own Triton (``--model-control-mode=explicit``,
nothing loaded at start) and started with ``--model-control``.  A ModelPin of two replicas
makes the policy group's leader place ``add_sub`` on exactly two of them, which their agents
load through Triton's repository API and report ready; when one of those nodes dies (agent
and Triton killed), its replica is placed on the third; a model pinned to a node that does
not exist is refused, with the reason, in its ModelPlacement document.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from meshd.dev.triton import TritonServer
from proto.mesh.v1 import admin_pb2
from testbed.cluster import Cluster, Node, node_ip
from testbed.raft import coordinator_args, pick_raft_port
from tests.triton import TritonFactory

MODEL = "add_sub"


def _ready(server: TritonServer, model: str = MODEL) -> bool:
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/ready",
                                    timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _apply(c: Cluster, node: Node, doc: dict[str, Any]) -> None:
    req = admin_pb2.PolicyApplyRequest(text=json.dumps(doc), timeout_seconds=5)
    c.client._call(node.admin, "PolicyApply", req, 8.0)


def _placement(c: Cluster, node: Node, model: str = MODEL) -> dict[str, Any] | None:
    resp = c.client._call(node.admin, "PolicyGet", admin_pb2.PolicyGetRequest(
        kind="ModelPlacement", name=model, consistent=False, timeout_seconds=3), 5.0)
    return json.loads(resp.document_json)["spec"] if resp.found else None


def test_a_pin_of_two_loads_exactly_two_and_a_dead_node_s_replica_moves(
        tmp_path: Path, triton_factory: TritonFactory) -> None:
    servers = triton_factory(3, explicit=True, models=[])
    raft = pick_raft_port([node_ip(i) for i in range(1, 4)])
    c = Cluster(3, tmp_path / "mesh", node_args=lambda i: [
        "--gpu", "off", "--model-control", "--model-slots", "1",
        "--triton", servers[i - 1].meshd_spec, *coordinator_args(i, raft, 3)])
    try:
        c.start()
        c.wait_converged(60)
        assert not any(_ready(s) for s in servers), "explicit mode: nothing loaded at start"
        c.wait_for(lambda: _try_apply(c, {"kind": "ModelPin", "name": MODEL,
                                          "spec": {"min_replicas": 2}}), 60,
                   "the pin written (a policy leader elected)")
        c.wait_for(lambda: sum(map(_ready, servers)) == 2, 60, "two replicas loaded")
        time.sleep(3)  # settled: no third load, nothing unloaded
        loaded = [i for i, s in enumerate(servers) if _ready(s)]
        assert len(loaded) == 2, loaded
        spec = _placement(c, c.nodes[0])
        assert spec is not None
        assert sorted(spec["replicas"]) == sorted(c.nodes[i].name for i in loaded), spec
        assert {r["state"] for r in spec["replicas"].values()} == {"ready"}, spec
        samples = c.nodes[2].metrics()
        assert _series(samples, "meshd_models_replicas", model=MODEL, state="ready") == 2
        assert _series(samples, "meshd_models_desired_replicas", model=MODEL) == 2
        assert sum(_series(n.metrics(), "meshd_models_load_seconds_count", outcome="ok")
                   for n in c.nodes) == 2

        # A pin nothing can satisfy is refused, with the reason, and nothing is loaded.
        _apply(c, c.nodes[0], {"kind": "ModelPin", "name": "delay",
                               "spec": {"min_replicas": 1, "nodes": ["nowhere"]}})
        refused = c.wait_for(lambda: (_placement(c, c.nodes[1], "delay") or {}).get("refused"),
                             30, "the refusal recorded")
        reason = (_placement(c, c.nodes[1], "delay") or {})["refused_reason"]
        assert refused == "no_node" and "nowhere" in reason, reason
        assert not any(_ready(s, "delay") for s in servers)

        # One of them dies, agent and Triton: its replica is placed on the third node.
        victim = loaded[0]
        spare = ({0, 1, 2} - set(loaded)).pop()
        c.nodes[victim].kill()
        servers[victim].kill()
        survivor = c.nodes[loaded[1]]
        c.wait_for(lambda: _ready(servers[spare]), 90, "the replica placed again")
        c.wait_for(lambda: _ready_in_record(_placement(c, survivor))
                   == {c.nodes[loaded[1]].name, c.nodes[spare].name}, 30,
                   "the record shows the move")
        # The dead node's replica is drained (nobody can unload it) until gossip forgets the
        # node; it is never counted.
        dead = (_placement(c, survivor) or {})["replicas"].get(c.nodes[victim].name)
        assert dead is None or dead["state"] == "draining", dead
        assert _ready(servers[loaded[1]])
    finally:
        c.close()


def _series(samples: list[tuple[str, dict[str, str], float]], name: str,
            **labels: str) -> float:
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


def _ready_in_record(spec: dict[str, Any] | None) -> set[str]:
    return {n for n, r in (spec or {}).get("replicas", {}).items() if r["state"] == "ready"}


def _try_apply(c: Cluster, doc: dict[str, Any]) -> bool:
    try:
        _apply(c, c.nodes[0], doc)
        return True
    except Exception:  # noqa: BLE001 - no leader yet: try again
        return False
