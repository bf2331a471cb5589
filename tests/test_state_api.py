"""The StatePlane service in process, with real mTLS and RBAC: external runtimes report
(bad deltas get INVALID_ARGUMENT naming the field), peers subscribe (node certificates only)
and get every change pushed, and State shows the fused view with ages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs.identity import Identity
from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import NodeMeta
from meshd.coordinates import CoordinatePlane
from meshd.dev.ports import free_port
from meshd.signals.deltas import DeltaError, replica_from
from meshd.signals.plane import HEARTBEAT, SignalPlane
from meshd.signals.wire import decode
from proto.mesh.v1 import state_pb2, state_pb2_grpc
from testbed.admin import admin_channel, dev_security, mint, start_admin


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    async def __aenter__(self) -> Node:
        self.swim = Swim(Config.local(), "a", ("127.0.0.1", 7000),
                         NodeMeta.build([], "", "", {}, {}), now=0.0)
        self.sec = dev_security(self.tmp / "a", "a")
        self.plane = SignalPlane("a", gpu=False)
        await self.plane.start()
        self.port = free_port()
        self.server = await start_admin(self.swim, lambda: 0.0,
                                        CoordinatePlane("a", place_of=lambda n: None), self.sec,
                                        self.port, signals=self.plane)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)
        await self.plane.close()

    def mint(self, name: str, roles: list[str], kind: str = "user") -> Identity:
        return mint(self.sec, self.tmp, name, roles, kind)

    def stub(self, ident: Identity | None = None) -> tuple[grpc.aio.Channel, Any]:
        ch = admin_channel(self.sec, self.port, ident)
        return ch, state_pb2_grpc.StatePlaneStub(ch)


def run(tmp: Path, body: Any) -> None:
    async def main() -> None:
        async with Node(tmp) as node:
            await body(node)
    asyncio.run(main())


def delta(**kw: Any) -> state_pb2.ModelStateDelta:
    base: dict[str, Any] = {"runtime": "vllm", "endpoint": "10.0.0.9:8000", "model": "llama",
                            "ready": True, "queue": 4, "instances": 2, "spu": 0.01}
    base.update(kw)
    return state_pb2.ModelStateDelta(**base)


async def stream_of(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


def test_reports_are_validated_and_reach_the_fused_view(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        ch, stub = node.stub()
        async with ch:
            ack = await stub.ReportModelState(stream_of(delta(), delta(model="mistral")),
                                              timeout=5)
            assert ack.accepted == 2
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.ReportModelState(stream_of(delta(model="ok"), delta(queue=-3),
                                                      delta(model="never")), timeout=5)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "delta 1: queue:" in (bad.value.details() or "")
            for bad_delta, field in ((delta(endpoint="nope"), "endpoint"),
                                     (delta(runtime="triton"), "runtime"),
                                     (delta(model=""), "model"),
                                     (delta(spu=float("nan")), "spu")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ReportModelState(stream_of(bad_delta), timeout=5)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert f"delta 0: {field}:" in (err.value.details() or ""), err.value.details()
            gpu = state_pb2.GpuStateDelta(uuid="GPU-x", name="L4", memory_total=100,
                                          memory_free=200)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportGpuState(stream_of(gpu), timeout=5)
            assert "memory_free" in (err.value.details() or "")
            ack = await stub.ReportCommStats(stream_of(state_pb2.CommStatsDelta(
                job="j", op="all_reduce", seconds=0.02, bytes=1 << 20, peers=["a", "b"])),
                timeout=5)
            assert ack.accepted == 1
            await asyncio.sleep(0.1)
            state = await stub.State(state_pb2.StateRequest(), timeout=5)
            models = sorted(r.model for r in state.replicas)
            assert models == ["llama", "mistral", "ok"]  # "never" came after the bad one
            llama = next(r for r in state.replicas if r.model == "llama")
            assert (llama.node, llama.runtime, llama.queue, llama.via) == ("a", "vllm", 4,
                                                                           "local")
            assert 0 <= llama.queue_age < 5
            only = await stub.State(state_pb2.StateRequest(model="mistral"), timeout=5)
            assert [r.model for r in only.replicas] == ["mistral"]
            assert [n.node for n in state.nodes] == ["a"]
            assert state.nodes[0].cpu_only == "GPU adapter disabled"

    run(tmp_path, body)


def test_subscribe_pushes_changes_and_is_for_nodes_only(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        viewer = node.mint("vera", ["viewer"])
        ch, stub = node.stub(viewer)
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                async for _ in stub.Subscribe(state_pb2.SubscribeRequest(), timeout=5):
                    break
            assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.ReportModelState(stream_of(delta()), timeout=5)
            assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
            state = await stub.State(state_pb2.StateRequest(), timeout=5)  # viewers may look
            assert state.nodes
        peer = node.mint("b", ["node"], kind="node")
        ch, stub = node.stub(peer)
        async with ch:
            call = stub.Subscribe(state_pb2.SubscribeRequest(), timeout=10)
            first = await call.read()
            assert first.node == "a" and decode(first.signals, 0.0).replicas == []
            node.plane.report_replica(replica_from(delta(queue=9), node.plane.clock()))
            t0 = asyncio.get_running_loop().time()
            sig = decode(first.signals, 0.0)
            while not sig.replicas:  # (a heartbeat push may come first)
                sig = decode((await asyncio.wait_for(call.read(), 2.0)).signals, 0.0)
            took = asyncio.get_running_loop().time() - t0
            assert [r.queue for r in sig.replicas] == [9]
            assert sig.seq > decode(first.signals, 0.0).seq
            assert took < 0.5  # pushed on the change, not on a timer
            # Nothing changes now, yet pushes keep coming (HEARTBEAT) with newer measurement
            # times, so a steady figure is not mistaken for an old one.
            pushes = []
            for _ in range(2):
                push = await asyncio.wait_for(call.read(), HEARTBEAT + 1.0)
                pushes.append(decode(push.signals, node.plane.clock()))
            assert pushes[1].seq > pushes[0].seq > sig.seq
            assert [r.queue for r in pushes[1].replicas] == [9]
            call.cancel()

    run(tmp_path, body)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.builds(
    state_pb2.ModelStateDelta, runtime=st.text(max_size=8), endpoint=st.text(max_size=12),
    model=st.text(max_size=8), version=st.text(max_size=3), ready=st.booleans(),
    queue=st.integers(-5, 2**40), spu=st.floats(allow_nan=True)), min_size=1, max_size=4))
def test_fuzzed_deltas_are_accepted_or_invalid_argument(
        tmp_path_factory: pytest.TempPathFactory,
        deltas: list[state_pb2.ModelStateDelta]) -> None:
    for d in deltas:  # the validator alone: accepted or a named DeltaError, nothing else
        try:
            rep = replica_from(d, 1.0)
        except DeltaError as exc:
            assert ":" in str(exc)
            continue
        assert rep.model and rep.endpoint.rpartition(":")[2].isdigit()
        assert rep.queue is None or 0 <= rep.queue <= 2**31
        assert rep.spu is None or rep.spu >= 0
