"""The signal plane across real meshd processes (mTLS on loopback) fed by real Triton servers.

One mesh for the whole module: ``n1`` (the seed) subscribes to every peer that serves models
(``--subscribe '*'``); ``n2`` polls Triton A and ``n3`` Triton B, neither subscribes.  So n1
holds n2's and n3's telemetry pushed over ``StatePlane.Subscribe`` (``via`` stream), while n2
and n3 only know each other through gossip (``via`` gossip).  Checked through each agent's
``StatePlane.State`` admin RPC and ``meshctl state``:

1. every agent sees all four Triton-backed replicas (add_sub and delay on A and B) ready, each
   arriving by the expected path;
2. a stalled ``delay`` on A with requests piling up: its queue rises in n1's (pushed) and n3's
   (gossiped) views, with a fresh queue age on n1, and falls to 0 after the release;
3. ``meshctl state n2`` (JSON and table) against n3 shows n2's replicas, queue and ages;
4. Triton A killed: n1 shows A's replicas not ready within seconds, and ready again after a
   restart.

The tests share the mesh and run in file order; each leaves Triton A running with normal
behaviour.  Bounds are generous (loaded 2-core CI); measured delays are printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from certs import tls
from certs.identity import Identity
from meshd.dev.triton import TritonServer
from proto.mesh.v1 import state_pb2, state_pb2_grpc
from testbed.cluster import ROOT, Cluster, metric_sum
from tests.triton import TritonFactory, delay_inputs, require_triton

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]

CONVERGE = 30.0
SEE = 20.0
"""Seconds for telemetry to reach a view (gossip or stream), generous for a loaded machine."""
RECOVER = SEE
"""Seconds for a restarted Triton's replicas to be ready again everywhere (the adapter's gRPC
channel caps its reconnect backoff at 1 s: tests/test_triton_adapter.py)."""
MODELS = ("add_sub", "delay")
ROUTER_PROCESSES = 3
"""n1 serves its router port from itself and two worker processes."""
STALLED_REQUESTS = 6

Key = tuple[str, str, str]
"""(node, model, endpoint) of a replica in a State view."""


@dataclass
class Mesh:
    cluster: Cluster
    a: TritonServer
    """Polled by n2."""
    b: TritonServer
    """Polled by n3."""
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def state(self, node: str, *, only: str = "", model: str = "",
              timeout: float = 5.0) -> state_pb2.StateResponse | None:
        """``node``'s fused view (``StatePlane/State``); None if the call failed."""
        target = self.cluster.node(node).admin
        channel = self._channels.get(target)
        if channel is None:
            channel = tls.grpc_channel(target, Identity.load(self.cluster.admin_creds))
            self._channels[target] = channel
        try:
            resp: state_pb2.StateResponse = state_pb2_grpc.StatePlaneStub(channel).State(
                state_pb2.StateRequest(node=only, model=model), timeout=timeout)
        except grpc.RpcError:
            return None
        return resp

    def replicas(self, node: str, **kw: Any) -> dict[Key, state_pb2.ReplicaView]:
        """``node``'s replica rows by (node, model, endpoint); empty if the call failed."""
        resp = self.state(node, **kw)
        if resp is None:
            return {}
        return {(r.node, r.model, r.endpoint): r for r in resp.replicas}

    def wait_for(self, pred: Callable[[], Any], timeout: float, what: str,
                 show: str = "n1", interval: float = 0.05) -> Any:
        """Poll ``pred``; on timeout the message shows ``show``'s replica table."""
        return self.cluster.wait_for(pred, timeout, what, interval=interval,
                                     on_timeout=lambda: describe(self.state(show)))

    def all_of(self, observer: str, keys: set[Key],
               pred: Callable[[state_pb2.ReplicaView], bool]) -> bool:
        """``observer`` shows every one of ``keys``, and ``pred`` holds for each row."""
        view = self.replicas(observer)
        return all(k in view and pred(view[k]) for k in keys)

    def queue(self, observer: str, key: Key) -> int:
        """The queue ``observer`` shows for ``key``; -99 when the row is missing (-1: unknown)."""
        row = self.replicas(observer, model=key[1]).get(key)
        return -99 if row is None else int(row.queue)

    def wait_subscribed(self) -> None:
        """Until n1 holds all four replicas, pushed (its streams open ~1 s after gossip showed
        it n2's and n3's replicas)."""
        want = set(expected(self))

        def subscribed() -> bool:
            view = self.replicas("n1")
            return set(view) == want and all(r.via == "stream" for r in view.values())

        self.wait_for(subscribed, SEE, "n1 holds n2's and n3's replicas via stream")

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()


def describe(resp: state_pb2.StateResponse | None) -> str:
    if resp is None:
        return "  (State call failed)"
    nodes = [f"  node {n.node} via={n.via} age={n.age:.2f}" for n in resp.nodes]
    reps = [f"  {r.node} {r.model} {r.endpoint} ready={r.ready} queue={r.queue} via={r.via} "
            f"ages ready={r.ready_age:.2f} queue={r.queue_age:.2f} stats={r.stats_age:.2f}"
            for r in resp.replicas]
    return "\n".join(nodes + reps) or "  (empty view)"


def expected(mesh: Mesh) -> dict[Key, str]:
    """Every Triton-backed replica, by key -> the node that polls it."""
    return {(node, model, server.grpc_url): node for node, server in
            (("n2", mesh.a), ("n3", mesh.b)) for model in MODELS}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    require_triton()
    factory = TritonFactory(tmp_path_factory.mktemp("tritons"))
    try:
        t0 = time.monotonic()
        a, b = factory(2, timeout=120)
        print(f"\nTritons ready in {time.monotonic() - t0:.1f} s")

        def args(i: int) -> list[str]:
            common = ["--gpu", "off"]
            if i == 1:
                return [*common, "--subscribe", "*", "--role", "router",
                        "--router-workers", str(ROUTER_PROCESSES)]
            server = a if i == 2 else b
            return [*common, "--triton", server.meshd_spec]

        c = Cluster(3, tmp_path_factory.mktemp("signal-mesh"), node_args=args)
        m = Mesh(c, a, b)
        try:
            c.start()
            c.wait_converged(CONVERGE)
            yield m
        finally:
            m.close()
            c.close()
    finally:
        factory.close()


@pytest.fixture
def triton_a(mesh: Mesh) -> Iterator[TritonServer]:
    """Triton A running with normal behaviour before and after the test."""
    if not mesh.a.is_running():
        mesh.a.restart(timeout=90)
    mesh.a.clear_behaviour()
    yield mesh.a
    mesh.a.clear_behaviour(wait=False)


# --- 1. every agent sees every replica, by the expected path ----------------------------------


def test_every_agent_sees_every_replica_ready_by_the_expected_path(mesh: Mesh) -> None:
    want = expected(mesh)

    def all_ready(observer: str) -> Callable[[], bool]:
        def check() -> bool:
            reps = mesh.replicas(observer)
            return set(reps) == set(want) and all(r.ready for r in reps.values())
        return check

    t0 = time.monotonic()
    for observer in ("n1", "n2", "n3"):
        mesh.wait_for(all_ready(observer), SEE, f"{observer} sees all four replicas ready",
                      show=observer)
    print(f"all replicas ready everywhere {time.monotonic() - t0:.1f} s after convergence")

    # n1 subscribes to both (its gossip copy showed replicas): their entries are pushed.
    mesh.wait_subscribed()
    n1 = mesh.state("n1")
    assert n1 is not None
    assert {n.node: n.via for n in n1.nodes} == {"n1": "local", "n2": "stream",
                                                 "n3": "stream"}, describe(n1)

    # n2 and n3 subscribe to nobody: each knows the other through gossip, itself locally.
    for observer, own, other in (("n2", "n2", "n3"), ("n3", "n3", "n2")):
        view = mesh.state(observer)
        assert view is not None
        assert {n.node: n.via for n in view.nodes} == {"n1": "gossip", own: "local",
                                                       other: "gossip"}, describe(view)
        vias = {k: r.via for k, r in mesh.replicas(observer).items()}
        assert vias == {k: "local" if node == own else "gossip" for k, node in want.items()}

    # Every row carries what routing needs, with ages (not "never measured").
    for key, r in mesh.replicas("n1").items():
        assert r.runtime == "triton" and r.version == "1", key
        assert r.queue == 0 and r.instances >= 1, (key, r.queue, r.instances)
        ages = (r.ready_age, r.queue_age, r.stats_age)  # pushed at every statistics poll (1 s)
        assert all(0 <= age < 10 for age in ages), (key, ages)


# --- 2. a queue rising and falling, pushed and gossiped --------------------------------------


def _infer_delay(url: str) -> None:
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(url)
    try:
        client.infer("delay", delay_inputs(4096, triton_grpc), client_timeout=90)
    finally:
        client.close()


def test_queue_rise_and_fall_reaches_subscriber_and_gossip_views(
        mesh: Mesh, triton_a: TritonServer) -> None:
    a_delay: Key = ("n2", "delay", triton_a.grpc_url)
    b_delay: Key = ("n3", "delay", mesh.b.grpc_url)
    mesh.wait_subscribed()
    mesh.wait_for(lambda: mesh.queue("n1", a_delay) == 0 == mesh.queue("n3", a_delay), SEE,
                  "A's delay queue 0 on n1 and n3")

    seen: list[tuple[float, int, float, str]] = []  # (t, queue, queue_age, via) on n1 changes
    n3_high: list[float] = []  # when n3 first showed queue >= 2

    def n1_queue() -> int:
        r = mesh.replicas("n1", model="delay").get(a_delay)
        if r is None:
            return -1
        if not seen or seen[-1][1] != r.queue:
            seen.append((time.monotonic(), r.queue, r.queue_age, r.via))
        return int(r.queue)

    def n3_queue() -> int:
        q = mesh.queue("n3", a_delay)
        if q >= 2 and not n3_high:
            n3_high.append(time.monotonic())
        return q

    triton_a.set_behaviour("delay", stall=True)
    pool = ThreadPoolExecutor(STALLED_REQUESTS)
    calls: list[Future[None]] = []
    try:
        t0 = time.monotonic()
        # One at a time, so the queue keeps changing for a while.
        for _ in range(STALLED_REQUESTS):
            calls.append(pool.submit(_infer_delay, triton_a.grpc_url))
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                n1_queue()
                n3_queue()
                time.sleep(0.02)
        mesh.wait_for(lambda: n1_queue() >= 2, SEE, "queue >= 2 on n1 (subscribed)")
        mesh.wait_for(lambda: n3_queue() >= 2, SEE, "queue >= 2 on n3 (gossip)", show="n3")
        # Every push reaches the subscriber, however small the step: all requests but the one
        # executing (one instance, no batching) are shown waiting.
        mesh.wait_for(lambda: n1_queue() == STALLED_REQUESTS - 1, SEE,
                      f"queue {STALLED_REQUESTS - 1} on n1")
        t_n1 = next(t for t, q, _, _ in seen if q >= 2) - t0
        print(f"queue >= 2 seen on n1 after {t_n1:.2f} s, on n3 after {n3_high[0] - t0:.2f} s "
              f"(first request at 0, one more every 0.3 s); n1 sightings (queue, age, via): "
              f"{[(q, round(a, 3), v) for _, q, a, v in seen]}")

        # Only the stalled replica queues; the pushed figure was fresh when seen changing.
        view = mesh.replicas("n1")
        assert view[b_delay].queue == 0 and view[b_delay].ready, describe(mesh.state("n1"))
        assert view[a_delay].via == "stream"
        n3_row = mesh.replicas("n3")[a_delay]
        assert n3_row.via == "gossip" and n3_row.ready, n3_row
        rising = [(q, age, via) for _, q, age, via in seen if q >= 1]
        assert rising, seen
        first_q, first_age, first_via = next(s for s in rising if s[0] >= 2)
        assert first_via == "stream", seen
        assert 0 <= first_age < 1.0, f"queue {first_q} seen on n1 with age {first_age:.3f} s"
        assert all(0 <= age < 2.0 for _, age, _ in rising), rising
    finally:
        triton_a.clear_behaviour("delay")
        for call in calls:
            call.result(timeout=90)
        pool.shutdown()

    t1 = time.monotonic()
    mesh.wait_for(lambda: n1_queue() == 0, SEE, "queue back to 0 on n1")
    mesh.wait_for(lambda: mesh.queue("n3", a_delay) == 0, SEE,
                  "queue back to 0 on n3", show="n3")
    print(f"queue 0 again on n1 and n3 {time.monotonic() - t1:.2f} s after the release")
    r = mesh.replicas("n1")[a_delay]
    assert r.ready and 0 <= r.queue_age < 5.0, (r.ready, r.queue_age)


# --- 3. meshctl state ------------------------------------------------------------------------


def _meshctl(mesh: Mesh, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshd.ctl", "--admin", target, "--creds",
                           str(mesh.cluster.admin_creds), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_meshctl_state_of_n2_asked_of_n3(mesh: Mesh) -> None:
    a = mesh.a.grpc_url
    n3 = mesh.cluster.node("n3").admin
    mesh.wait_for(lambda: {(k[1], r.ready, r.queue) for k, r in mesh.replicas(
        "n3", only="n2").items()} == {("add_sub", True, 0), ("delay", True, 0)}, SEE,
        "n3 shows n2's two replicas ready and idle", show="n3")

    r = _meshctl(mesh, n3, "state", "n2", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(n["node"], n["via"]) for n in out["nodes"]] == [("n2", "gossip")], out["nodes"]
    rows = {row["model"]: row for row in out["replicas"]}
    assert set(rows) == set(MODELS), out["replicas"]
    for model, row in rows.items():
        assert row["node"] == "n2" and row["endpoint"] == a, row
        assert row["runtime"] == "triton" and row["ready"] is True and row["via"] == "gossip"
        assert int(row["queue"]) == 0, row
        for age in ("ready_age", "queue_age", "stats_age"):
            assert 0 <= float(row[age]) < 30, (model, age, row)

    r = _meshctl(mesh, n3, "state", "n2")
    assert r.returncode == 0, r.stderr
    node_table, replica_table = r.stdout.strip().split("\n\n")[:2]
    node_rows = [line.split() for line in node_table.splitlines()]
    assert node_rows[0][:3] == ["NODE", "VIA", "AGE"]
    assert [row[:2] for row in node_rows[1:]] == [["n2", "gossip"]], node_table
    header, *lines = replica_table.splitlines()
    cols = header.split()
    assert cols[:7] == ["NODE", "MODEL", "VER", "ENDPOINT", "RUNTIME", "READY", "QUEUE"], header
    assert "AGE(q)" in cols and "AGE(stats)" in cols, header
    table = {c[1]: c for c in (line.split() for line in lines)}
    assert set(table) == set(MODELS), replica_table
    for model, c in table.items():
        assert c[0] == "n2" and c[3] == a and c[4] == "triton" and c[5] == "yes", c
        assert c[6] == "0", c
        for col in ("AGE(q)", "AGE(stats)"):  # e.g. 640ms or 12s; "-" is never measured
            assert re.fullmatch(r"\d+m?s", c[cols.index(col)]), (model, col, c)

    # The model filter narrows the same view.
    r = _meshctl(mesh, n3, "state", "n2", "--model", "delay", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [row["model"] for row in json.loads(r.stdout)["replicas"]] == ["delay"]


# --- 4. a killed Triton ----------------------------------------------------------------------


def test_killed_triton_is_not_ready_on_the_subscriber_and_recovers(
        mesh: Mesh, triton_a: TritonServer) -> None:
    want = expected(mesh)
    a_keys = {k for k, node in want.items() if node == "n2"}
    b_keys = set(want) - a_keys
    mesh.wait_subscribed()
    mesh.wait_for(lambda: all(r.ready for r in mesh.replicas("n1").values()), SEE,
                  "all ready on n1")

    triton_a.kill()
    t0 = time.monotonic()
    mesh.wait_for(lambda: mesh.all_of("n1", a_keys, lambda r: not r.ready), 10,
                  "A's replicas not ready on n1")
    down = time.monotonic() - t0
    view = mesh.replicas("n1")
    print(f"A's replicas not ready on n1 {down:.2f} s after the kill")
    for k in a_keys:
        assert view[k].via == "stream" and view[k].queue == -1, (k, view[k])
    for k in b_keys:  # B is untouched
        assert view[k].ready and view[k].queue == 0, (k, view[k])

    t1 = time.monotonic()
    triton_a.restart(timeout=90)
    restarted = time.monotonic() - t1
    mesh.wait_for(lambda: mesh.all_of("n1", a_keys, lambda r: r.ready and r.queue == 0),
                  RECOVER, "A's replicas ready again on n1")
    print(f"Triton A restarted in {restarted:.1f} s; ready again on n1 "
          f"{time.monotonic() - t1 - restarted:.2f} s after that")
    assert set(mesh.replicas("n1")) == set(want)


# --- 4b. n1 routes: the score API and the KServe router over the live telemetry -------------


def test_n1_scores_and_routes_to_the_real_replicas(mesh: Mesh, triton_a: TritonServer) -> None:
    """n1 (``--role router``) ranks both Tritons' ``delay`` replicas on its score API
    (loopback plaintext) and relays tritonclient calls over mTLS to them, from each of the
    processes sharing its router port (the workers present n1's identity from its data
    directory, and their requests show in n1's metrics)."""
    import numpy as np
    import tritonclient.grpc as tc

    from certs.spiffe import any_node_dns
    from proto.mesh.v1 import score_pb2, score_pb2_grpc
    from testbed.cluster import TRUST_DOMAIN
    from tests.triton import add_sub_inputs

    n1 = mesh.cluster.node("n1")
    # Each target carries its Triton's HTTP address (``http=`` in ``--triton``) once the
    # agent's probe found it answering: soon after a restart of A by an earlier test.
    want_http = {s.grpc_url: f"{s.host}:{s.http_port}" for s in (mesh.a, mesh.b)}
    deadline = time.monotonic() + 10
    with grpc.insecure_channel(n1.score) as ch:
        while True:
            reply = score_pb2_grpc.ScoreStub(ch).ScoreTargets(
                score_pb2.ScoreRequest(model="delay", payload_bytes=64), timeout=5)
            got_http = {t.endpoint: t.http_endpoint for t in reply.targets}
            if got_http == want_http or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert reply.verdict.admit, reply
    assert {t.endpoint for t in reply.targets} == {mesh.a.grpc_url, mesh.b.grpc_url}
    assert all(t.predicted_seconds > 0 for t in reply.targets)
    assert got_http == want_http
    creds = mesh.cluster.admin_creds

    def connect() -> tc.InferenceServerClient:  # a TCP connection of its own
        return tc.InferenceServerClient(
            n1.router, ssl=True, root_certificates=str(creds / "bundle.pem"),
            private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
            channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN)),
                          ("grpc.use_local_subchannel_pool", 1)])
    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    b = np.full((1, 8), 2, dtype=np.float32)
    for client in [connect() for _ in range(12)]:
        for _ in range(2):
            got = client.infer("add_sub", add_sub_inputs(a, b, tc))
            np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(got.as_numpy("OUTPUT1"), a - b)
        assert client.is_model_ready("delay")
    deadline = time.monotonic() + 10  # workers report their counters every second
    while True:
        samples = n1.metrics()
        by_process = {lab["process"]: v for name, lab, v in samples
                      if name == "meshd_router_process_requests_total" and v > 0}
        if metric_sum(samples, "meshd_router_completed_requests_total") >= 24 or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert metric_sum(samples, "meshd_router_completed_requests_total") >= 24, samples
    assert len(by_process) >= 2, by_process  # 12 connections over 3 processes
    link = {lab["kind"]: v for name, lab, v in samples
            if name == "meshd_router_link_messages_total"}
    assert link.get("score", 0) > 0 and link.get("reports", 0) > 0, link  # workers' requests
    assert not link.get("malformed"), link
    with grpc.insecure_channel(n1.router) as ch, pytest.raises(grpc.RpcError):
        ch.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=3)


# --- 5. a large node's changes travel as gossip patches ---------------------------------------

BULK = 40
BULK_ENDPOINT = "127.0.0.3:9000"
PATCHED = 5.0
"""Seconds for a change on a large node to reach a gossip-only peer: a few gossip rounds by
patch (push-pull, the only other gossip path for a section this size, runs every 30 s)."""


def _report(mesh: Mesh, node: str, rows: list[tuple[str, int, bool]]) -> None:
    """Feed ``node`` external replicas ``(model, queue, remove)`` through ReportModelState."""
    identity = Identity.load(mesh.cluster.admin_creds)
    with tls.grpc_channel(mesh.cluster.node(node).admin, identity) as channel:
        ack = state_pb2_grpc.StatePlaneStub(channel).ReportModelState(iter([
            state_pb2.ModelStateDelta(runtime="vllm", endpoint=BULK_ENDPOINT, model=m,
                                      ready=True, queue=q, remove=rm) for m, q, rm in rows]),
            timeout=5)
    assert ack.accepted == len(rows)


def _bulk(mesh: Mesh, observer: str) -> dict[str, int]:
    """The bulk replicas ``observer`` shows, with their queues."""
    resp = mesh.state(observer)
    return {} if resp is None else {r.model: int(r.queue) for r in resp.replicas
                                    if r.endpoint == BULK_ENDPOINT}


def test_a_large_nodes_changes_reach_gossip_only_peers_as_patches(mesh: Mesh) -> None:
    """n3 takes on 40 more replicas (its section outgrows one gossip broadcast several times
    over); n2, which does not subscribe, follows every change by gossip patches.  Runs last:
    the other tests expect exactly the Triton-backed replicas."""
    models = [f"bulk-{i:02d}" for i in range(BULK)]
    def applied() -> float:
        return metric_sum(mesh.cluster.node("n2").metrics(), "meshd_signal_patches_total",
                          outcome="applied")

    before = applied()
    try:
        for i in range(0, BULK, 4):  # an exporter bringing its models up a few at a time
            _report(mesh, "n3", [(m, 0, False) for m in models[i:i + 4]])
            time.sleep(0.7)
        t0 = time.monotonic()
        mesh.wait_for(lambda: len(_bulk(mesh, "n2")) == BULK, 45.0,
                      "n2 sees all of n3's bulk replicas", show="n2")
        print(f"\nall {BULK} replicas on n2 {time.monotonic() - t0:.2f} s after the last report")
        for model, queue in (("bulk-17", 9), ("bulk-31", 6), ("bulk-17", 0)):
            _report(mesh, "n3", [(model, queue, False)])
            t0 = time.monotonic()

            def seen(m: str = model, q: int = queue) -> bool:
                return _bulk(mesh, "n2").get(m) == q

            mesh.wait_for(seen, PATCHED, f"n2 sees {model} queue {queue}", show="n2")
            print(f"{model} queue {queue} on n2 after {time.monotonic() - t0:.2f} s")
        assert applied() > before
    finally:
        for i in range(0, BULK, 8):
            _report(mesh, "n3", [(m, 0, True) for m in models[i:i + 8]])
            time.sleep(0.7)
    mesh.wait_for(lambda: not _bulk(mesh, "n2"), 45.0, "n2 no longer shows them", show="n2")
