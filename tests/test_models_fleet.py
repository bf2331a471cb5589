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
import threading
import time
from pathlib import Path
from typing import Any

from meshd.admin.authz import FORWARDED
from meshd.dev.triton import TritonServer
from proto.mesh.v1 import admin_pb2
from testbed.cluster import TRUST_DOMAIN, Cluster, Node, node_ip
from testbed.raft import coordinator_args, pick_raft_port
from tests.triton import TritonFactory

MODEL = "add_sub"
COOL_DOWN = 8.0
"""Seconds of low demand before a replica goes (the default is 120)."""


def _ready(server: TritonServer, model: str = MODEL) -> bool:
    return server.model_ready(model)


def _mesh(tmp_path: Path, servers: list[TritonServer], *, router: bool = False,
          extra: tuple[str, ...] = ()) -> Cluster:
    """An agent beside each Triton, every one a coordinator started with ``--model-control``
    (one CPU slot); ``n1`` the router when ``router``."""
    n = len(servers)
    raft = pick_raft_port([node_ip(i) for i in range(1, n + 1)])
    return Cluster(n, tmp_path / "mesh", node_args=lambda i: [
        "--gpu", "off", "--model-control", "--model-slots", "1", *extra,
        "--triton", servers[i - 1].meshd_spec,
        *(["--role", "router", "--subscribe", "*"] if router and i == 1 else []),
        *coordinator_args(i, raft, n)])


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
    c = _mesh(tmp_path, servers)
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


def _try_apply(c: Cluster, doc: dict[str, Any], node: Node | None = None) -> bool:
    try:
        _apply(c, node or c.nodes[0], doc)
        return True
    except Exception:  # noqa: BLE001 - no leader yet: try again
        return False


def _caller(router: str, creds: Path, stop: threading.Event, pause: float,
            outcomes: list[str], *, at_least_once: bool = False) -> None:
    """Closed-loop ``delay`` requests through the router until ``stop``; each outcome is
    appended ("ok" or the error)."""
    import tritonclient.grpc as tc

    from certs.spiffe import any_node_dns
    from tests.triton import delay_inputs

    client = tc.InferenceServerClient(
        router, ssl=True, root_certificates=str(creds / "bundle.pem"),
        private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
        channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
    inputs = delay_inputs(64, tc)
    try:
        while at_least_once or not stop.is_set():
            at_least_once = False
            try:
                client.infer("delay", inputs, client_timeout=30)
                outcomes.append("ok")
            except Exception as exc:  # noqa: BLE001 - what failed is the test's finding
                outcomes.append(str(exc))
            if pause:
                stop.wait(pause)
    finally:
        client.close()


def test_demand_adds_a_replica_and_its_end_removes_one_after_the_cool_down_losing_no_request(
        tmp_path: Path, triton_factory: TritonFactory) -> None:
    """Demand surge -> a replica added; demand gone -> one removed after the cool-down, and
    the requests that kept coming meanwhile all succeed (the replica was drained first)."""
    servers = triton_factory(3, explicit=True, models=[])
    c = _mesh(tmp_path, servers, router=True, extra=("--model-cool-down", str(COOL_DOWN)))
    stop, trickle_stop = threading.Event(), threading.Event()
    heavy: list[str] = []
    trickle: list[str] = []
    threads: list[threading.Thread] = []
    try:
        c.start()
        c.wait_converged(60)
        for s in servers:  # 50 ms a request, one at a time: 8 callers keep ~2 replicas busy
            s.set_behaviour("delay", delay_ms=50)
        c.wait_for(lambda: _try_apply(c, {"kind": "ModelPin", "name": "delay",
                                          "spec": {"min_replicas": 0, "max_replicas": 3}}),
                   60, "the pin written (a policy leader elected)")
        router = c.nodes[0].router
        time.sleep(2)
        assert not any(_ready(s, "delay") for s in servers), "a pin of 0 loads nothing"
        # Scale from zero: the first request is held while a replica loads, then answered.
        first: list[str] = []
        once = threading.Event()
        once.set()  # one request, no loop
        started = time.monotonic()
        _caller(router, c.admin_creds, once, 0.0, first, at_least_once=True)
        assert first == ["ok"], first
        assert sum(_ready(s, "delay") for s in servers) == 1
        assert time.monotonic() - started < 30
        threads = [threading.Thread(target=_caller, args=(router, c.admin_creds, stop, 0.0,
                                                          heavy)) for _ in range(8)]
        threads.append(threading.Thread(target=_caller, args=(
            router, c.admin_creds, trickle_stop, 0.05, trickle)))
        for t in threads:
            t.start()
        c.wait_for(lambda: sum(_ready(s, "delay") for s in servers) >= 2, 60,
                   "a replica added for the demand")
        time.sleep(3)  # the new replica takes requests
        stop.set()  # the surge ends; the trickle goes on
        added = sum(_ready(s, "delay") for s in servers)
        time.sleep(2)  # the surge's queue drains (requests shed in the surge are its own)
        calm = len(trickle)
        c.wait_for(lambda: sum(_ready(s, "delay") for s in servers) < added, COOL_DOWN + 60,
                   "a replica removed after the cool-down")
        spec = _placement(c, c.nodes[1], "delay") or {}
        assert len(_ready_in_record(spec)) == sum(_ready(s, "delay") for s in servers), spec
        time.sleep(2)  # requests after the unload, too
        trickle_stop.set()
        for t in threads:
            t.join(30)
        failed = [o for o in trickle[calm:] if o != "ok"]
        assert len(trickle) - calm > 50 and not failed, (len(trickle) - calm, failed[:3])
        assert heavy.count("ok") > 100, heavy[-3:]
    finally:
        stop.set()
        trickle_stop.set()
        for t in threads:
            t.join(30)
        c.close()


def test_the_policy_leader_killed_mid_placement_leaves_no_double_load_and_no_lost_decision(
        tmp_path: Path, triton_factory: TritonFactory) -> None:
    """The pin is written and the policy group's leader is killed at once, while it places:
    the new leader continues from the committed record: exactly the pinned count is loaded,
    never more, on the surviving nodes."""
    servers = triton_factory(3, explicit=True, models=[])
    c = _mesh(tmp_path, servers)
    try:
        c.start()
        c.wait_converged(60)
        leader = c.wait_for(lambda: _policy_leader(c), 60, "a policy leader")
        others = [n for n in c.nodes if n.name != leader]
        c.wait_for(lambda: _try_apply(c, {"kind": "ModelPin", "name": MODEL,
                                          "spec": {"min_replicas": 2}}, others[0]), 30,
                   "the pin written (the new mesh's connections up)")
        victim = c.node(leader)
        time.sleep(0.3)  # its first pass: decisions proposed, loads under way
        victim.kill()
        servers[c.nodes.index(victim)].kill()
        survivors = [servers[c.nodes.index(n)] for n in others]
        most = 0

        def both() -> bool:
            nonlocal most
            spec = _placement(c, others[0]) or {}
            live = [r for n, r in spec.get("replicas", {}).items()
                    if n != leader and r["state"] != "draining"]
            most = max(most, len(live))
            return all(_ready(s) for s in survivors)
        c.wait_for(both, 60, "both survivors loaded under the new leader")
        time.sleep(2)
        spec = _placement(c, others[0]) or {}
        assert _ready_in_record(spec) == {n.name for n in others}, spec
        assert most <= 2, most  # never more than the pin on the live nodes
    finally:
        c.close()


def _policy_leader(c: Cluster) -> str | None:
    for node in c.nodes:
        try:
            resp = c.client._call(node.admin, "RaftStatus", admin_pb2.RaftStatusRequest(), 5.0)
        except Exception:  # noqa: BLE001 - not up yet
            continue
        for g in resp.groups:
            if g.group == "policy" and g.state == "leader" and not g.error:
                return str(g.node)
    return None


def test_triton_s_repository_control_through_the_router_means_at_least_one_or_none(
        tmp_path: Path, triton_factory: TritonFactory) -> None:
    """tritonclient's ``load_model``/``unload_model`` against the router (gRPC and HTTP):
    load returns once a replica is ready in the mesh, unload once none is routable (then
    drained and unloaded); the pin is written for the caller, so a caller without the
    PolicyApply role is refused, counted and audited, and nothing moves."""
    import ssl as ssl_lib
    import urllib.request as ureq

    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    from certs.spiffe import SpiffeId, any_node_dns

    servers = triton_factory(2, explicit=True, models=[])
    c = _mesh(tmp_path, servers, router=True)
    viewer = tmp_path / "viewer"
    c.ca.mint(SpiffeId(TRUST_DOMAIN, "user", "vic"), ["viewer"]).save(viewer)

    def client(creds: Path) -> Any:
        return tc.InferenceServerClient(
            c.nodes[0].router, ssl=True, root_certificates=str(creds / "bundle.pem"),
            private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
            channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])

    try:
        c.start()
        c.wait_converged(60)
        c.wait_for(lambda: _policy_leader(c), 60, "a policy leader")
        admin, other = client(c.admin_creds), client(viewer)
        try:
            other.load_model(MODEL)
            raise AssertionError("a viewer loaded a model")
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.PERMISSION_DENIED", exc
            assert "PolicyApply" in str(exc) and "vic" in str(exc), exc
        time.sleep(1)
        assert not any(_ready(s) for s in servers)

        started = time.monotonic()
        admin.load_model(MODEL)  # returns once a replica is ready somewhere
        assert sum(map(_ready, servers)) == 1, "at least one: exactly the one asked for"
        assert admin.is_model_ready(MODEL)
        assert time.monotonic() - started < 30
        pin = _pin(c, c.nodes[1], MODEL)
        assert pin["min_replicas"] == 1 and pin["max_replicas"] is None, pin

        # Load with a config override: the pin carries it, the loaded replica reloads with it.
        (server,) = [s for s in servers if _ready(s)]
        direct = tc.InferenceServerClient(server.grpc_url)
        config = direct.get_model_config(MODEL, as_json=True)["config"]
        assert sum(g.get("count", 1) for g in config.get("instance_group", [])) != 2
        config["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
        admin.load_model(MODEL, config=json.dumps(config))
        assert json.loads(_pin(c, c.nodes[1], MODEL)["config"])["instance_group"][0][
            "count"] == 2

        def instances() -> int:
            cfg = direct.get_model_config(MODEL, as_json=True)["config"]
            return sum(int(g.get("count", 1)) for g in cfg.get("instance_group", []))
        c.wait_for(lambda: instances() == 2, 30, "the replica reloaded with the override")
        direct.close()

        # HTTP: unload means none routable at once, then drained and unloaded.
        ctx = ssl_lib.create_default_context(cafile=str(c.admin_creds / "bundle.pem"))
        ctx.load_cert_chain(str(c.admin_creds / "cert.pem"), str(c.admin_creds / "key.pem"))
        ctx.check_hostname = False
        url = (f"https://{c.nodes[0].ip}:{c.nodes[0].router_http_port}"
               f"/v2/repository/models/{MODEL}/unload")
        with ureq.urlopen(ureq.Request(url, data=b"", method="POST"), context=ctx,
                          timeout=60) as resp:
            assert resp.status == 200
        assert not admin.is_model_ready(MODEL)
        c.wait_for(lambda: not any(_ready(s) for s in servers), 30, "the replica unloaded")
        assert _pin(c, c.nodes[1], MODEL)["max_replicas"] == 0
        # The index lists pinned models never loaded, as Triton lists a model it has not.
        _apply(c, c.nodes[0], {"kind": "ModelPin", "name": "delay", "spec": {"max_replicas": 0}})
        c.wait_for(lambda: ("delay", "UNAVAILABLE") in [
            (m.name, m.state) for m in admin.get_model_repository_index().models], 10,
                   "a pinned model with no replica in RepositoryIndex")
        time.sleep(2)
        assert not any(_ready(s) for s in servers), "no replica comes back"
        admin.load_model(MODEL)  # and back: the cap of 0 is lifted
        assert sum(map(_ready, servers)) == 1
        admin.close()
        other.close()
        refused = _series(c.nodes[0].metrics(), "meshd_security_refusals_total",
                          channel=FORWARDED, reason="permission_denied")
        assert refused >= 1, "the viewer's refusal is counted"
        audit = (c.nodes[0].data_dir / "audit.log").read_text()
        assert "vic" in audit and "PolicyApply" in audit, audit[-500:]
    finally:
        c.close()


def _pin(c: Cluster, node: Node, model: str) -> dict[str, Any]:
    resp = c.client._call(node.admin, "PolicyGet", admin_pb2.PolicyGetRequest(
        kind="ModelPin", name=model, consistent=True, timeout_seconds=3), 5.0)
    assert resp.found, model
    spec: dict[str, Any] = json.loads(resp.document_json)["spec"]
    return spec
