"""The data plane off the control plane (issue 27, item 1).

- By default the router's ports are served by worker processes (``--router-workers 1``), not
  by the agent, so a request, however large or malformed, never runs on the event loop that
  gossip, Raft and the admin API share: a flood of large requests leaves the agent's admin
  calls as fast as before (served by the agent itself, ``--router-workers 0``, the same
  flood held them for most of a second each).
- A router process holds a bounded weight of requests in flight (``Inflight``): beyond it a
  request is shed (RESOURCE_EXHAUSTED, HTTP 429, ``shed{reason="memory"}``) before it is
  parsed; a large message of very many small fields is refused before it is parsed.
- Without Unix sockets (Windows) the workers' score link is a loopback TCP port.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from tritonclient.grpc import service_pb2

from meshd.router import server as router_server
from meshd.router.dispatch import Outcome
from meshd.router.scoring import ScoringUnavailable
from meshd.score.scorer import Choice, Scored, ScoreRequest, Status
from meshd.settings import DEFAULT_ROUTER_NICE, Settings, SettingsError, load
from testbed.cluster import TRUST_DOMAIN, Cluster, metric_sum

INFER = "/inference.GRPCInferenceService/ModelInfer"


# --- the budget of requests in flight (in process) ----------------------------------------------


class Held:
    """A Scoring whose ``weights`` wait until ``release`` is set: the requests asking it stay
    in flight.  Then every model is unknown."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0

    async def score(self, req: ScoreRequest) -> Scored:
        raise ScoringUnavailable("not here")

    def report(self, decision_id: int, replica: str, latency: float, status: Status, *,
               hedge: bool = False, last: bool = False) -> None:
        pass

    def report_all(self, outcomes: Sequence[Outcome]) -> None:
        pass

    async def hedge_target(self, decision_id: int, replica: str) -> Choice | None:
        return None

    async def weights(self, model: str, version: str) -> list[tuple[Choice, float]]:
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        return []

    async def models(self) -> dict[tuple[str, str], bool]:
        return {}

    async def want(self, model: str, version: str) -> bool:
        return False  # no model is placed by meshd here: fail at once

    async def repository(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                         peer: str, config: str = "") -> str:
        raise AssertionError("not called")

    async def close(self) -> None:
        pass


class Loop:
    """An event loop in a thread, for servers the test's sync clients call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def held_router() -> Iterator[tuple[Loop, Held, router_server.Inflight, Any, str, str]]:
    """A router over :class:`Held`, both ingresses sharing a 1 MiB budget."""
    lp = Loop()
    scoring = Held()
    inflight = router_server.Inflight(1 << 20)

    async def start() -> tuple[Any, Any, str, Any, str]:
        server, gw, where = await router_server.serve(
            scoring, lp.loop.time, ("127.0.0.1", 0), dev=True, identity=lambda: None,
            inflight=inflight)
        runner, http_where = await router_server.serve_http(gw, ("127.0.0.1", 0),
                                                            ssl_context=None, inflight=inflight)
        return server, gw, where, runner, http_where
    server, gw, where, runner, http_where = lp.call(start())
    try:
        yield lp, scoring, inflight, gw, where, http_where
    finally:
        lp.loop.call_soon_threadsafe(scoring.release.set)
        lp.call(runner.cleanup())
        lp.call(server.stop(0))
        lp.call(gw.close())
        lp.close()


def _infer_bytes(size: int) -> bytes:
    return service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * size]
                                         ).SerializeToString()


def test_a_router_process_sheds_requests_beyond_its_budget_before_parsing_them(
        held_router: tuple[Loop, Held, router_server.Inflight, Any, str, str]) -> None:
    lp, scoring, inflight, gw, where, http_where = held_router
    channel = grpc.insecure_channel(where)
    call = channel.unary_unary(INFER)
    half = _infer_bytes((640 << 10) - 64)  # two fill what small requests may hold
    assert 2 * len(half) <= inflight.small_limit < 2 * len(half) + 4096
    futures = [call.future(half, timeout=30) for _ in range(2)]
    deadline = time.monotonic() + 10
    while scoring.waiting < 2:
        assert time.monotonic() < deadline, "the first two requests never got in flight"
        time.sleep(0.02)
    assert inflight.held == 2 * len(half)
    with pytest.raises(grpc.RpcError) as err:
        call(half, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details().startswith("shed: memory:"), err.value.details()
    assert ("retry-after-ms", "100") in err.value.trailing_metadata()
    # The HTTP ingress shares the budget; it weighs a request by its Content-Length and
    # refuses it without reading the body.

    async def post() -> tuple[int, dict[str, str], str]:
        async with aiohttp.ClientSession() as s, s.post(
                f"http://{http_where}/v2/models/m/infer", data=b"{" * 4096) as r:
            return r.status, dict(r.headers), await r.text()
    status, headers, text = asyncio.run(post())
    assert status == 429 and headers["Retry-After-Ms"] == "100", (status, text)
    assert "shed: memory" in text
    c = gw.counters
    assert c.shed == {"memory": 2} and c.requests == 4, c
    # Answered, the two give their bytes back: a request of any size alone gets through
    lp.loop.call_soon_threadsafe(scoring.release.set)
    for f in futures:
        with pytest.raises(grpc.RpcError) as err:
            f.result()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    deadline = time.monotonic() + 5  # the server's handlers end just after their answers
    while inflight.held:
        assert time.monotonic() < deadline, inflight.held
        time.sleep(0.01)
    assert inflight.peak == 2 * len(half)
    with pytest.raises(grpc.RpcError) as err:
        call(_infer_bytes(3 << 20), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # a large message of very many small fields is refused before it is parsed
    bomb = service_pb2.ModelInferRequest(model_name="m").SerializeToString() + \
        b"\x2a\x00" * (1 << 20)
    with pytest.raises(grpc.RpcError) as err:
        call(bomb, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fields" in err.value.details()
    assert c.invalid == 1 and c.requests == 6 and inflight.held == 0
    channel.close()


def test_a_request_heavier_than_the_budget_passes_alone_and_small_ones_still_pass(
        held_router: tuple[Loop, Held, router_server.Inflight, Any, str, str]) -> None:
    """A large message weighs what parsing it adds (here twice its bytes, over the 1 MiB
    bound): alone it is taken, as the bound; while it is held another large one is shed,
    and small ones still pass within the quarter kept for them."""
    lp, scoring, inflight, gw, where, _ = held_router
    channel = grpc.insecure_channel(where)
    call = channel.unary_unary(INFER)
    large = _infer_bytes(router_server.WEIGH_FROM)
    held = [call.future(large, timeout=30)]
    deadline = time.monotonic() + 10
    while scoring.waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert inflight.held == inflight.limit
    with pytest.raises(grpc.RpcError) as err:
        call(large, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    small = _infer_bytes(100 << 10)
    held.append(call.future(small, timeout=30))
    while scoring.waiting < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert gw.counters.shed == {"memory": 1}
    lp.loop.call_soon_threadsafe(scoring.release.set)
    for f in held:
        with pytest.raises(grpc.RpcError) as err:
            f.result()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    channel.close()


def test_inflight_keeps_a_quarter_of_its_bound_for_small_requests() -> None:
    b = router_server.Inflight(4 << 20)
    big = router_server.WEIGH_FROM
    # large ones up to the bound; small ones a quarter beyond it
    assert b.take(3 * big) and b.take(big + 1) is None and b.take(big - 1)
    assert b.take(big // 2) and b.held == 4 * big + big // 2 - 1
    assert b.take(big // 2 + 2) is None
    b.give(b.held)
    assert b.take(100 << 20) == 4 << 20 and b.held == 4 << 20  # alone: taken, as the bound
    assert b.take(big) is None and b.take(big - 1) == big - 1
    assert b.peak == b.held == 5 * big - 1  # the bound and its quarter


def test_parsed_weight_counts_what_parsing_adds_and_refuses_field_bombs() -> None:
    big = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[b"x" * (4 << 20)])
    t = big.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    t.parameters["p"].int64_param = 3
    raw = big.SerializeToString()
    w = router_server.parsed_weight(raw)
    assert 2 * len(raw) < w < 2 * len(raw) + 16 * router_server.ELEMENT
    # a packed int64 array of one-byte varints: eight bytes each, parsed
    shape = service_pb2.ModelInferRequest(model_name="m")
    shape.inputs.add(name="x", shape=[1] * (1 << 20))
    raw = shape.SerializeToString()
    assert router_server.parsed_weight(raw) >= 8 << 20
    with pytest.raises(router_server.TooManyFields):
        router_server.parsed_weight(b"\x2a\x00" * (router_server.MAX_ELEMENTS + 1))
    assert router_server.parsed_weight(os.urandom(1 << 16)) >= 1 << 16  # whatever it reads as
    assert router_server.parsed_weight(b"\x2a\xff\xff\xff\x0f") == 5  # truncated: its bytes
    # HTTP: JSON weighs more than binary tensor data
    assert router_server.http_weight(1 << 20, None) == router_server.JSON_FACTOR << 20
    assert router_server.http_weight(1 << 20, "100") == (1 << 20) + \
        (router_server.JSON_FACTOR - 1) * 100


def test_settings_default_to_one_worker_and_take_zero_for_the_agent_itself() -> None:
    assert Settings().router_workers == 1
    assert Settings().router_nice == DEFAULT_ROUTER_NICE > 0
    assert load(["--node", "a", "--router-nice", "0"], {}).router_nice == 0
    with pytest.raises(SettingsError, match="router_nice"):
        load(["--node", "a", "--router-nice", "20"], {})
    assert load(["--node", "a", "--role", "router", "--router-workers", "0"], {}
                ).router_workers == 0
    assert load(["--node", "a", "--router-inflight-mib", "128"], {}).router_inflight_mib == 128
    with pytest.raises(SettingsError, match="router_inflight_mib"):
        load(["--node", "a", "--router-inflight-mib", "8"], {})
    with pytest.raises(SettingsError, match="router_workers"):
        load(["--node", "a", "--router-workers", "-1"], {})


def test_the_score_link_works_over_loopback_tcp() -> None:
    """Where asyncio has no Unix sockets the workers reach the agent on a loopback port."""
    from meshd.router.remote_scoring import RemoteScoring
    from meshd.score import link as score_link
    from meshd.score.scorer import Scorer
    from meshd.signals.fused import FusedState

    async def run() -> None:
        loop = asyncio.get_running_loop()
        scorer = Scorer(FusedState("r"))
        server, counts, where = await score_link.serve_loopback(scorer, loop.time)
        assert where.startswith("tcp:127.0.0.1:")
        remote = RemoteScoring("127.0.0.1:1", where)
        try:
            scored = await remote.score(ScoreRequest("nothing-here", payload_bytes=10))
            assert not scored.verdict.admit and scored.verdict.reason == "no_targets"
            remote.report(scored.decision_id, "", 0.0, Status.ERROR, last=True)
            await remote.score(ScoreRequest("nothing-here"))  # carries the report ahead
            assert counts["score"] == 2 and counts["reports"] == 1
            assert not remote._pending or all(f.done() for _, _, f, _ in remote._pending)
        finally:
            await remote.close()
            server.close()
    asyncio.run(run())


# --- the agent and its worker (processes) -------------------------------------------------------


def _flood(target: str, creds: str, seconds: float, size: int) -> None:
    """Large ModelInfer requests (``size`` bytes of tensor data, to a model nobody serves),
    one at a time over mTLS, for ``seconds``: each must be received, parsed and refused by
    whichever process serves the router port.  A process of its own, so its CPU and GIL are
    not the test's."""
    from certs.spiffe import any_node_dns

    os.nice(10)  # the node's processes first, as if the clients were elsewhere
    d = Path(creds)
    cc = grpc.ssl_channel_credentials((d / "bundle.pem").read_bytes(),
                                      (d / "key.pem").read_bytes(),
                                      (d / "cert.pem").read_bytes())
    ch = grpc.secure_channel(target, cc, options=[
        ("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN)),
        ("grpc.max_send_message_length", -1)])
    call = ch.unary_unary(INFER)
    big = _infer_bytes(size)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            call(big, timeout=10)
        except grpc.RpcError:
            pass


def _admin_latencies(node: Any, seconds: float) -> list[float]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        node.members(timeout=10)
        out.append(time.perf_counter() - t0)
        time.sleep(0.02)
    return out


@pytest.fixture
def router_node(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(1, tmp_path / "mesh", node_args=lambda i: ["--role", "router", "--gpu", "off"])
    try:
        yield c
    finally:
        c.close()


def _worker_pids(agent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == agent and b"meshd.router.worker" in cmd:
            pids.append(int(entry.name))
    return pids


def _served(node: Any, timeout: float = 30) -> None:
    """Until the router port answers ServerLive (its worker is up)."""
    from certs import tls
    from certs.identity import Identity
    from certs.spiffe import any_node_dns

    ident = Identity.load(node.cluster.admin_creds)
    deadline = time.monotonic() + timeout
    while True:
        ch = tls.grpc_channel(node.router, ident, options=[
            ("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
        try:
            ch.unary_unary("/inference.GRPCInferenceService/ServerLive")(
                service_pb2.ServerLiveRequest().SerializeToString(), timeout=2)
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the router port never answered"
            time.sleep(0.2)
        finally:
            ch.close()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_router_runs_in_a_worker_and_a_flood_of_large_requests_leaves_admin_calls_fast(
        router_node: Cluster) -> None:
    c = router_node
    c.start()
    node = c.seed
    _served(node)
    (worker,) = _worker_pids(node.pid)
    # The worker yields the CPU to the agent: under saturation gossip, Raft and admin run
    # first (--router-nice, default 5).
    assert (os.getpriority(os.PRIO_PROCESS, worker)
            == os.getpriority(os.PRIO_PROCESS, node.pid) + DEFAULT_ROUTER_NICE)
    # The agent serves no router port: the worker does (its life is in the metrics).
    mp = multiprocessing.get_context("spawn")
    flood = [mp.Process(target=_flood, args=(node.router, str(c.admin_creds), 6.0, 48 << 20))
             for _ in range(2)]
    before = _admin_latencies(node, 2.0)
    for p in flood:
        p.start()
    time.sleep(1.0)  # the flood under way
    during = _admin_latencies(node, 4.0)
    for p in flood:
        p.join(30)
    p50_before, p50_during = statistics.median(before), statistics.median(during)
    slow = sum(1 for x in during if x > 0.1)
    # The agent serving the router itself: each 48 MiB request held its loop, and admin
    # calls took a median of 0.3-0.8 s under this flood.
    assert p50_during < max(0.02, 5 * p50_before), (p50_before, sorted(during)[-5:])
    assert slow <= len(during) // 10, sorted(during)[-10:]
    samples = node.metrics()
    processes = {lab["process"]: v for name, lab, v in samples
                 if name == "meshd_router_process_requests_total"}
    assert "agent" not in processes and processes, processes
    assert all(p.split("/")[1] != str(node.pid) for p in processes), processes
    deadline = time.monotonic() + 5  # workers report every second
    while metric_sum(node.metrics(), "meshd_router_requests_total") < 4:
        assert time.monotonic() < deadline, node.metrics()
        time.sleep(0.3)
    # A worker that dies is restarted; the agent goes on.
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not [p for p in _worker_pids(node.pid) if p != worker]:
        assert time.monotonic() < deadline, "the worker was not restarted"
        time.sleep(0.2)
    _served(node)
    assert node.members(timeout=5)[node.name].status == "alive"
    assert c.events("router_worker_exited")


def test_a_router_port_in_use_fails_the_agent_at_start(tmp_path: Path) -> None:
    """The ports are checked free by the agent, as its own listener once was: a port held by
    another program fails the start instead of a worker restarting forever."""
    c = Cluster(1, tmp_path / "mesh", node_args=lambda i: ["--role", "router", "--gpu", "off"])
    node = c.seed
    with socket.socket() as s:
        s.bind((node.ip, node.router_port))
        s.listen()
        try:
            node.start()
            assert node.wait(30) == 1, c.tail(node)
            assert any("cannot bind the router" in str(e.get("detail", ""))
                       for e in node.events("start_failed")), c.tail(node)
        finally:
            c.close()


def test_the_agent_does_not_load_the_router_ingress_it_leaves_to_its_workers() -> None:
    """tritonclient, numpy and aiohttp are about 30 MB of an idle agent's 100 (measured in
    ``bench/gossip_procs --full``); by default only the router workers need them."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import sys, meshd.agent, meshd.cli; print(' '.join(sorted("
         "{m.split('.')[0] for m in sys.modules} & {'numpy', 'tritonclient', 'aiohttp'})))"],
        capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", out.stdout
