"""The StatePlane gRPC service: external runtimes report, peers subscribe, operators look.

Deltas from outside are checked field by field before they touch the node's state: a bad one
ends its stream with INVALID_ARGUMENT naming the delta and the field (and is counted), so a
buggy exporter is told exactly what is wrong instead of poisoning routing decisions.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from adapters.model import CommStats, GpuState, ReplicaState
from meshd.authz import CALLER
from meshd.signal_wire import MAX_TEXT
from meshd.signals import SignalPlane
from proto.mesh.v1 import state_pb2, state_pb2_grpc

COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce",
            "send_recv")


class DeltaError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")


def _text(value: str, field: str, required: bool = True) -> str:
    if (required and not value) or len(value) > MAX_TEXT or not value.isprintable():
        raise DeltaError(field, f"must be 1-{MAX_TEXT} printable characters" if required
                         else f"must be at most {MAX_TEXT} printable characters")
    return value


def _count(msg: Any, field: str) -> int | None:
    if not msg.HasField(field):
        return None
    value = int(getattr(msg, field))
    if not 0 <= value <= 2**31:
        raise DeltaError(field, "must be in [0, 2^31]")
    return value


def _real(msg: Any, field: str, hi: float = math.inf) -> float | None:
    if not msg.HasField(field):
        return None
    value = float(getattr(msg, field))
    if not math.isfinite(value) or not 0 <= value <= hi:
        raise DeltaError(field, f"must be a finite number in [0, {hi:g}]")
    return value


def _endpoint(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DeltaError("endpoint", "must be HOST:PORT")
    return value


def replica_from(d: state_pb2.ModelStateDelta, now: float) -> ReplicaState:
    runtime = _text(d.runtime, "runtime")
    if runtime == "triton":
        raise DeltaError("runtime", "'triton' is reserved for meshd's own Triton adapter")
    rep = ReplicaState(model=_text(d.model, "model"), version=_text(d.version, "version",
                                                                    required=False) or "1",
                       endpoint=_endpoint(d.endpoint), runtime=runtime, ready=d.ready,
                       queue=_count(d, "queue"), inflight=_count(d, "inflight"),
                       instances=d.instances or 1, max_batch=d.max_batch,
                       spu=_real(d, "spu", 3600.0), latency_ewma=_real(d, "latency_seconds",
                                                                        3600.0),
                       rate=_real(d, "rate", 1e9))
    if rep.instances > 1 << 16:
        raise DeltaError("instances", "must be at most 65536")
    rep.at = {"ready": now, "queue": now, "stats": now}
    return rep


def gpu_from(d: state_pb2.GpuStateDelta, now: float) -> GpuState:
    if d.memory_free > d.memory_total:
        raise DeltaError("memory_free", "must not exceed memory_total")
    if len(d.throttle) > 16:
        raise DeltaError("throttle", "at most 16 reasons")
    ecc = d.ecc_uncorrected if d.HasField("ecc_uncorrected") else None
    return GpuState(uuid=_text(d.uuid, "uuid"), index=d.index, name=_text(d.name, "name",
                                                                           required=False),
                    memory_total=d.memory_total, memory_free=d.memory_free,
                    sm_util=_real(d, "sm_util", 100.0), mem_util=_real(d, "mem_util", 100.0),
                    temperature_c=_real(d, "temperature_c", 1000.0),
                    power_w=_real(d, "power_w", 1e5), ecc_uncorrected=ecc,
                    throttle=tuple(_text(t, "throttle") for t in d.throttle), at=now)


def comm_from(d: state_pb2.CommStatsDelta, now: float) -> CommStats:
    if d.op not in COMM_OPS:
        raise DeltaError("op", f"must be one of {', '.join(COMM_OPS)}")
    if not math.isfinite(d.seconds) or not 0 < d.seconds <= 3600:
        raise DeltaError("seconds", "must be in (0, 3600]")
    if len(d.peers) > 4096:
        raise DeltaError("peers", "at most 4096 nodes")
    return CommStats(job=_text(d.job, "job"), op=d.op, seconds=d.seconds, bytes=d.bytes,
                     algorithm=_text(d.algorithm, "algorithm", required=False),
                     world_size=d.world_size,
                     peers=tuple(_text(p, "peers") for p in d.peers), at=now)


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
