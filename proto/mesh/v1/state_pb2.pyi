from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelStateDelta(_message.Message):
    __slots__ = ("runtime", "endpoint", "model", "version", "ready", "queue", "inflight", "instances", "max_batch", "spu", "latency_seconds", "rate", "remove")
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    SPU_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    runtime: str
    endpoint: str
    model: str
    version: str
    ready: bool
    queue: int
    inflight: int
    instances: int
    max_batch: int
    spu: float
    latency_seconds: float
    rate: float
    remove: bool
    def __init__(self, runtime: _Optional[str] = ..., endpoint: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., ready: _Optional[bool] = ..., queue: _Optional[int] = ..., inflight: _Optional[int] = ..., instances: _Optional[int] = ..., max_batch: _Optional[int] = ..., spu: _Optional[float] = ..., latency_seconds: _Optional[float] = ..., rate: _Optional[float] = ..., remove: _Optional[bool] = ...) -> None: ...

class GpuStateDelta(_message.Message):
    __slots__ = ("uuid", "index", "name", "memory_total", "memory_free", "sm_util", "mem_util", "temperature_c", "power_w", "ecc_uncorrected", "throttle", "remove")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    SM_UTIL_FIELD_NUMBER: _ClassVar[int]
    MEM_UTIL_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    name: str
    memory_total: int
    memory_free: int
    sm_util: float
    mem_util: float
    temperature_c: float
    power_w: float
    ecc_uncorrected: int
    throttle: _containers.RepeatedScalarFieldContainer[str]
    remove: bool
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_free: _Optional[int] = ..., sm_util: _Optional[float] = ..., mem_util: _Optional[float] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., ecc_uncorrected: _Optional[int] = ..., throttle: _Optional[_Iterable[str]] = ..., remove: _Optional[bool] = ...) -> None: ...

class CommStatsDelta(_message.Message):
    __slots__ = ("job", "op", "seconds", "bytes", "algorithm", "world_size", "peers")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    job: str
    op: str
    seconds: float
    bytes: int
    algorithm: str
    world_size: int
    peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., op: _Optional[str] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ..., algorithm: _Optional[str] = ..., world_size: _Optional[int] = ..., peers: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SignalsPush(_message.Message):
    __slots__ = ("node", "signals")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    node: str
    signals: bytes
    def __init__(self, node: _Optional[str] = ..., signals: _Optional[bytes] = ...) -> None: ...

class StateRequest(_message.Message):
    __slots__ = ("node", "model")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    node: str
    model: str
    def __init__(self, node: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class ReplicaView(_message.Message):
    __slots__ = ("node", "model", "version", "endpoint", "runtime", "ready", "queue", "inflight", "instances", "spu", "latency_seconds", "rate", "ready_age", "queue_age", "stats_age", "flags", "via", "observed_inflight", "observed_latency")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SPU_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    READY_AGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_AGE_FIELD_NUMBER: _ClassVar[int]
    STATS_AGE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_LATENCY_FIELD_NUMBER: _ClassVar[int]
    node: str
    model: str
    version: str
    endpoint: str
    runtime: str
    ready: bool
    queue: int
    inflight: int
    instances: int
    spu: float
    latency_seconds: float
    rate: float
    ready_age: float
    queue_age: float
    stats_age: float
    flags: _containers.RepeatedScalarFieldContainer[str]
    via: str
    observed_inflight: int
    observed_latency: float
    def __init__(self, node: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., endpoint: _Optional[str] = ..., runtime: _Optional[str] = ..., ready: _Optional[bool] = ..., queue: _Optional[int] = ..., inflight: _Optional[int] = ..., instances: _Optional[int] = ..., spu: _Optional[float] = ..., latency_seconds: _Optional[float] = ..., rate: _Optional[float] = ..., ready_age: _Optional[float] = ..., queue_age: _Optional[float] = ..., stats_age: _Optional[float] = ..., flags: _Optional[_Iterable[str]] = ..., via: _Optional[str] = ..., observed_inflight: _Optional[int] = ..., observed_latency: _Optional[float] = ...) -> None: ...

class GpuView(_message.Message):
    __slots__ = ("node", "uuid", "name", "memory_total", "memory_free", "sm_util", "temperature_c", "ecc_uncorrected", "throttle", "age")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    SM_UTIL_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    node: str
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    sm_util: float
    temperature_c: float
    ecc_uncorrected: int
    throttle: _containers.RepeatedScalarFieldContainer[str]
    age: float
    def __init__(self, node: _Optional[str] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_free: _Optional[int] = ..., sm_util: _Optional[float] = ..., temperature_c: _Optional[float] = ..., ecc_uncorrected: _Optional[int] = ..., throttle: _Optional[_Iterable[str]] = ..., age: _Optional[float] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node", "via", "age", "cpu_only", "flags")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    CPU_ONLY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    node: str
    via: str
    age: float
    cpu_only: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., via: _Optional[str] = ..., age: _Optional[float] = ..., cpu_only: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ...) -> None: ...

class StateResponse(_message.Message):
    __slots__ = ("nodes", "replicas", "gpus")
    NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaView]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuView]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaView, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuView, _Mapping]]] = ...) -> None: ...
