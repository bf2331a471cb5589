"""The StatePlane gRPC service: external runtimes report, peers subscribe, operators look.

Deltas from outside are checked field by field before they touch the node's state: a bad one
ends its stream with INVALID_ARGUMENT naming the delta and the field (and is counted), so a
buggy exporter is told exactly what is wrong instead of poisoning routing decisions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from meshd.admin.authz import CALLER
from meshd.signals.deltas import DeltaError, comm_from, gpu_from, replica_from
from meshd.signals.plane import SignalPlane
from proto.mesh.v1 import state_pb2, state_pb2_grpc


def _or(value: float | int | None, unknown: float = -1) -> float:
    return unknown if value is None else value


class StatePlaneService(state_pb2_grpc.StatePlaneServicer):
    def __init__(self, plane: SignalPlane) -> None:
        self.plane = plane

    async def _report(self, method: str, requests: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext,
                      apply: Callable[[Any, float], None]) -> state_pb2.ReportAck:
        accepted = 0
        async for delta in requests:
            try:
                apply(delta, self.plane.clock())
            except DeltaError as exc:
                self.plane.rejected[f"invalid_{method}"] += 1
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"delta {accepted}: {exc} ({accepted} accepted before it)")
            accepted += 1
        return state_pb2.ReportAck(accepted=accepted)

    async def ReportModelState(self, request_iterator: AsyncIterator[Any],  # noqa: N802
                               context: grpc.aio.ServicerContext) -> state_pb2.ReportAck:
        def apply(d: state_pb2.ModelStateDelta, now: float) -> None:
            self.plane.report_replica(replica_from(d, now), remove=d.remove)
        return await self._report("ReportModelState", request_iterator, context, apply)

    async def ReportGpuState(self, request_iterator: AsyncIterator[Any],  # noqa: N802
                             context: grpc.aio.ServicerContext) -> state_pb2.ReportAck:
        def apply(d: state_pb2.GpuStateDelta, now: float) -> None:
            self.plane.report_gpu(gpu_from(d, now), remove=d.remove)
        return await self._report("ReportGpuState", request_iterator, context, apply)

    async def ReportCommStats(self, request_iterator: AsyncIterator[Any],  # noqa: N802
                              context: grpc.aio.ServicerContext) -> state_pb2.ReportAck:
        def apply(d: state_pb2.CommStatsDelta, now: float) -> None:
            self.plane.report_comm(comm_from(d, now))
        return await self._report("ReportCommStats", request_iterator, context, apply)

    async def Subscribe(self, request: state_pb2.SubscribeRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> AsyncIterator[state_pb2.SignalsPush]:
        caller = CALLER.get()
        if caller is None or caller.kind != "node":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "Subscribe is for mesh nodes only")
        queue = self.plane.subscribe()
        try:
            while True:
                sig = await queue.get()
                yield state_pb2.SignalsPush(node=self.plane.node,
                                            signals=self.plane.push_bytes(sig))
        finally:
            self.plane.unsubscribe(queue)

    async def State(self, request: state_pb2.StateRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> state_pb2.StateResponse:
        now = self.plane.clock()
        fused = self.plane.fused
        out = state_pb2.StateResponse()
        for name, entry in sorted(fused.nodes.items()):
            if request.node and name != request.node:
                continue
            out.nodes.append(state_pb2.NodeView(
                node=name, via=entry.via, age=now - entry.received,
                cpu_only=entry.signals.cpu_only, flags=fused.flags_of(name)))
            for g in entry.signals.gpus:
                out.gpus.append(state_pb2.GpuView(
                    node=name, uuid=g.uuid, name=g.name, memory_total=g.memory_total,
                    memory_free=g.memory_free, sm_util=_or(g.sm_util),
                    temperature_c=_or(g.temperature_c), ecc_uncorrected=int(
                        _or(g.ecc_uncorrected)), throttle=list(g.throttle),
                    age=now - g.at if g.at else -1))
        for r in fused.replicas(now, request.model or None):
            if request.node and r.node != request.node:
                continue
            s = r.state
            out.replicas.append(state_pb2.ReplicaView(
                node=r.node, model=s.model, version=s.version, endpoint=s.endpoint,
                runtime=s.runtime, ready=s.ready, queue=int(_or(s.queue)),
                inflight=int(_or(s.inflight)), instances=s.instances, spu=_or(s.spu),
                latency_seconds=_or(s.latency_ewma), rate=_or(s.rate),
                ready_age=r.ages.get("ready", -1), queue_age=r.ages.get("queue", -1),
                stats_age=r.ages.get("stats", -1), flags=r.flags, via=r.via,
                observed_inflight=r.observed.inflight,
                observed_latency=_or(r.observed.latency_ewma)))
        return out
