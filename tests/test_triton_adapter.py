"""The Triton adapter against real Triton servers: discovery and config, queue depth rising
under load and falling after, statistics turning into rates and SPU, a killed server marked
not ready within two polls and recovered, model load/unload seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from adapters.triton import TritonAdapter, TritonEndpoint
from meshd.devtriton import TritonServer
from tests.triton import TritonFactory, delay_inputs


def endpoint(server: TritonServer) -> TritonEndpoint:
    return TritonEndpoint.parse(f"{server.grpc_url},metrics={server.metrics_url}")


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

            server.restart()
            back = await until(lambda: adapter.up and all(
                r.ready for r in adapter.replicas.values()), 20, "replicas ready again")
            print(f"ready again {back:.3f} s after the restart")
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


@pytest.mark.parametrize("spec, why", [
    ("", "empty"), ("localhost", "HOST:PORT"), ("h:0", "HOST:PORT"),
    ("h:1,metrics=ftp://x", "http://"), ("h:1,colour=red", "metrics=URL"),
])
def test_endpoint_specs_are_checked(spec: str, why: str) -> None:
    from adapters.triton import EndpointError
    with pytest.raises(EndpointError, match=why):
        TritonEndpoint.parse(spec)
    ep = TritonEndpoint.parse("10.0.0.1:8001")
    assert ep.metrics == "http://10.0.0.1:8002/metrics" and ep.advertise == "10.0.0.1:8001"
