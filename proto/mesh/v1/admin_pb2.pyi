from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("name", "address", "status", "incarnation", "roles", "zone", "region", "tags", "ports", "status_age_seconds", "is_local", "coordinate", "rtt_from_local")
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
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., status: _Optional[str] = ..., incarnation: _Optional[int] = ..., roles: _Optional[_Iterable[str]] = ..., zone: _Optional[str] = ..., region: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., ports: _Optional[_Mapping[str, int]] = ..., status_age_seconds: _Optional[float] = ..., is_local: _Optional[bool] = ..., coordinate: _Optional[_Union[Coordinate, _Mapping]] = ..., rtt_from_local: _Optional[_Union[RttEstimate, _Mapping]] = ...) -> None: ...

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
