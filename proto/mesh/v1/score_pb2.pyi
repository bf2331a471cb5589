from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutcomeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_OK: _ClassVar[OutcomeStatus]
    OUTCOME_ERROR: _ClassVar[OutcomeStatus]
    OUTCOME_UNAVAILABLE: _ClassVar[OutcomeStatus]
    OUTCOME_TIMEOUT: _ClassVar[OutcomeStatus]
    OUTCOME_CANCELLED: _ClassVar[OutcomeStatus]
    OUTCOME_OVERLOADED: _ClassVar[OutcomeStatus]
OUTCOME_OK: OutcomeStatus
OUTCOME_ERROR: OutcomeStatus
OUTCOME_UNAVAILABLE: OutcomeStatus
OUTCOME_TIMEOUT: OutcomeStatus
OUTCOME_CANCELLED: OutcomeStatus
OUTCOME_OVERLOADED: OutcomeStatus

class ScoreRequest(_message.Message):
    __slots__ = ("model", "revision", "payload_bytes", "tenant", "slo_class", "deadline_seconds", "exclude", "idempotent", "sequence", "sequence_start", "sequence_end")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_START_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_END_FIELD_NUMBER: _ClassVar[int]
    model: str
    revision: str
    payload_bytes: int
    tenant: str
    slo_class: str
    deadline_seconds: float
    exclude: _containers.RepeatedScalarFieldContainer[str]
    idempotent: bool
    sequence: str
    sequence_start: bool
    sequence_end: bool
    def __init__(self, model: _Optional[str] = ..., revision: _Optional[str] = ..., payload_bytes: _Optional[int] = ..., tenant: _Optional[str] = ..., slo_class: _Optional[str] = ..., deadline_seconds: _Optional[float] = ..., exclude: _Optional[_Iterable[str]] = ..., idempotent: _Optional[bool] = ..., sequence: _Optional[str] = ..., sequence_start: _Optional[bool] = ..., sequence_end: _Optional[bool] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("node", "endpoint", "replica", "version", "predicted_seconds", "rtt_seconds", "queue_seconds", "service_seconds", "zone", "http_endpoint")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    HTTP_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node: str
    endpoint: str
    replica: str
    version: str
    predicted_seconds: float
    rtt_seconds: float
    queue_seconds: float
    service_seconds: float
    zone: str
    http_endpoint: str
    def __init__(self, node: _Optional[str] = ..., endpoint: _Optional[str] = ..., replica: _Optional[str] = ..., version: _Optional[str] = ..., predicted_seconds: _Optional[float] = ..., rtt_seconds: _Optional[float] = ..., queue_seconds: _Optional[float] = ..., service_seconds: _Optional[float] = ..., zone: _Optional[str] = ..., http_endpoint: _Optional[str] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("admit", "reason", "retry_after_seconds")
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    admit: bool
    reason: str
    retry_after_seconds: float
    def __init__(self, admit: _Optional[bool] = ..., reason: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ...) -> None: ...

class ScoreReply(_message.Message):
    __slots__ = ("targets", "verdict", "hedge_after_seconds", "decision_id", "strategy", "degraded", "walk")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HEDGE_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    WALK_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[Target]
    verdict: Verdict
    hedge_after_seconds: float
    decision_id: int
    strategy: str
    degraded: bool
    walk: bool
    def __init__(self, targets: _Optional[_Iterable[_Union[Target, _Mapping]]] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ..., hedge_after_seconds: _Optional[float] = ..., decision_id: _Optional[int] = ..., strategy: _Optional[str] = ..., degraded: _Optional[bool] = ..., walk: _Optional[bool] = ...) -> None: ...

class OutcomeReport(_message.Message):
    __slots__ = ("decision_id", "replica", "latency_seconds", "status", "bytes", "hedge", "last")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HEDGE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    decision_id: int
    replica: str
    latency_seconds: float
    status: OutcomeStatus
    bytes: int
    hedge: bool
    last: bool
    def __init__(self, decision_id: _Optional[int] = ..., replica: _Optional[str] = ..., latency_seconds: _Optional[float] = ..., status: _Optional[_Union[OutcomeStatus, str]] = ..., bytes: _Optional[int] = ..., hedge: _Optional[bool] = ..., last: _Optional[bool] = ...) -> None: ...

class OutcomeAck(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("model", "revision", "payload_bytes", "tenant", "slo_class")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    model: str
    revision: str
    payload_bytes: int
    tenant: str
    slo_class: str
    def __init__(self, model: _Optional[str] = ..., revision: _Optional[str] = ..., payload_bytes: _Optional[int] = ..., tenant: _Optional[str] = ..., slo_class: _Optional[str] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ("verdict", "decision_id")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    decision_id: int
    def __init__(self, verdict: _Optional[_Union[Verdict, _Mapping]] = ..., decision_id: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("model", "revision")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    model: str
    revision: str
    def __init__(self, model: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...

class WeightedTarget(_message.Message):
    __slots__ = ("target", "weight")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    target: Target
    weight: float
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., weight: _Optional[float] = ...) -> None: ...

class TargetWeights(_message.Message):
    __slots__ = ("model", "targets", "degraded")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    model: str
    targets: _containers.RepeatedCompositeFieldContainer[WeightedTarget]
    degraded: bool
    def __init__(self, model: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[WeightedTarget, _Mapping]]] = ..., degraded: _Optional[bool] = ...) -> None: ...

class OutcomeBatch(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[OutcomeReport]
    def __init__(self, reports: _Optional[_Iterable[_Union[OutcomeReport, _Mapping]]] = ...) -> None: ...

class OutcomesAck(_message.Message):
    __slots__ = ("applied", "unknown")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    applied: int
    unknown: int
    def __init__(self, applied: _Optional[int] = ..., unknown: _Optional[int] = ...) -> None: ...

class HedgeRequest(_message.Message):
    __slots__ = ("decision_id", "replica")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    decision_id: int
    replica: str
    def __init__(self, decision_id: _Optional[int] = ..., replica: _Optional[str] = ...) -> None: ...

class HedgeReply(_message.Message):
    __slots__ = ("found", "target")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    target: Target
    def __init__(self, found: _Optional[bool] = ..., target: _Optional[_Union[Target, _Mapping]] = ...) -> None: ...

class WantRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class WantReply(_message.Message):
    __slots__ = ("managed",)
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    managed: bool
    def __init__(self, managed: _Optional[bool] = ...) -> None: ...

class ScaleModelRequest(_message.Message):
    __slots__ = ("model", "load", "caller_certificate_pem", "caller_bearer", "peer", "config")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CALLER_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CALLER_BEARER_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    model: str
    load: bool
    caller_certificate_pem: bytes
    caller_bearer: str
    peer: str
    config: str
    def __init__(self, model: _Optional[str] = ..., load: _Optional[bool] = ..., caller_certificate_pem: _Optional[bytes] = ..., caller_bearer: _Optional[str] = ..., peer: _Optional[str] = ..., config: _Optional[str] = ...) -> None: ...

class ScaleModelReply(_message.Message):
    __slots__ = ("author",)
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    author: str
    def __init__(self, author: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelEntry(_message.Message):
    __slots__ = ("model", "version", "ready")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    ready: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., ready: _Optional[bool] = ...) -> None: ...

class ListModelsReply(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelEntry]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelEntry, _Mapping]]] = ...) -> None: ...

class RouterCounters(_message.Message):
    __slots__ = ("worker", "requests", "completed", "invalid", "hedged", "hedge_won", "failovers", "streams", "failed", "shed", "admitted", "cancelled", "refused")
    class FailedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ShedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RefusedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    INVALID_FIELD_NUMBER: _ClassVar[int]
    HEDGED_FIELD_NUMBER: _ClassVar[int]
    HEDGE_WON_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    worker: str
    requests: int
    completed: int
    invalid: int
    hedged: int
    hedge_won: int
    failovers: int
    streams: int
    failed: _containers.ScalarMap[str, int]
    shed: _containers.ScalarMap[str, int]
    admitted: int
    cancelled: int
    refused: _containers.ScalarMap[str, int]
    def __init__(self, worker: _Optional[str] = ..., requests: _Optional[int] = ..., completed: _Optional[int] = ..., invalid: _Optional[int] = ..., hedged: _Optional[int] = ..., hedge_won: _Optional[int] = ..., failovers: _Optional[int] = ..., streams: _Optional[int] = ..., failed: _Optional[_Mapping[str, int]] = ..., shed: _Optional[_Mapping[str, int]] = ..., admitted: _Optional[int] = ..., cancelled: _Optional[int] = ..., refused: _Optional[_Mapping[str, int]] = ...) -> None: ...

class RouterCountersAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
