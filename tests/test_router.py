"""The router against real Triton servers: tritonclient through the router gets what it gets
directly; slow, stalled, killed and drained replicas are routed around; overload is shed.

The router runs in-process (its asyncio loop in a thread) over a real scorer whose fused view
lists the real servers; the tests drive it with tritonclient's own sync client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from adapters.model import ReplicaState
from certs import tls
from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId, any_node_dns
from meshd.dev.ports import free_port
from meshd.dev.triton import TritonServer
from meshd.router import server as router_server
from meshd.router.auth import token_hash
from meshd.router.scoring import LocalScoring
from meshd.score.limiter import LimiterConfig
from meshd.score.scorer import Scorer
from meshd.signals.fused import FusedState
from meshd.signals.wire import NodeSignals
from policy.model import validate as validate_policy
from tests.triton import add_sub_inputs

MODELS = ("add_sub", "delay")


class RouterHarness:
    """A router over a fused view of real Triton servers, each on its own node."""

    def __init__(self, servers: list[TritonServer], *, limiter: LimiterConfig | None = None,
                 tokens_file: str = "", models: tuple[str, ...] = MODELS,
                 spu: tuple[float, ...] = (), http: bool = False) -> None:
        self.servers = servers
        self.http = http
        """Replicas advertise their Triton's HTTP address (the adapter's ``http=``): the
        HTTP ingress forwards to it instead of converting to gRPC."""
        self.http_addrs: dict[int, str] = {}
        """Advertised HTTP addresses other than the servers' own, by server index."""
        self.models = models
        self.spu = spu
        """Seconds per work unit each server reports (default 2 ms each)."""
        self.flags: dict[str, list[str]] = {}
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fused = FusedState("router", lambda n: self.flags.get(n, []))
        self.scorer = Scorer(self.fused, policy=lambda k, n: self.docs.get((k, n)),
                             policy_version=lambda: self.version, limiter=limiter)
        self.seq = 0
        self.refresh()
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()
        self.server, self.router, self.addr = self.call(router_server.serve(
            LocalScoring(self.scorer, self.loop.time), self.loop.time, ("127.0.0.1", 0),
            dev=not tokens_file,
            identity=lambda: None, tokens_file=tokens_file))

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def node_of(self, server: TritonServer) -> str:
        return f"node-{self.servers.index(server)}"

    def refresh(self) -> None:
        """Telemetry as the Triton adapter would publish it: ready, queue figures fresh."""
        def update() -> None:
            now = self.loop.time()
            for i, server in enumerate(self.servers):
                self.seq += 1
                spu = self.spu[i] if i < len(self.spu) else 0.002
                http = self.http_addrs.get(i, server.http_url.removeprefix("http://")) \
                    if self.http else ""
                reps = [ReplicaState(model=m, version="1", endpoint=server.grpc_url,
                                     ready=True, queue=0, spu=spu, http=http,
                                     at={"ready": now, "queue": now, "stats": now})
                        for m in self.models]
                self.fused.update(self.node_of(server), NodeSignals(1, self.seq, reps),
                                  "gossip", now)
        self.loop.call_soon_threadsafe(update)

    def _feed(self) -> None:
        while not self._stop.wait(0.5):
            self.refresh()

    def put(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        def apply() -> None:
            self.docs[(kind, name)] = validate_policy(
                {"kind": kind, "name": name, "spec": spec}).spec
            self.version += 1
        self.loop.call_soon_threadsafe(apply)

    def set_flags(self, node: str, flags: list[str]) -> None:
        def apply() -> None:
            self.flags[node] = flags
            self.version += 1
        self.loop.call_soon_threadsafe(apply)

    def close(self) -> None:
        self._stop.set()
        self.call(self.server.stop(1))
        self.call(self.router.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def two(triton_factory: Any) -> Iterator[tuple[RouterHarness, list[TritonServer]]]:
    servers = triton_factory(2)
    h = RouterHarness(servers)
    try:
        yield h, servers
    finally:
        h.close()


def add_sub(client: tc.InferenceServerClient, n: int = 16, **kw: Any) -> Any:
    a = np.arange(n, dtype=np.float32).reshape(1, n)
    b = np.ones((1, n), dtype=np.float32)
    return client.infer("add_sub", add_sub_inputs(a, b, tc), **kw)


def delay(client: tc.InferenceServerClient, nbytes: int = 64, **kw: Any) -> Any:
    inp = tc.InferInput("PAYLOAD", [nbytes // 4], "FP32")
    inp.set_data_from_numpy(np.zeros(nbytes // 4, dtype=np.float32))
    return client.infer("delay", [inp], **kw)


def until(check: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def served(server: TritonServer, model: str = "delay") -> int:
    """Successful inferences ``server`` has run for ``model``."""
    stats = tc.InferenceServerClient(server.grpc_url).get_inference_statistics(model)
    return sum(s.inference_stats.success.count for s in stats.model_stats)


def test_tritonclient_through_the_router_gets_what_it_gets_directly(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    via = tc.InferenceServerClient(h.addr)
    direct = tc.InferenceServerClient(servers[0].grpc_url)
    for n in (1, 16, 1000):
        got, want = add_sub(via, n), add_sub(direct, n)
        for out in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(got.as_numpy(out), want.as_numpy(out))
    assert via.is_server_live() and via.is_server_ready()
    assert via.is_model_ready("add_sub") and not via.is_model_ready("nope")
    meta = via.get_model_metadata("add_sub", as_json=True)
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    cfg = via.get_model_config("delay", as_json=True)["config"]
    assert cfg["name"] == "delay"
    index = via.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["state"]) for m in index} == {("add_sub", "READY"),
                                                       ("delay", "READY")}
    fleet, one = via.get_server_metadata(as_json=True), direct.get_server_metadata(as_json=True)
    assert (fleet["name"], fleet["version"]) in {
        (m["name"], m["version"]) for m in (
            tc.InferenceServerClient(s.grpc_url).get_server_metadata(as_json=True)
            for s in servers)}
    assert "sequence" in fleet["extensions"] and "statistics" in fleet["extensions"]
    assert set(fleet["extensions"]) <= set(one["extensions"])


def test_a_bad_request_is_rejected_naming_the_tensor_without_calling_triton(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    via = tc.InferenceServerClient(h.addr)
    add_sub(via)  # the router now holds add_sub's config
    time.sleep(0.5)  # (and a hedge of that first request, if one went, has landed)
    before = [served(s, "add_sub") for s in servers]
    inputs = add_sub_inputs(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32), tc)
    bad = tc.InferInput("INPUT1", [1, 4], "FP64")
    bad.set_data_from_numpy(np.zeros((1, 4), np.float64))
    with pytest.raises(InferenceServerException) as err:
        via.infer("add_sub", [inputs[0], bad])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT1" in err.value.message() and "FP64" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        via.infer("add_sub", [inputs[0]])
    assert "INPUT1" in err.value.message()
    assert [served(s, "add_sub") for s in servers] == before


def test_every_request_ends_once_in_the_lifecycle_counts_and_latency_is_timed(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """Received = completed + failed + shed + invalid + cancelled once every request ended
    (so the in-flight gauge goes back to 0); answered requests are timed per model and per
    (model, target node)."""
    h, servers = two
    servers[0].set_behaviour("delay", delay_ms=400)
    servers[1].set_behaviour("delay", delay_ms=400)
    via = tc.InferenceServerClient(h.addr)
    for n in (1, 4, 16):
        add_sub(via, n)
    with pytest.raises(InferenceServerException):
        via.infer("add_sub", [tc.InferInput("INPUT0", [1, 4], "FP64")])  # invalid
    with pytest.raises(InferenceServerException):
        delay(via, client_timeout=0.1)  # the client gives up: failed or cancelled
    c = h.router.counters
    until(lambda: c.inflight() == 0 and c.requests == 5, 10)
    ended = c.completed + c.invalid + c.cancelled + sum(c.failed.values()) + sum(c.shed.values())
    assert ended == c.requests == 5 and c.completed == 3 and c.admitted >= 4, c
    until(lambda: "add_sub" in h.scorer.counters.requests, 5)
    assert h.scorer.counters.requests["add_sub"].count == 3
    timed = {key: t.count for key, t in h.scorer.counters.attempts.items()}
    assert sum(n for (model, _), n in timed.items() if model == "add_sub") >= 3
    assert {node for _, node in timed} <= {h.node_of(s) for s in servers}


def test_a_slow_replica_gets_less_traffic(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    servers[1].set_behaviour("delay", delay_ms=25)
    via = tc.InferenceServerClient(h.addr)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: delay(via), range(240)))
    fast, slow = served(servers[0]), served(servers[1])
    assert 240 <= fast + slow <= 240 * 1.05 + 10  # hedges within their budget
    assert slow < 0.25 * 240, (fast, slow)


def test_a_stalled_replica_is_hedged_around(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    h.put("SloClass", "hedged", {"deadline_ms": 5000, "hedge_after_ms": 50})
    h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr", "hedge_budget": 1.0})
    servers[1].set_behaviour("delay", stall=True)
    via = tc.InferenceServerClient(h.addr)
    took = []
    for _ in range(10):
        t0 = time.monotonic()
        delay(via, headers={"x-meshd-slo": "hedged"})
        took.append(time.monotonic() - t0)
    servers[1].clear_behaviour()
    assert max(took) < 1.0, took  # a stall lasts 60 s; the hedge answered
    assert h.router.counters.hedged >= 4 and h.router.counters.hedge_won >= 4


def test_a_killed_replica_fails_over_with_no_failed_request(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    # Round robin, so the dead replica keeps being chosen: it must be routed around every time.
    h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr"})
    via = tc.InferenceServerClient(h.addr)
    for _ in range(10):
        delay(via)
    c = h.router.counters
    before = c.failovers + c.hedged
    servers[1].kill()
    errors = []
    for _ in range(60):
        try:
            delay(via, client_timeout=5)
        except InferenceServerException as exc:
            errors.append(exc)
    assert errors == []
    # Routed around by a failover, or by a hedge that was already in flight when it failed.
    assert c.failovers + c.hedged - before >= 10, c


def test_a_request_the_model_refuses_is_not_run_on_every_replica(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """Inputs whose shapes disagree pass validation (add_sub's dims are [-1]) and the model
    refuses them with INTERNAL: Triton's words go back at once, from one replica."""
    h, servers = two
    h.put("RoutingPolicy", "add_sub", {"strategy": "baseline_rr"})
    via = tc.InferenceServerClient(h.addr)
    add_sub(via)
    time.sleep(0.5)
    c = h.router.counters
    before = (sum(served(s, "add_sub") for s in servers), c.failovers, c.hedged)
    a = tc.InferInput("INPUT0", [1, 4], "FP32")
    a.set_data_from_numpy(np.zeros((1, 4), np.float32))
    b = tc.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.zeros((1, 16), np.float32))
    for _ in range(6):
        with pytest.raises(InferenceServerException) as err:
            via.infer("add_sub", [a, b])
        assert err.value.status() == "StatusCode.INTERNAL"
        assert err.value.message() == "INPUT0 shape (1, 4) != INPUT1 shape (1, 16)"
    ran = sum(served(s, "add_sub") for s in servers) - before[0]  # error answers count here
    assert (ran, c.failovers - before[1]) == (6 + c.hedged - before[2], 0)


def test_a_replica_whose_backend_fails_is_failed_over(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr"})
    servers[1].set_behaviour("delay", fail=True)
    via = tc.InferenceServerClient(h.addr)
    c = h.router.counters
    before = c.failovers
    for _ in range(10):
        delay(via, client_timeout=10)  # none fails: the broken replica's INTERNAL is its own
    assert c.failovers - before >= 3, c


def test_overload_is_shed_with_retry_after_not_timeouts(triton_factory: Any) -> None:
    servers = triton_factory(1)
    h = RouterHarness(servers, limiter=LimiterConfig(initial=2, min_limit=2, max_limit=2))
    try:
        servers[0].set_behaviour("delay", delay_ms=300)
        via = tc.InferenceServerClient(h.addr)
        outcomes: list[str] = []

        def one(_: int) -> None:
            try:
                delay(via, client_timeout=10)
                outcomes.append("ok")
            except InferenceServerException as exc:
                outcomes.append(exc.status())
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
        assert time.monotonic() - t0 < 5
        assert outcomes.count("ok") >= 1
        shed = [o for o in outcomes if o != "ok"]
        assert shed and set(shed) == {"StatusCode.RESOURCE_EXHAUSTED"}, outcomes
    finally:
        h.close()


def test_a_deadline_no_replica_can_meet_is_deadline_exceeded_with_no_retry_hint(
        triton_factory: Any) -> None:
    servers = triton_factory(1)
    h = RouterHarness(servers, spu=(1.0,))  # a second per work unit: nothing answers in 50 ms
    try:
        raw = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[
            np.zeros((1, 4), np.float32).tobytes()] * 2)
        for name in ("INPUT0", "INPUT1"):
            raw.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        with grpc.insecure_channel(h.addr) as ch:
            infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=service_pb2.ModelInferRequest.
                                   SerializeToString,
                                   response_deserializer=service_pb2.ModelInferResponse.FromString)
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                infer(raw, timeout=0.5)
        assert time.monotonic() - t0 < 0.4  # refused at once, not timed out
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline" in (err.value.details() or "")
        assert not [k for k, _ in err.value.trailing_metadata() or () if k == "retry-after-ms"]
        assert h.router.counters.shed.get("deadline") == 1
    finally:
        h.close()


def test_a_message_over_the_payload_limit_is_refused_before_it_is_parsed(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """gRPC's receive limit is validation's (64 MiB of inputs) plus headroom, so an oversized
    request is refused by gRPC itself: never parsed, never counted, never sent to a
    replica."""
    from meshd.router.gateway import MAX_PAYLOAD, MESSAGE_HEADROOM

    h, servers = two
    big = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[
        bytes(MAX_PAYLOAD + MESSAGE_HEADROOM + 1)]).SerializeToString()
    with grpc.insecure_channel(h.addr, options=[
            ("grpc.max_send_message_length", len(big) + 1024)]) as ch:
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            infer(big, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (err.value.details() or "")
        fits = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[
            bytes(MAX_PAYLOAD + 1)])
        for name in ("INPUT0", "INPUT1"):
            fits.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        with pytest.raises(grpc.RpcError) as err:  # received, then refused by validation
            infer(fits.SerializeToString(), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert h.router.counters.requests == 1 and h.router.counters.invalid == 1


def test_a_draining_node_takes_nothing_new_and_finishes_what_it_has(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr"})
    h.put("SloClass", "no-hedge", {"deadline_ms": 10_000, "hedging": False})
    servers[0].set_behaviour("delay", delay_ms=600)
    via = tc.InferenceServerClient(h.addr)
    no_hedge = {"x-meshd-slo": "no-hedge"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # one lands on each node
        inflight = [pool.submit(delay, via, headers=no_hedge) for _ in range(2)]
        time.sleep(0.2)
        h.set_flags(h.node_of(servers[0]), ["draining"])
        time.sleep(0.05)
        before = served(servers[0])
        for _ in range(20):
            delay(via, headers=no_hedge)
        for f in inflight:
            f.result(timeout=10)  # the drained node finished what it had (none failed)
    # Nothing new went to the drained node: at most the one request it held when drained
    # (round robin sends the first two one to each node, unless a loaded machine delays the
    # first node's telemetry), and every request was served.
    assert served(servers[0]) - before <= 1 and served(servers[0]) <= 1
    assert served(servers[0]) + served(servers[1]) == 22


def test_stream_infer_sticks_to_one_replica(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    h, servers = two
    via = tc.InferenceServerClient(h.addr)
    results: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append(error or result)
        if len(results) == 5:
            done.set()
    via.start_stream(callback)
    for i in range(5):
        inp = tc.InferInput("PAYLOAD", [i + 1], "FP32")
        inp.set_data_from_numpy(np.zeros(i + 1, dtype=np.float32))
        via.async_stream_infer("delay", [inp])
    assert done.wait(10)
    via.stop_stream()
    assert [int(r.as_numpy("NBYTES")[0]) for r in results] == [4, 8, 12, 16, 20]
    assert sorted(served(s) for s in servers) == [0, 5]


def test_bearer_tokens_decide_the_tenant(triton_factory: Any, tmp_path: Any) -> None:
    """Outside dev mode the ingress is TLS; here we check the token logic on a TLS-less
    handler by calling it with and without a token (the TLS handshake is certs' tests')."""
    from meshd.router.auth import ClientAuth, Unauthenticated, load_tokens
    path = tmp_path / "tokens"
    path.write_text(f"# tenant sha256\nteam-a {token_hash('s3cret')}\n")
    auth = ClientAuth(dev=False, tokens=load_tokens(path))

    class NoCert:
        def auth_context(self) -> dict[str, list[bytes]]:
            return {}
    ctx: Any = NoCert()
    assert auth.tenant({"authorization": "Bearer s3cret", "x-meshd-tenant": "b"}, ctx) == \
        "team-a"
    for md in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic x"},
               {"x-meshd-tenant": "team-a"}):
        with pytest.raises(Unauthenticated):
            auth.tenant(md, ctx)


def _live(channel: grpc.Channel, metadata: Any = None) -> bool:
    call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=service_pb2.ServerLiveResponse.FromString)
    return bool(call(service_pb2.ServerLiveRequest(), timeout=5, metadata=metadata).live)


def test_outside_dev_clients_need_a_certificate_or_a_token(tmp_path: Any) -> None:
    """A router started without --dev speaks TLS only; with a token file, a client without a
    certificate gets in with a token and not without one."""
    td = "mesh.test"
    ca = CertificateAuthority.create(td)
    node = ca.mint(SpiffeId.node(td, "r1"), ["node"])
    client = ca.mint(SpiffeId.node(td, "c1"), ["node"])
    tokens = tmp_path / "tokens"
    tokens.write_text(f"team-a {token_hash('s3cret')}\n")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)
    scorer = Scorer(FusedState("r1"))
    servers = []
    try:
        scoring = LocalScoring(scorer, loop.time)
        mtls_only = run(router_server.serve(scoring, loop.time, ("127.0.0.1", 0), dev=False,
                                            identity=lambda: node))
        with_tokens = run(router_server.serve(scoring, loop.time, ("127.0.0.1", 0), dev=False,
                                              identity=lambda: node, tokens_file=str(tokens)))
        servers = [mtls_only[0], with_tokens[0]]
        for _, _, addr in (mtls_only, with_tokens):
            with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError):
                _live(ch)  # plaintext: no
        with tls.grpc_channel(mtls_only[2], client) as ch:
            assert _live(ch)  # a mesh client certificate: yes
        creds = grpc.ssl_channel_credentials(root_certificates=node.bundle_pem())
        opts = [("grpc.ssl_target_name_override", any_node_dns(td))]
        with grpc.secure_channel(with_tokens[2], creds, options=opts) as ch:
            assert _live(ch, [("authorization", "Bearer s3cret")])
            with pytest.raises(grpc.RpcError) as err:
                _live(ch)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.secure_channel(mtls_only[2], creds, options=opts) as ch, \
                pytest.raises(grpc.RpcError):
            _live(ch, [("authorization", "Bearer s3cret")])  # no certificate: no handshake
    finally:
        for srv in servers:
            run(srv.stop(0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_the_client_library_calls_the_chosen_triton_directly(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """meshd.score.client asks the agent's score API and calls Triton itself: same outputs as
    direct, traffic away from a slow replica, failover when one dies - in both modes."""
    from meshd.score import service as score_api
    from meshd.score.client import MeshClient
    h, servers = two
    server, where = h.call(score_api.serve(h.scorer, h.loop.time, ("127.0.0.1", 0),
                                           lambda: None))
    try:
        servers[1].set_behaviour("delay", delay_ms=25)
        for mode in ("watch", "score"):
            client = MeshClient(where, mode=mode)
            try:
                a = np.arange(4, dtype=np.float32).reshape(1, 4)
                got = client.infer("add_sub", add_sub_inputs(a, a, tc))
                np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), a + a)
                inp = tc.InferInput("PAYLOAD", [16], "FP32")
                inp.set_data_from_numpy(np.zeros(16, dtype=np.float32))
                for _ in range(20):  # the agent learns the replicas' latencies
                    client.infer("delay", [inp])
                time.sleep(0.3)  # (reports are sent without waiting; weights follow)
                before = [served(s) for s in servers]
                for _ in range(60):
                    client.infer("delay", [inp])
                fast, slow = (served(s) - b for s, b in zip(servers, before, strict=True))
                assert fast + slow >= 60 and slow < 20, (mode, fast, slow)
            finally:
                client.close()
        servers[0].kill()
        client = MeshClient(where, mode="watch")
        try:
            inp = tc.InferInput("PAYLOAD", [16], "FP32")
            inp.set_data_from_numpy(np.zeros(16, dtype=np.float32))
            for _ in range(10):
                assert int(client.infer("delay", [inp]).as_numpy("NBYTES")[0]) == 64
        finally:
            client.close()
    finally:
        h.call(server.stop(0))


def test_the_client_library_reports_every_outcome(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """The library's outcomes reach the agent over its batched report stream, every one, the
    last batch at close: each decision the agent made is closed (score mode), and the
    agent counts as many outcomes as requests were made (watch mode too)."""
    from meshd.score import service as score_api
    from meshd.score.client import MeshClient
    h, _ = two
    server, where = h.call(score_api.serve(h.scorer, h.loop.time, ("127.0.0.1", 0),
                                           lambda: None))
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    try:
        for mode in ("watch", "score"):
            before = sum(h.scorer.counters.outcomes.values())
            client = MeshClient(where, mode=mode)
            try:
                for _ in range(50):
                    client.infer("add_sub", add_sub_inputs(a, a, tc))
            finally:
                client.close()
            assert sum(h.scorer.counters.outcomes.values()) - before == 50, mode
        assert len(h.scorer.decisions) == 0  # every score-mode decision closed
    finally:
        h.call(server.stop(0))


def test_worker_processes_share_the_port_and_route_on_the_agents_scorer(
        two: tuple[RouterHarness, list[TritonServer]]) -> None:
    """``--router-workers``: worker processes bind one port (SO_REUSEPORT), score through the
    agent's score API on a Unix socket, report every outcome back (each decision closes) and
    their counters; a killed worker is restarted; stopping the pool stops them all."""
    import os
    import shutil
    import signal
    import tempfile

    from meshd.router.counters import WorkerCounters
    from meshd.router.pool import WorkerPool
    from meshd.score import link as score_link
    from meshd.score import service as score_api

    h, servers = two
    d = tempfile.mkdtemp(prefix="meshd-w-")
    counters = WorkerCounters()
    score, where = h.call(score_api.serve(h.scorer, h.loop.time, f"{d}/score.sock",
                                          lambda: None, counters))
    link, link_counts = h.call(score_link.serve(h.scorer, h.loop.time, f"{d}/link.sock"))
    addr = f"127.0.0.1:{free_port()}"
    from meshd.router.auth import token_hash
    with open(f"{d}/tokens", "w") as f:
        f.write(f"# tenant sha256(token)\nteam-a {token_hash('tok-a')}\n")
    pool = WorkerPool(2, ["--score", where, "--link", f"{d}/link.sock", "--router", addr,
                          "--data", d, "--node", "w", "--dev", "--log-level", "warning",
                          "--tokens", f"{d}/tokens"])
    h.call(pool.start())
    survivors: list[int] = []

    def connect() -> tc.InferenceServerClient:  # a connection of its own
        return tc.InferenceServerClient(addr, channel_args=[("grpc.use_local_subchannel_pool",
                                                             1)])

    def live() -> bool:
        try:
            return bool(connect().is_server_live())
        except InferenceServerException:
            return False
    try:
        until(lambda: len(pool.pids()) == 2 and live())
        time.sleep(1.0)  # both workers listening
        clients = [connect() for _ in range(12)]
        for c in clients:
            for _ in range(3):
                got = add_sub(c, 4)
                np.testing.assert_array_equal(got.as_numpy("OUTPUT0"),
                                              np.arange(4, dtype=np.float32).reshape(1, 4) + 1)
        c = clients[0]
        assert c.is_server_ready() and c.is_model_ready("add_sub") and not c.is_model_ready("x")
        index = c.get_model_repository_index(as_json=True)
        assert {m["name"] for m in index["models"]} >= {"add_sub", "delay"}
        with pytest.raises(InferenceServerException) as err:
            c.infer("add_sub", [add_sub_inputs(np.zeros((1, 4), np.float32),
                                               np.zeros((1, 4), np.float32), tc)[0]])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        # every outcome reached the agent: each decision is closed, none left to expire
        until(lambda: not h.scorer.decisions and h.scorer.counters.outcomes["OK"] >= 36)
        until(lambda: counters.total().completed >= 36)
        served_by = [w for w, n in counters.lives.items() if n.requests]
        assert len(served_by) == 2, dict(counters.lives)
        assert counters.total().invalid == 1
        assert link_counts["score"] >= 36 and link_counts["reports"] >= 36
        assert not link_counts["malformed"]
        # the workers load the agent's token file: a token names the tenant, a wrong one is
        # refused by whichever process the connection reached
        decided = h.scorer.counters.decisions.total()
        for c in [connect() for _ in range(6)]:
            add_sub(c, 4, headers={"authorization": "Bearer tok-a"})
            with pytest.raises(InferenceServerException) as err:
                add_sub(c, 4, headers={"authorization": "Bearer wrong"})
            assert err.value.status() == "StatusCode.UNAUTHENTICATED"
            assert "unknown bearer token" in str(err.value)
        assert h.scorer.counters.decisions.total() - decided == 6  # refused before scoring

        killed = pool.pids()[0]
        os.kill(killed, signal.SIGKILL)
        until(lambda: pool.restarts == 1 and len(pool.pids()) == 2 and killed not in pool.pids())
        until(live)
        for c in [connect() for _ in range(4)]:
            add_sub(c)
        # a signal to the agent's process group reaches the workers too: once the agent is
        # closing, their exits are not crashes to restart
        pool.closing()
        survivors = pool.pids()
        for pid in survivors:
            os.kill(pid, signal.SIGTERM)
        until(lambda: not pool.pids())
        time.sleep(1.5)  # past the first restart backoff
        assert pool.restarts == 1 and not pool.pids()
    finally:
        pids = pool.pids()
        h.call(pool.stop(2))
        h.call(score.stop(0))
        link.close()
        shutil.rmtree(d, ignore_errors=True)
    assert not pool.pids()
    for pid in pids + survivors:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
