"""Signal deltas from outside the agent (``StatePlane.Report*``, a job's collective timings),
checked field by field before they touch the node's state.

A bad delta raises :class:`DeltaError` naming the field, so the caller can tell a buggy
exporter exactly what is wrong instead of letting it poison routing decisions.
"""

from __future__ import annotations

import math
from typing import Any

from adapters.model import CommStats, GpuState, ReplicaState
from meshd.signals.wire import MAX_TEXT
from proto.mesh.v1 import state_pb2

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
