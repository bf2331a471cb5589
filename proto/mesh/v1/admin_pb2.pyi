from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelsStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("model", "desired", "placed", "ready", "why", "refused", "demand")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    model: str
    desired: int
    placed: int
    ready: int
    why: str
    refused: str
    demand: float
    def __init__(self, model: _Optional[str] = ..., desired: _Optional[int] = ..., placed: _Optional[int] = ..., ready: _Optional[int] = ..., why: _Optional[str] = ..., refused: _Optional[str] = ..., demand: _Optional[float] = ...) -> None: ...

class ModelsStatusResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...

class LogLevelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LayerLevel(_message.Message):
    __slots__ = ("layer", "level", "inherited")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    INHERITED_FIELD_NUMBER: _ClassVar[int]
    layer: str
    level: str
    inherited: bool
    def __init__(self, layer: _Optional[str] = ..., level: _Optional[str] = ..., inherited: _Optional[bool] = ...) -> None: ...

class LogLevelsResponse(_message.Message):
    __slots__ = ("node", "level", "layers")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    node: str
    level: str
    layers: _containers.RepeatedCompositeFieldContainer[LayerLevel]
    def __init__(self, node: _Optional[str] = ..., level: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[LayerLevel, _Mapping]]] = ...) -> None: ...

class SetLogLevelRequest(_message.Message):
    __slots__ = ("layer", "level")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    layer: str
    level: str
    def __init__(self, layer: _Optional[str] = ..., level: _Optional[str] = ...) -> None: ...

class NodeFlagRequest(_message.Message):
    __slots__ = ("node", "deadline_seconds", "reason", "clear", "timeout_seconds")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node: str
    deadline_seconds: float
    reason: str
    clear: bool
    timeout_seconds: float
    def __init__(self, node: _Optional[str] = ..., deadline_seconds: _Optional[float] = ..., reason: _Optional[str] = ..., clear: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class PolicyWriteResponse(_message.Message):
    __slots__ = ("version", "document_json", "group")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    version: int
    document_json: str
    group: str
    def __init__(self, version: _Optional[int] = ..., document_json: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class PolicyApplyRequest(_message.Message):
    __slots__ = ("text", "if_version", "timeout_seconds")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    if_version: int
    timeout_seconds: float
    def __init__(self, text: _Optional[str] = ..., if_version: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class PolicyApplyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PolicyWriteResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[PolicyWriteResponse, _Mapping]]] = ...) -> None: ...

class PolicyGetRequest(_message.Message):
    __slots__ = ("kind", "name", "consistent", "timeout_seconds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    consistent: bool
    timeout_seconds: float
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., consistent: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class PolicyGetResponse(_message.Message):
    __slots__ = ("document_json", "found", "store_version")
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STORE_VERSION_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    found: bool
    store_version: int
    def __init__(self, document_json: _Optional[str] = ..., found: _Optional[bool] = ..., store_version: _Optional[int] = ...) -> None: ...

class PolicyListRequest(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    def __init__(self, kind: _Optional[str] = ...) -> None: ...

class PolicyListResponse(_message.Message):
    __slots__ = ("documents_json", "versions")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DOCUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    documents_json: _containers.RepeatedScalarFieldContainer[str]
    versions: _containers.ScalarMap[str, int]
    def __init__(self, documents_json: _Optional[_Iterable[str]] = ..., versions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class PolicyDeleteRequest(_message.Message):
    __slots__ = ("kind", "name", "if_version", "timeout_seconds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    if_version: int
    timeout_seconds: float
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., if_version: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class RaftStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RaftGroupStatus(_message.Message):
    __slots__ = ("group", "node", "address", "state", "leader", "term", "commit_index", "last_applied", "version", "has_quorum", "members", "reachable", "lag", "error")
    class LagEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    group: str
    node: str
    address: str
    state: str
    leader: str
    term: int
    commit_index: int
    last_applied: int
    version: int
    has_quorum: bool
    members: _containers.RepeatedScalarFieldContainer[str]
    reachable: _containers.RepeatedScalarFieldContainer[str]
    lag: _containers.ScalarMap[str, int]
    error: str
    def __init__(self, group: _Optional[str] = ..., node: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., version: _Optional[int] = ..., has_quorum: _Optional[bool] = ..., members: _Optional[_Iterable[str]] = ..., reachable: _Optional[_Iterable[str]] = ..., lag: _Optional[_Mapping[str, int]] = ..., error: _Optional[str] = ...) -> None: ...

class RaftStatusResponse(_message.Message):
    __slots__ = ("groups", "local_versions")
    class LocalVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[RaftGroupStatus]
    local_versions: _containers.ScalarMap[str, int]
    def __init__(self, groups: _Optional[_Iterable[_Union[RaftGroupStatus, _Mapping]]] = ..., local_versions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SubscribeEventsRequest(_message.Message):
    __slots__ = ("from_versions", "groups", "no_membership")
    class FromVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FROM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NO_MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    from_versions: _containers.ScalarMap[str, int]
    groups: _containers.RepeatedScalarFieldContainer[str]
    no_membership: bool
    def __init__(self, from_versions: _Optional[_Mapping[str, int]] = ..., groups: _Optional[_Iterable[str]] = ..., no_membership: _Optional[bool] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("group", "version", "op", "kind", "name", "document_json", "at_unix", "author")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    group: str
    version: int
    op: str
    kind: str
    name: str
    document_json: str
    at_unix: float
    author: str
    def __init__(self, group: _Optional[str] = ..., version: _Optional[int] = ..., op: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., document_json: _Optional[str] = ..., at_unix: _Optional[float] = ..., author: _Optional[str] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("group", "command_json", "timeout_seconds", "on_behalf_of", "method", "caller_certificate_pem", "caller_bearer")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMAND_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ON_BEHALF_OF_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALLER_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CALLER_BEARER_FIELD_NUMBER: _ClassVar[int]
    group: str
    command_json: str
    timeout_seconds: float
    on_behalf_of: str
    method: str
    caller_certificate_pem: bytes
    caller_bearer: str
    def __init__(self, group: _Optional[str] = ..., command_json: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., on_behalf_of: _Optional[str] = ..., method: _Optional[str] = ..., caller_certificate_pem: _Optional[bytes] = ..., caller_bearer: _Optional[str] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("result_json",)
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    result_json: str
    def __init__(self, result_json: _Optional[str] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("group", "from_version")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_version: int
    def __init__(self, group: _Optional[str] = ..., from_version: _Optional[int] = ...) -> None: ...

class FollowMessage(_message.Message):
    __slots__ = ("snapshot_json", "change_json")
    SNAPSHOT_JSON_FIELD_NUMBER: _ClassVar[int]
    CHANGE_JSON_FIELD_NUMBER: _ClassVar[int]
    snapshot_json: str
    change_json: str
    def __init__(self, snapshot_json: _Optional[str] = ..., change_json: _Optional[str] = ...) -> None: ...

class WhoamiRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoamiResponse(_message.Message):
    __slots__ = ("principal", "roles", "kind", "server")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    principal: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    server: str
    def __init__(self, principal: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ..., server: _Optional[str] = ...) -> None: ...

class KeysListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("fingerprint", "installed", "primary")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    installed: int
    primary: int
    def __init__(self, fingerprint: _Optional[str] = ..., installed: _Optional[int] = ..., primary: _Optional[int] = ...) -> None: ...

class KeysListResponse(_message.Message):
    __slots__ = ("keys", "members", "local_primary")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PRIMARY_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    members: int
    local_primary: str
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., members: _Optional[int] = ..., local_primary: _Optional[str] = ...) -> None: ...

class KeysChangeRequest(_message.Message):
    __slots__ = ("op", "key", "timeout_seconds")
    OP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    op: str
    key: str
    timeout_seconds: float
    def __init__(self, op: _Optional[str] = ..., key: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class KeysChangeResponse(_message.Message):
    __slots__ = ("fingerprint", "acked", "total", "missing", "errors")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    acked: int
    total: int
    missing: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fingerprint: _Optional[str] = ..., acked: _Optional[int] = ..., total: _Optional[int] = ..., missing: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenCreateRequest(_message.Message):
    __slots__ = ("uses", "ttl_seconds")
    USES_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    uses: int
    ttl_seconds: float
    def __init__(self, uses: _Optional[int] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class TokenCreateResponse(_message.Message):
    __slots__ = ("token", "id", "expires_unix", "uses")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    token: str
    id: str
    expires_unix: float
    uses: int
    def __init__(self, token: _Optional[str] = ..., id: _Optional[str] = ..., expires_unix: _Optional[float] = ..., uses: _Optional[int] = ...) -> None: ...

class RevokeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RevokeResponse(_message.Message):
    __slots__ = ("spiffe_id", "cutoff_unix")
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_UNIX_FIELD_NUMBER: _ClassVar[int]
    spiffe_id: str
    cutoff_unix: float
    def __init__(self, spiffe_id: _Optional[str] = ..., cutoff_unix: _Optional[float] = ...) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ("status", "role")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    status: _containers.RepeatedScalarFieldContainer[str]
    role: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Iterable[str]] = ..., role: _Optional[_Iterable[str]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("name", "address", "status", "incarnation", "roles", "zone", "region", "tags", "ports", "status_age_seconds", "is_local", "coordinate", "rtt_from_local", "flags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IS_LOCAL_FIELD_NUMBER: _ClassVar[int]
    COORDINATE_FIELD_NUMBER: _ClassVar[int]
    RTT_FROM_LOCAL_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    status: str
    incarnation: int
    roles: _containers.RepeatedScalarFieldContainer[str]
    zone: str
    region: str
    tags: _containers.ScalarMap[str, str]
    ports: _containers.ScalarMap[str, int]
    status_age_seconds: float
    is_local: bool
    coordinate: Coordinate
    rtt_from_local: RttEstimate
    flags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., status: _Optional[str] = ..., incarnation: _Optional[int] = ..., roles: _Optional[_Iterable[str]] = ..., zone: _Optional[str] = ..., region: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., ports: _Optional[_Mapping[str, int]] = ..., status_age_seconds: _Optional[float] = ..., is_local: _Optional[bool] = ..., coordinate: _Optional[_Union[Coordinate, _Mapping]] = ..., rtt_from_local: _Optional[_Union[RttEstimate, _Mapping]] = ..., flags: _Optional[_Iterable[str]] = ...) -> None: ...

class Coordinate(_message.Message):
    __slots__ = ("vec", "error", "adjustment", "height")
    VEC_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENT_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    vec: _containers.RepeatedScalarFieldContainer[float]
    error: float
    adjustment: float
    height: float
    def __init__(self, vec: _Optional[_Iterable[float]] = ..., error: _Optional[float] = ..., adjustment: _Optional[float] = ..., height: _Optional[float] = ...) -> None: ...

class RttRequest(_message.Message):
    __slots__ = ("a", "b")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ...) -> None: ...

class RttEstimate(_message.Message):
    __slots__ = ("rtt_seconds", "error", "confidence", "source", "relation", "consistent")
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RELATION_FIELD_NUMBER: _ClassVar[int]
    CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    rtt_seconds: float
    error: float
    confidence: float
    source: str
    relation: str
    consistent: bool
    def __init__(self, rtt_seconds: _Optional[float] = ..., error: _Optional[float] = ..., confidence: _Optional[float] = ..., source: _Optional[str] = ..., relation: _Optional[str] = ..., consistent: _Optional[bool] = ...) -> None: ...

class RttResponse(_message.Message):
    __slots__ = ("a", "b", "estimate", "measured_rtt_seconds", "local_node")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_NODE_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    estimate: RttEstimate
    measured_rtt_seconds: float
    local_node: str
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ..., estimate: _Optional[_Union[RttEstimate, _Mapping]] = ..., measured_rtt_seconds: _Optional[float] = ..., local_node: _Optional[str] = ...) -> None: ...

class MembersResponse(_message.Message):
    __slots__ = ("members", "local_node", "health_score")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_SCORE_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    local_node: str
    health_score: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., local_node: _Optional[str] = ..., health_score: _Optional[int] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "follow", "timeout_seconds")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    spec: str
    follow: bool
    timeout_seconds: float
    def __init__(self, spec: _Optional[str] = ..., follow: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("id", "timeout_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout_seconds: float
    def __init__(self, id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class JobLogsRequest(_message.Message):
    __slots__ = ("id", "attempt", "tail_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    attempt: int
    tail_bytes: int
    def __init__(self, id: _Optional[str] = ..., attempt: _Optional[int] = ..., tail_bytes: _Optional[int] = ...) -> None: ...

class JobLogsResponse(_message.Message):
    __slots__ = ("node", "attempt", "data", "truncated", "attempts")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    attempt: int
    data: bytes
    truncated: bool
    attempts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., attempt: _Optional[int] = ..., data: _Optional[bytes] = ..., truncated: _Optional[bool] = ..., attempts: _Optional[_Iterable[int]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Iterable[str]] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("id", "state", "attempt", "node", "gpus", "progress", "step", "loss", "message", "checkpoint", "tried", "document_json", "version", "nodes")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TRIED_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    attempt: int
    node: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    progress: float
    step: int
    loss: float
    message: str
    checkpoint: str
    tried: _containers.RepeatedScalarFieldContainer[str]
    document_json: str
    version: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., attempt: _Optional[int] = ..., node: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., progress: _Optional[float] = ..., step: _Optional[int] = ..., loss: _Optional[float] = ..., message: _Optional[str] = ..., checkpoint: _Optional[str] = ..., tried: _Optional[_Iterable[str]] = ..., document_json: _Optional[str] = ..., version: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...
