"""The Triton adapter against real Triton servers: discovery and config, queue depth rising
under load and falling after, statistics turning into rates and SPU, a killed server marked
not ready within two polls and recovered, model load/unload seen, the HTTP address advertised
only while Triton's HTTP endpoint answers."""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from adapters.model import ReplicaState
from adapters.triton import EndpointError, TritonAdapter, TritonEndpoint
from meshd.dev.ports import free_port
from meshd.dev.triton import TritonServer
from tests.triton import TritonFactory, delay_inputs


def endpoint(server: TritonServer) -> TritonEndpoint:
    return TritonEndpoint.parse(server.meshd_spec)


def http_addr(server: TritonServer) -> str:
    return f"{server.host}:{server.http_port}"


async def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_discovery_queue_and_statistics(triton_server: TritonServer) -> None:
    import tritonclient.grpc.aio as triton_aio

    async def body() -> None:
        adapter = TritonAdapter(endpoint(triton_server), queue_interval=0.05, stats_interval=0.3)
        await adapter.start()
        client = triton_aio.InferenceServerClient(triton_server.grpc_url)
        try:
            await until(lambda: ("delay", "1") in adapter.replicas
                        and adapter.replicas[("delay", "1")].ready, 10, "delay discovered")
            add_sub = adapter.replicas[("add_sub", "1")]
            delay = adapter.replicas[("delay", "1")]
            assert add_sub.ready and add_sub.max_batch == 8 and add_sub.dynamic_batching
            assert delay.instances == 1 and delay.endpoint == triton_server.grpc_url
            await until(lambda: delay.queue == 0, 5, "the first queue poll")
            await until(lambda: delay.http == add_sub.http == http_addr(triton_server), 5,
                        "the HTTP endpoint probed")

            # Stall the model and pile up requests: the queue figure rises.
            triton_server.set_behaviour("delay", stall=True)
            calls = [asyncio.ensure_future(client.infer(
                "delay", delay_inputs(64 * 1024, triton_aio), client_timeout=30))
                for _ in range(6)]
            await until(lambda: (delay.queue or 0) >= 4, 10, "queue >= 4 while stalled")
            assert time.monotonic() - delay.at["queue"] < 1.0
            triton_server.clear_behaviour("delay")
            await asyncio.gather(*calls)
            await until(lambda: delay.queue == 0, 10, "queue back to 0")

            # Statistics: a known service time shows as compute time, latency and SPU.
            triton_server.set_behaviour("delay", delay_ms=20)
            for _ in range(15):
                await client.infer("delay", delay_inputs(64 * 1024, triton_aio))
            await until(lambda: delay.compute_seconds is not None
                        and delay.compute_seconds > 0.015, 10, "compute time ~22 ms")
            assert delay.spu is not None and delay.latency_ewma is not None
            # A variable-sized input: SPU per request until routers report sizes.
            assert 0.005 < delay.spu < 0.5, delay.spu
            assert adapter.errors["metrics_bad_line"] == 0
        finally:
            triton_server.clear_behaviour()
            await client.close()
            await adapter.close()

    run(body)


def test_killed_server_is_not_ready_within_two_polls_and_recovers(
        triton_factory: TritonFactory) -> None:
    (server,) = triton_factory(1)

    async def body() -> None:
        updates = []
        adapter = TritonAdapter(endpoint(server), queue_interval=0.1, stats_interval=1.0,
                                on_update=lambda: updates.append(time.monotonic()))
        await adapter.start()
        try:
            await until(lambda: len(adapter.replicas) == 2 and all(
                r.ready for r in adapter.replicas.values()), 10, "both models ready")
            server.kill()
            killed = time.monotonic()
            took = await until(lambda: not any(r.ready for r in adapter.replicas.values()),
                               5, "replicas not ready")
            print(f"not ready {took:.3f} s after the kill")
            assert took <= 2 * adapter.queue_interval + 0.5  # two polls, and some slack
            assert not adapter.up
            assert all(r.queue is None for r in adapter.replicas.values())
            assert any(k.startswith("metrics_") for k in adapter.errors)
            assert updates and updates[-1] >= killed

            # The HTTP probe runs at the statistics cadence: two failures clear the address.
            await until(lambda: all(r.http == "" for r in adapter.replicas.values()), 5,
                        "the HTTP address withdrawn")

            server.restart()
            back = await until(lambda: adapter.up and all(
                r.ready for r in adapter.replicas.values()), 20, "replicas ready again")
            print(f"ready again {back:.3f} s after the restart")
            await until(lambda: all(r.http == http_addr(server)
                                    for r in adapter.replicas.values()), 5,
                        "the HTTP address advertised again")
        finally:
            await adapter.close()

    run(body)


def test_a_long_outage_does_not_delay_recovery(triton_factory: TritonFactory) -> None:
    """gRPC's reconnect backoff grows over an outage (to 120 s by default); the adapter's
    channel caps it, so a Triton back after 12 s is ready again within a few polls, not the
    6 s (40 s after 150 s down) the default channel took."""
    (server,) = triton_factory(1, models=["add_sub"])

    async def body() -> None:
        adapter = TritonAdapter(endpoint(server), queue_interval=0.1, stats_interval=1.0)
        await adapter.start()
        try:
            await until(lambda: len(adapter.replicas) == 1 and all(
                r.ready for r in adapter.replicas.values()), 10, "ready")
            server.kill()
            await until(lambda: not adapter.up, 5, "down")
            await asyncio.sleep(12.0)
            await asyncio.to_thread(server.restart)  # returns once Triton answers
            back = await until(lambda: adapter.up and all(
                r.ready for r in adapter.replicas.values()), 20, "ready again")
            print(f"ready {back:.3f} s after Triton was back")
            assert back < 3.0
        finally:
            await adapter.close()

    run(body)


def test_model_load_and_unload_are_seen(triton_factory: TritonFactory) -> None:
    (server,) = triton_factory(1, explicit=True, models=["add_sub"])
    import tritonclient.grpc.aio as triton_aio

    async def body() -> None:
        adapter = TritonAdapter(endpoint(server), queue_interval=0.1, stats_interval=0.2)
        await adapter.start()
        client = triton_aio.InferenceServerClient(server.grpc_url)
        try:
            await until(lambda: ("add_sub", "1") in adapter.replicas, 10, "add_sub")
            assert ("delay", "1") not in adapter.replicas
            await client.load_model("delay")
            await until(lambda: ("delay", "1") in adapter.replicas
                        and adapter.replicas[("delay", "1")].ready, 10, "delay loaded")
            await client.unload_model("add_sub")
            await until(lambda: ("add_sub", "1") not in adapter.replicas
                        or not adapter.replicas[("add_sub", "1")].ready, 10,
                        "add_sub unloaded")
        finally:
            await client.close()
            await adapter.close()

    run(body)


def test_a_closed_http_port_is_not_advertised(triton_server: TritonServer) -> None:
    """``http=`` naming a port Triton does not serve: the replicas carry no HTTP address (so
    routers convert HTTP requests to gRPC), and the failure is logged once, not per poll."""
    closed = free_port()  # nothing listens once the socket is closed

    async def body() -> None:
        ep = TritonEndpoint.parse(f"{triton_server.grpc_url},metrics={triton_server.metrics_url}"
                                  f",http=127.0.0.1:{closed}")
        adapter = TritonAdapter(ep, queue_interval=0.1, stats_interval=0.1)
        await adapter.start()
        try:
            await until(lambda: ("add_sub", "1") in adapter.replicas
                        and adapter.replicas[("add_sub", "1")].ready, 10, "add_sub discovered")
            await until(lambda: adapter.errors["http_ConnectionRefusedError"] >= 3, 5,
                        "three failed probes")
            assert all(r.http == "" for r in adapter.replicas.values())
            assert adapter.up and adapter.polls["http"] == 0
        finally:
            await adapter.close()

    run(body)


# --- the HTTP probe, against a stand-in health endpoint (no Triton needed) ----------------


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        code = self.status if self.path == "/v2/health/live" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def health() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Health,), {}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_http_address_follows_the_probe_without_flapping(
        health: http.server.ThreadingHTTPServer, caplog: pytest.LogCaptureFixture) -> None:
    port = health.server_address[1]
    ep = TritonEndpoint.parse(f"127.0.0.1:1,http=127.0.0.1:{port},advertise=10.0.0.5:8001")
    handler: type[_Health] = health.RequestHandlerClass  # type: ignore[assignment]

    async def body() -> None:
        updates: list[float] = []
        adapter = TritonAdapter(ep, on_update=lambda: updates.append(0.0))
        rep = adapter.replicas[("m", "1")] = ReplicaState("m", "1", ep.advertise)
        try:
            assert await adapter.probe_http() and rep.http == f"10.0.0.5:{port}"
            assert adapter.http == rep.http and adapter.polls["http"] == 1
            assert not await adapter.probe_http()  # unchanged: nothing to publish
            handler.status = 503
            assert not await adapter.probe_http() and rep.http  # one failure: kept
            assert await adapter.probe_http() and rep.http == ""  # two in a row: withdrawn
            assert not await adapter.probe_http() and rep.http == ""
            handler.status = 200
            assert await adapter.probe_http() and rep.http == f"10.0.0.5:{port}"
        finally:
            await adapter.close()

    with caplog.at_level(logging.INFO, logger="meshd.adapters.triton"):
        run(body)
    events = [getattr(r, "event", "") for r in caplog.records]
    assert events == ["triton_http_up", "triton_http_down", "triton_http_up"], events


def test_new_replicas_get_the_http_address_found_so_far() -> None:
    """A model discovered after the probe answered carries the address from its first
    publication, not from the next probe that changes something."""
    ep = TritonEndpoint.parse("127.0.0.1:1,http=127.0.0.1:8000")

    class Entry:
        name, version, state = "m", "1", "READY"

    class Index:
        models = [Entry()]

    class Client:
        async def is_model_ready(self, *_: object, **__: object) -> bool:
            return False  # no config to read: discovery alone

    adapter = TritonAdapter(ep, client=Client())
    adapter.http = ep.advertise_http  # as a successful probe leaves it
    asyncio.run(adapter._discover(Index(), 1.0))
    assert adapter.replicas[("m", "1")].http == "127.0.0.1:8000"


@pytest.mark.parametrize("spec, why", [
    ("", "empty"), ("localhost", "HOST:PORT"), ("h:0", "HOST:PORT"),
    ("h:1,metrics=ftp://x", "http://"), ("h:1,colour=red", "metrics=URL"),
    ("h:1,http=localhost", "HTTP endpoint"), ("h:1,http=h:65536", "HTTP endpoint"),
    ("h:1,http=h:x", "HTTP endpoint"), ("h:1,http=", "http=HOST:PORT"),
    ("h:1,advertise=h", "advertise="),
])
def test_endpoint_specs_are_checked(spec: str, why: str) -> None:
    with pytest.raises(EndpointError, match=why):
        TritonEndpoint.parse(spec)
    ep = TritonEndpoint.parse("10.0.0.1:8001")
    assert ep.metrics == "http://10.0.0.1:8002/metrics" and ep.advertise == "10.0.0.1:8001"
    assert ep.http == ep.advertise_http == ""  # no guessed port 8000: routers use gRPC


@pytest.mark.parametrize("spec, http, advertised", [
    ("10.0.0.1:8001,http=10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.1:8000"),
    # Triton reached on loopback, the node advertised: the HTTP port on the node's address.
    ("127.0.0.1:8001,http=127.0.0.1:8000,advertise=10.0.0.5:9001", "127.0.0.1:8000",
     "10.0.0.5:8000"),
    ("10.0.0.1:8001,advertise=10.0.0.1:9001,http=10.0.0.1:8000", "10.0.0.1:8000",
     "10.0.0.1:8000"),
    ("[::1]:8001,http=[::1]:8000,advertise=[fd00::5]:8001", "[::1]:8000", "[fd00::5]:8000"),
])
def test_the_http_endpoint_and_its_advertised_address(spec: str, http: str,
                                                      advertised: str) -> None:
    ep = TritonEndpoint.parse(spec)
    assert (ep.http, ep.advertise_http) == (http, advertised)
