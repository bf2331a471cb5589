"""Typed telemetry that adapters produce and the agent fuses: replicas, GPUs, collectives.

Adapters (Triton, NVML, external runtimes through the StatePlane API) each own a slice of a
node's state and hand back these plain values; they know nothing of gossip or routing.
Every figure carries the monotonic time it was measured at (``at``), so whoever reads it can
tell its age: a queue depth is worth little once it is a second old.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

WORK_UNIT_BYTES = 32 * 1024
"""A work unit is ceil(bytes / 32 KiB) of request payload (the Citadel design's unit)."""


def work_units(payload_bytes: int) -> int:
    """Work units of a request: at least one, so an empty payload still costs a slot."""
    return max(1, -(-payload_bytes // WORK_UNIT_BYTES))


@dataclass(slots=True)
class ReplicaState:
    """One model version served by one runtime endpoint on this node.

    ``None`` means "not known" (not measured yet, or the runtime does not report it), which is
    different from zero.  ``at`` maps a figure group to when it was last measured:
    ``ready`` (readiness and config), ``queue`` (queue and in-flight), ``stats`` (rates,
    queue/compute time, SPU, latency).
    """

    model: str
    version: str
    endpoint: str
    """The runtime's inference address (``host:port``) that routers send to."""
    runtime: str = "triton"
    ready: bool = False
    queue: int | None = None
    """Requests waiting in the runtime's queue (Triton: ``nv_inference_pending_request_count``)."""
    inflight: int | None = None
    """Requests being executed, when the runtime says (external runtimes)."""
    instances: int = 1
    max_batch: int = 0
    dynamic_batching: bool = False
    rate: float | None = None
    """Successful inferences per second over the last statistics interval."""
    queue_seconds: float | None = None
    """Mean time a request spent queued, over the last statistics interval."""
    compute_seconds: float | None = None
    """Mean compute (input + infer + output) time per request, over the last interval."""
    spu: float | None = None
    """Seconds of compute per work unit (EWMA): what one more unit of payload costs."""
    latency_ewma: float | None = None
    latency_p95: float | None = None
    failures: int = 0
    """Failed inferences in the last statistics interval."""
    at: dict[str, float] = field(default_factory=dict)
    http: str = ""
    """The runtime's HTTP/REST address (``host:port``) routers forward HTTP requests to, as
    they came; empty when it serves none or it is not known (routers convert them to gRPC)."""

    @property
    def key(self) -> str:
        return replica_key(self.endpoint, self.model, self.version)

    def copy(self) -> ReplicaState:
        """A copy with its own ``at`` (every other field is immutable): a fifth of
        ``copy.deepcopy``'s cost, which made up most of publishing a 512-replica node."""
        return dataclasses.replace(self, at=dict(self.at))


def replica_key(endpoint: str, model: str, version: str) -> str:
    """A replica's name, unique in the mesh: its endpoint, model and version."""
    return f"{endpoint}/{model}/{version}"


@dataclass(slots=True)
class MigProfile:
    """One MIG instance carved out of a GPU."""

    uuid: str
    profile: str
    """NVML's profile name, e.g. ``1g.10gb``."""
    memory_total: int
    memory_free: int


@dataclass(slots=True)
class GpuState:
    """One physical GPU (and its MIG instances, when MIG is on), from NVML."""

    uuid: str
    index: int
    name: str
    memory_total: int
    memory_free: int
    sm_util: float | None = None
    """Percent of time a kernel ran over NVML's sample period (0-100)."""
    mem_util: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None
    """Volatile uncorrected ECC errors since the driver loaded; ``None`` without ECC."""
    ecc_corrected: int | None = None
    throttle: tuple[str, ...] = ()
    """Active clock-throttle reasons worth acting on (e.g. ``hw_thermal``, ``sw_power_cap``)."""
    mig: tuple[MigProfile, ...] = ()
    at: float = 0.0


@dataclass(slots=True)
class CommStats:
    """One collective's timing as a trainer reported it (the comm adapter)."""

    job: str
    op: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``."""
    seconds: float
    bytes: int
    algorithm: str = ""
    """``ring``, ``tree``, ... as the library chose or was told."""
    world_size: int = 0
    peers: tuple[str, ...] = ()
    """The nodes of the collective, in rank order, when the trainer knows them."""
    at: float = 0.0
