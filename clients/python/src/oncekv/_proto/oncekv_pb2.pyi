from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ValueKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_KIND_UNSPECIFIED: _ClassVar[ValueKind]
    VALUE_KIND_BYTES: _ClassVar[ValueKind]
    VALUE_KIND_INT: _ClassVar[ValueKind]
    VALUE_KIND_LIST: _ClassVar[ValueKind]

class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_UNSPECIFIED: _ClassVar[Reason]
    NOT_LEADER: _ClassVar[Reason]
    UNAVAILABLE: _ClassVar[Reason]
    TOO_MANY_OUTSTANDING: _ClassVar[Reason]
    RESOURCE_EXHAUSTED: _ClassVar[Reason]
    SESSION_EXPIRED: _ClassVar[Reason]
    WRONG_CLUSTER: _ClassVar[Reason]
    SEQ_CONFLICT: _ClassVar[Reason]
    RESPONSE_DISCARDED: _ClassVar[Reason]
    INVALID_ARGUMENT: _ClassVar[Reason]
    LIMIT_EXCEEDED: _ClassVar[Reason]
    PERMISSION_DENIED: _ClassVar[Reason]
    UNAUTHENTICATED: _ClassVar[Reason]
    KEY_CONFLICT: _ClassVar[Reason]
    FENCED: _ClassVar[Reason]
    NOT_CAUGHT_UP: _ClassVar[Reason]
VALUE_KIND_UNSPECIFIED: ValueKind
VALUE_KIND_BYTES: ValueKind
VALUE_KIND_INT: ValueKind
VALUE_KIND_LIST: ValueKind
REASON_UNSPECIFIED: Reason
NOT_LEADER: Reason
UNAVAILABLE: Reason
TOO_MANY_OUTSTANDING: Reason
RESOURCE_EXHAUSTED: Reason
SESSION_EXPIRED: Reason
WRONG_CLUSTER: Reason
SEQ_CONFLICT: Reason
RESPONSE_DISCARDED: Reason
INVALID_ARGUMENT: Reason
LIMIT_EXCEEDED: Reason
PERMISSION_DENIED: Reason
UNAUTHENTICATED: Reason
KEY_CONFLICT: Reason
FENCED: Reason
NOT_CAUGHT_UP: Reason

class Value(_message.Message):
    __slots__ = ("bytes", "int", "list")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    INT_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    bytes: bytes
    int: int
    list: ListValue
    def __init__(self, bytes: _Optional[bytes] = ..., int: _Optional[int] = ..., list: _Optional[_Union[ListValue, _Mapping]] = ...) -> None: ...

class ListValue(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, items: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("put", "delete", "increment", "append", "compare_and_swap")
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    INCREMENT_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SWAP_FIELD_NUMBER: _ClassVar[int]
    put: Put
    delete: Delete
    increment: Increment
    append: Append
    compare_and_swap: CompareAndSwap
    def __init__(self, put: _Optional[_Union[Put, _Mapping]] = ..., delete: _Optional[_Union[Delete, _Mapping]] = ..., increment: _Optional[_Union[Increment, _Mapping]] = ..., append: _Optional[_Union[Append, _Mapping]] = ..., compare_and_swap: _Optional[_Union[CompareAndSwap, _Mapping]] = ...) -> None: ...

class Put(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: Value
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Delete(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class Increment(_message.Message):
    __slots__ = ("key", "delta")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    delta: int
    def __init__(self, key: _Optional[bytes] = ..., delta: _Optional[int] = ...) -> None: ...

class Append(_message.Message):
    __slots__ = ("key", "element")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    element: bytes
    def __init__(self, key: _Optional[bytes] = ..., element: _Optional[bytes] = ...) -> None: ...

class CompareAndSwap(_message.Message):
    __slots__ = ("key", "expected", "new_value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    expected: Value
    new_value: Value
    def __init__(self, key: _Optional[bytes] = ..., expected: _Optional[_Union[Value, _Mapping]] = ..., new_value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("stored", "deleted", "incremented", "overflow", "appended", "compare_and_swap", "wrong_type")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    INCREMENTED_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SWAP_FIELD_NUMBER: _ClassVar[int]
    WRONG_TYPE_FIELD_NUMBER: _ClassVar[int]
    stored: Stored
    deleted: Deleted
    incremented: Incremented
    overflow: Overflow
    appended: Appended
    compare_and_swap: CompareAndSwapResult
    wrong_type: WrongType
    def __init__(self, stored: _Optional[_Union[Stored, _Mapping]] = ..., deleted: _Optional[_Union[Deleted, _Mapping]] = ..., incremented: _Optional[_Union[Incremented, _Mapping]] = ..., overflow: _Optional[_Union[Overflow, _Mapping]] = ..., appended: _Optional[_Union[Appended, _Mapping]] = ..., compare_and_swap: _Optional[_Union[CompareAndSwapResult, _Mapping]] = ..., wrong_type: _Optional[_Union[WrongType, _Mapping]] = ...) -> None: ...

class Stored(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Deleted(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class Incremented(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class Overflow(_message.Message):
    __slots__ = ("current",)
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    current: int
    def __init__(self, current: _Optional[int] = ...) -> None: ...

class Appended(_message.Message):
    __slots__ = ("length",)
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    length: int
    def __init__(self, length: _Optional[int] = ...) -> None: ...

class CompareAndSwapResult(_message.Message):
    __slots__ = ("swapped", "current")
    SWAPPED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    swapped: bool
    current: Value
    def __init__(self, swapped: _Optional[bool] = ..., current: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class WrongType(_message.Message):
    __slots__ = ("actual",)
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    actual: ValueKind
    def __init__(self, actual: _Optional[_Union[ValueKind, str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("cluster_id", "nonce")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    nonce: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("cluster_id", "client_id", "session_ttl_ms", "window", "duplicate", "limits")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    client_id: int
    session_ttl_ms: int
    window: int
    duplicate: bool
    limits: RequestLimits
    def __init__(self, cluster_id: _Optional[bytes] = ..., client_id: _Optional[int] = ..., session_ttl_ms: _Optional[int] = ..., window: _Optional[int] = ..., duplicate: _Optional[bool] = ..., limits: _Optional[_Union[RequestLimits, _Mapping]] = ...) -> None: ...

class RequestLimits(_message.Message):
    __slots__ = ("key_bytes_max", "value_bytes_max", "list_elements_max")
    KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    LIST_ELEMENTS_MAX_FIELD_NUMBER: _ClassVar[int]
    key_bytes_max: int
    value_bytes_max: int
    list_elements_max: int
    def __init__(self, key_bytes_max: _Optional[int] = ..., value_bytes_max: _Optional[int] = ..., list_elements_max: _Optional[int] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("cluster_id", "client_id", "seq", "first_outstanding_seq", "command")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTSTANDING_SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    client_id: int
    seq: int
    first_outstanding_seq: int
    command: Command
    def __init__(self, cluster_id: _Optional[bytes] = ..., client_id: _Optional[int] = ..., seq: _Optional[int] = ..., first_outstanding_seq: _Optional[int] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class ExecutePlainRequest(_message.Message):
    __slots__ = ("cluster_id", "command")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    command: Command
    def __init__(self, cluster_id: _Optional[bytes] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class ExecuteKeyedRequest(_message.Message):
    __slots__ = ("cluster_id", "idempotency_key", "command")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    idempotency_key: bytes
    command: Command
    def __init__(self, cluster_id: _Optional[bytes] = ..., idempotency_key: _Optional[bytes] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class ExecuteReply(_message.Message):
    __slots__ = ("result", "duplicate", "log_index")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    result: CommandResult
    duplicate: bool
    log_index: int
    def __init__(self, result: _Optional[_Union[CommandResult, _Mapping]] = ..., duplicate: _Optional[bool] = ..., log_index: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("cluster_id", "client_id", "first_outstanding_seq")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTSTANDING_SEQ_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    client_id: int
    first_outstanding_seq: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., client_id: _Optional[int] = ..., first_outstanding_seq: _Optional[int] = ...) -> None: ...

class KeepAliveReply(_message.Message):
    __slots__ = ("floor", "session_ttl_ms", "limits")
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    floor: int
    session_ttl_ms: int
    limits: RequestLimits
    def __init__(self, floor: _Optional[int] = ..., session_ttl_ms: _Optional[int] = ..., limits: _Optional[_Union[RequestLimits, _Mapping]] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("cluster_id", "client_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    client_id: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., client_id: _Optional[int] = ...) -> None: ...

class UnregisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("cluster_id", "key")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    key: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., key: _Optional[bytes] = ...) -> None: ...

class ReadReply(_message.Message):
    __slots__ = ("value", "applied_index")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    value: Value
    applied_index: int
    def __init__(self, value: _Optional[_Union[Value, _Mapping]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "peer_addr", "client_addr", "voter")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    peer_addr: str
    client_addr: str
    voter: bool
    def __init__(self, node_id: _Optional[int] = ..., peer_addr: _Optional[str] = ..., client_addr: _Optional[str] = ..., voter: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader_id", "leader_client_addr", "last_log_index", "applied_index", "snapshot_index", "purged_index", "cluster_id", "members", "state_hash", "cluster_time_ms", "sessions", "idempotency_keys", "state_hash_index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PURGED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    STATE_HASH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_FIELD_NUMBER: _ClassVar[int]
    STATE_HASH_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    term: int
    leader_id: int
    leader_client_addr: str
    last_log_index: int
    applied_index: int
    snapshot_index: int
    purged_index: int
    cluster_id: bytes
    members: _containers.RepeatedCompositeFieldContainer[Member]
    state_hash: str
    cluster_time_ms: int
    sessions: int
    idempotency_keys: int
    state_hash_index: int
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_client_addr: _Optional[str] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., purged_index: _Optional[int] = ..., cluster_id: _Optional[bytes] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., state_hash: _Optional[str] = ..., cluster_time_ms: _Optional[int] = ..., sessions: _Optional[int] = ..., idempotency_keys: _Optional[int] = ..., state_hash_index: _Optional[int] = ...) -> None: ...

class AddLearnerRequest(_message.Message):
    __slots__ = ("cluster_id", "node_id", "peer_addr", "client_addr", "timeout_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    node_id: int
    peer_addr: str
    client_addr: str
    timeout_ms: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., node_id: _Optional[int] = ..., peer_addr: _Optional[str] = ..., client_addr: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class AddLearnerReply(_message.Message):
    __slots__ = ("log_index", "matched_index", "members")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    matched_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, log_index: _Optional[int] = ..., matched_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class ChangeVotersRequest(_message.Message):
    __slots__ = ("cluster_id", "voters")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    voters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster_id: _Optional[bytes] = ..., voters: _Optional[_Iterable[int]] = ...) -> None: ...

class ChangeVotersReply(_message.Message):
    __slots__ = ("log_index", "members")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, log_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("cluster_id", "node_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    node_id: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., node_id: _Optional[int] = ...) -> None: ...

class RemoveNodeReply(_message.Message):
    __slots__ = ("log_index", "members")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, log_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("client_id", "floor", "cached_responses", "cached_bytes", "last_activity_ms", "idle_ms", "owner")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    CACHED_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    floor: int
    cached_responses: int
    cached_bytes: int
    last_activity_ms: int
    idle_ms: int
    owner: str
    def __init__(self, client_id: _Optional[int] = ..., floor: _Optional[int] = ..., cached_responses: _Optional[int] = ..., cached_bytes: _Optional[int] = ..., last_activity_ms: _Optional[int] = ..., idle_ms: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("after_client_id", "limit")
    AFTER_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_client_id: int
    limit: int
    def __init__(self, after_client_id: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListSessionsReply(_message.Message):
    __slots__ = ("sessions", "applied_index", "more", "cluster_time_ms")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    applied_index: int
    more: bool
    cluster_time_ms: int
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., applied_index: _Optional[int] = ..., more: _Optional[bool] = ..., cluster_time_ms: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    def __init__(self, client_id: _Optional[int] = ...) -> None: ...

class ExpireSessionRequest(_message.Message):
    __slots__ = ("cluster_id", "client_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    client_id: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., client_id: _Optional[int] = ...) -> None: ...

class ExpireSessionReply(_message.Message):
    __slots__ = ("log_index",)
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    def __init__(self, log_index: _Optional[int] = ...) -> None: ...

class RegistryConfig(_message.Message):
    __slots__ = ("session_ttl_ms", "sessions_max", "window", "cached_bytes_per_session_max", "key_bytes_max", "value_bytes_max", "list_elements_max", "keys_max", "idempotency_key_ttl_ms", "idempotency_keys_max", "idempotency_key_bytes_max", "idempotency_cached_bytes_max", "claim_ttl_ms", "claims_max", "claim_key_bytes_max", "claim_result_bytes_max", "claim_cached_bytes_max", "lease_ms_max", "memory_budget_bytes", "principal_quota_percent", "rules_version")
    SESSION_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_MAX_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_PER_SESSION_MAX_FIELD_NUMBER: _ClassVar[int]
    KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    LIST_ELEMENTS_MAX_FIELD_NUMBER: _ClassVar[int]
    KEYS_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_CACHED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_RESULT_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_CACHED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_QUOTA_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_ttl_ms: int
    sessions_max: int
    window: int
    cached_bytes_per_session_max: int
    key_bytes_max: int
    value_bytes_max: int
    list_elements_max: int
    keys_max: int
    idempotency_key_ttl_ms: int
    idempotency_keys_max: int
    idempotency_key_bytes_max: int
    idempotency_cached_bytes_max: int
    claim_ttl_ms: int
    claims_max: int
    claim_key_bytes_max: int
    claim_result_bytes_max: int
    claim_cached_bytes_max: int
    lease_ms_max: int
    memory_budget_bytes: int
    principal_quota_percent: int
    rules_version: int
    def __init__(self, session_ttl_ms: _Optional[int] = ..., sessions_max: _Optional[int] = ..., window: _Optional[int] = ..., cached_bytes_per_session_max: _Optional[int] = ..., key_bytes_max: _Optional[int] = ..., value_bytes_max: _Optional[int] = ..., list_elements_max: _Optional[int] = ..., keys_max: _Optional[int] = ..., idempotency_key_ttl_ms: _Optional[int] = ..., idempotency_keys_max: _Optional[int] = ..., idempotency_key_bytes_max: _Optional[int] = ..., idempotency_cached_bytes_max: _Optional[int] = ..., claim_ttl_ms: _Optional[int] = ..., claims_max: _Optional[int] = ..., claim_key_bytes_max: _Optional[int] = ..., claim_result_bytes_max: _Optional[int] = ..., claim_cached_bytes_max: _Optional[int] = ..., lease_ms_max: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., principal_quota_percent: _Optional[int] = ..., rules_version: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetConfigReply(_message.Message):
    __slots__ = ("config", "applied_index")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    config: RegistryConfig
    applied_index: int
    def __init__(self, config: _Optional[_Union[RegistryConfig, _Mapping]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class RegistryConfigPatch(_message.Message):
    __slots__ = ("session_ttl_ms", "sessions_max", "window", "cached_bytes_per_session_max", "key_bytes_max", "value_bytes_max", "list_elements_max", "keys_max", "idempotency_key_ttl_ms", "idempotency_keys_max", "idempotency_key_bytes_max", "idempotency_cached_bytes_max", "claim_ttl_ms", "claims_max", "claim_key_bytes_max", "claim_result_bytes_max", "claim_cached_bytes_max", "lease_ms_max", "memory_budget_bytes", "principal_quota_percent", "rules_version")
    SESSION_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_MAX_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_PER_SESSION_MAX_FIELD_NUMBER: _ClassVar[int]
    KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    LIST_ELEMENTS_MAX_FIELD_NUMBER: _ClassVar[int]
    KEYS_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_CACHED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_KEY_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_RESULT_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CLAIM_CACHED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_QUOTA_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_ttl_ms: int
    sessions_max: int
    window: int
    cached_bytes_per_session_max: int
    key_bytes_max: int
    value_bytes_max: int
    list_elements_max: int
    keys_max: int
    idempotency_key_ttl_ms: int
    idempotency_keys_max: int
    idempotency_key_bytes_max: int
    idempotency_cached_bytes_max: int
    claim_ttl_ms: int
    claims_max: int
    claim_key_bytes_max: int
    claim_result_bytes_max: int
    claim_cached_bytes_max: int
    lease_ms_max: int
    memory_budget_bytes: int
    principal_quota_percent: int
    rules_version: int
    def __init__(self, session_ttl_ms: _Optional[int] = ..., sessions_max: _Optional[int] = ..., window: _Optional[int] = ..., cached_bytes_per_session_max: _Optional[int] = ..., key_bytes_max: _Optional[int] = ..., value_bytes_max: _Optional[int] = ..., list_elements_max: _Optional[int] = ..., keys_max: _Optional[int] = ..., idempotency_key_ttl_ms: _Optional[int] = ..., idempotency_keys_max: _Optional[int] = ..., idempotency_key_bytes_max: _Optional[int] = ..., idempotency_cached_bytes_max: _Optional[int] = ..., claim_ttl_ms: _Optional[int] = ..., claims_max: _Optional[int] = ..., claim_key_bytes_max: _Optional[int] = ..., claim_result_bytes_max: _Optional[int] = ..., claim_cached_bytes_max: _Optional[int] = ..., lease_ms_max: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., principal_quota_percent: _Optional[int] = ..., rules_version: _Optional[int] = ...) -> None: ...

class SetConfigRequest(_message.Message):
    __slots__ = ("cluster_id", "patch")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    patch: RegistryConfigPatch
    def __init__(self, cluster_id: _Optional[bytes] = ..., patch: _Optional[_Union[RegistryConfigPatch, _Mapping]] = ...) -> None: ...

class SetConfigReply(_message.Message):
    __slots__ = ("log_index", "config")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    config: RegistryConfig
    def __init__(self, log_index: _Optional[int] = ..., config: _Optional[_Union[RegistryConfig, _Mapping]] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("principal", "idempotency_key", "created_ms", "age_ms", "expires_after_ms", "fingerprint", "result", "refusal", "size_bytes")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    principal: str
    idempotency_key: bytes
    created_ms: int
    age_ms: int
    expires_after_ms: int
    fingerprint: bytes
    result: CommandResult
    refusal: LimitRefusal
    size_bytes: int
    def __init__(self, principal: _Optional[str] = ..., idempotency_key: _Optional[bytes] = ..., created_ms: _Optional[int] = ..., age_ms: _Optional[int] = ..., expires_after_ms: _Optional[int] = ..., fingerprint: _Optional[bytes] = ..., result: _Optional[_Union[CommandResult, _Mapping]] = ..., refusal: _Optional[_Union[LimitRefusal, _Mapping]] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class LimitRefusal(_message.Message):
    __slots__ = ("limit", "limit_max", "limit_requested")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MAX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    limit: str
    limit_max: int
    limit_requested: int
    def __init__(self, limit: _Optional[str] = ..., limit_max: _Optional[int] = ..., limit_requested: _Optional[int] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("after_principal", "after_key", "limit")
    AFTER_PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    AFTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_principal: str
    after_key: bytes
    limit: int
    def __init__(self, after_principal: _Optional[str] = ..., after_key: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class ListKeysReply(_message.Message):
    __slots__ = ("keys", "applied_index", "more", "cluster_time_ms")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    applied_index: int
    more: bool
    cluster_time_ms: int
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., applied_index: _Optional[int] = ..., more: _Optional[bool] = ..., cluster_time_ms: _Optional[int] = ...) -> None: ...

class GetKeyRequest(_message.Message):
    __slots__ = ("principal", "idempotency_key")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    principal: str
    idempotency_key: bytes
    def __init__(self, principal: _Optional[str] = ..., idempotency_key: _Optional[bytes] = ...) -> None: ...

class GetKeyReply(_message.Message):
    __slots__ = ("key", "applied_index", "cluster_time_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    key: KeyInfo
    applied_index: int
    cluster_time_ms: int
    def __init__(self, key: _Optional[_Union[KeyInfo, _Mapping]] = ..., applied_index: _Optional[int] = ..., cluster_time_ms: _Optional[int] = ...) -> None: ...

class ForgetKeyRequest(_message.Message):
    __slots__ = ("cluster_id", "principal", "idempotency_key")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    principal: str
    idempotency_key: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., principal: _Optional[str] = ..., idempotency_key: _Optional[bytes] = ...) -> None: ...

class ForgetKeyReply(_message.Message):
    __slots__ = ("log_index", "existed")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    existed: bool
    def __init__(self, log_index: _Optional[int] = ..., existed: _Optional[bool] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("cluster_id", "key", "fingerprint", "lease_ms", "claim_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    key: bytes
    fingerprint: bytes
    lease_ms: int
    claim_id: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., fingerprint: _Optional[bytes] = ..., lease_ms: _Optional[int] = ..., claim_id: _Optional[bytes] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("won", "in_progress", "completed", "log_index")
    WON_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    won: ClaimWon
    in_progress: ClaimInProgress
    completed: ClaimCompleted
    log_index: int
    def __init__(self, won: _Optional[_Union[ClaimWon, _Mapping]] = ..., in_progress: _Optional[_Union[ClaimInProgress, _Mapping]] = ..., completed: _Optional[_Union[ClaimCompleted, _Mapping]] = ..., log_index: _Optional[int] = ...) -> None: ...

class ClaimWon(_message.Message):
    __slots__ = ("fence", "attempt", "lease_ms_left", "lease_deadline_ms", "cluster_time_ms", "duplicate")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_LEFT_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    fence: int
    attempt: int
    lease_ms_left: int
    lease_deadline_ms: int
    cluster_time_ms: int
    duplicate: bool
    def __init__(self, fence: _Optional[int] = ..., attempt: _Optional[int] = ..., lease_ms_left: _Optional[int] = ..., lease_deadline_ms: _Optional[int] = ..., cluster_time_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class ClaimInProgress(_message.Message):
    __slots__ = ("retry_after_ms", "attempt")
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    retry_after_ms: int
    attempt: int
    def __init__(self, retry_after_ms: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class ClaimCompleted(_message.Message):
    __slots__ = ("result", "completed_ms", "fence", "attempt")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_MS_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    result: bytes
    completed_ms: int
    fence: int
    attempt: int
    def __init__(self, result: _Optional[bytes] = ..., completed_ms: _Optional[int] = ..., fence: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class CompleteClaimRequest(_message.Message):
    __slots__ = ("cluster_id", "key", "fence", "result")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    key: bytes
    fence: int
    result: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., fence: _Optional[int] = ..., result: _Optional[bytes] = ...) -> None: ...

class CompleteClaimReply(_message.Message):
    __slots__ = ("completed_ms", "duplicate", "log_index")
    COMPLETED_MS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    completed_ms: int
    duplicate: bool
    log_index: int
    def __init__(self, completed_ms: _Optional[int] = ..., duplicate: _Optional[bool] = ..., log_index: _Optional[int] = ...) -> None: ...

class ReleaseClaimRequest(_message.Message):
    __slots__ = ("cluster_id", "key", "fence")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    key: bytes
    fence: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., fence: _Optional[int] = ...) -> None: ...

class ReleaseClaimReply(_message.Message):
    __slots__ = ("duplicate", "log_index")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    log_index: int
    def __init__(self, duplicate: _Optional[bool] = ..., log_index: _Optional[int] = ...) -> None: ...

class ExtendClaimRequest(_message.Message):
    __slots__ = ("cluster_id", "key", "fence", "lease_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    key: bytes
    fence: int
    lease_ms: int
    def __init__(self, cluster_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., fence: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ExtendClaimReply(_message.Message):
    __slots__ = ("lease_deadline_ms", "cluster_time_ms", "lease_ms_left", "log_index")
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_LEFT_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    lease_deadline_ms: int
    cluster_time_ms: int
    lease_ms_left: int
    log_index: int
    def __init__(self, lease_deadline_ms: _Optional[int] = ..., cluster_time_ms: _Optional[int] = ..., lease_ms_left: _Optional[int] = ..., log_index: _Optional[int] = ...) -> None: ...

class ClaimInfo(_message.Message):
    __slots__ = ("principal", "key", "fingerprint", "fence", "attempt", "state", "at_ms", "result", "expires_after_ms", "size_bytes")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    principal: str
    key: bytes
    fingerprint: bytes
    fence: int
    attempt: int
    state: str
    at_ms: int
    result: bytes
    expires_after_ms: int
    size_bytes: int
    def __init__(self, principal: _Optional[str] = ..., key: _Optional[bytes] = ..., fingerprint: _Optional[bytes] = ..., fence: _Optional[int] = ..., attempt: _Optional[int] = ..., state: _Optional[str] = ..., at_ms: _Optional[int] = ..., result: _Optional[bytes] = ..., expires_after_ms: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ListClaimsRequest(_message.Message):
    __slots__ = ("after_principal", "after_key", "limit")
    AFTER_PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    AFTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_principal: str
    after_key: bytes
    limit: int
    def __init__(self, after_principal: _Optional[str] = ..., after_key: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class ListClaimsReply(_message.Message):
    __slots__ = ("claims", "applied_index", "more", "cluster_time_ms")
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    claims: _containers.RepeatedCompositeFieldContainer[ClaimInfo]
    applied_index: int
    more: bool
    cluster_time_ms: int
    def __init__(self, claims: _Optional[_Iterable[_Union[ClaimInfo, _Mapping]]] = ..., applied_index: _Optional[int] = ..., more: _Optional[bool] = ..., cluster_time_ms: _Optional[int] = ...) -> None: ...

class GetClaimRequest(_message.Message):
    __slots__ = ("principal", "key")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    principal: str
    key: bytes
    def __init__(self, principal: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class GetClaimReply(_message.Message):
    __slots__ = ("claim", "applied_index", "cluster_time_ms")
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    claim: ClaimInfo
    applied_index: int
    cluster_time_ms: int
    def __init__(self, claim: _Optional[_Union[ClaimInfo, _Mapping]] = ..., applied_index: _Optional[int] = ..., cluster_time_ms: _Optional[int] = ...) -> None: ...

class ForgetClaimRequest(_message.Message):
    __slots__ = ("cluster_id", "principal", "key")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    principal: str
    key: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., principal: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class ForgetClaimReply(_message.Message):
    __slots__ = ("log_index", "existed")
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    log_index: int
    existed: bool
    def __init__(self, log_index: _Optional[int] = ..., existed: _Optional[bool] = ...) -> None: ...

class TriggerSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TriggerSnapshotReply(_message.Message):
    __slots__ = ("snapshot_index",)
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    snapshot_index: int
    def __init__(self, snapshot_index: _Optional[int] = ...) -> None: ...

class StateHashRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StateHashReply(_message.Message):
    __slots__ = ("applied_index", "state_hash", "cluster_time_ms", "node_id")
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_HASH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    state_hash: str
    cluster_time_ms: int
    node_id: int
    def __init__(self, applied_index: _Optional[int] = ..., state_hash: _Optional[str] = ..., cluster_time_ms: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class LocalReadRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class LocalReadReply(_message.Message):
    __slots__ = ("value", "applied_index")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    value: Value
    applied_index: int
    def __init__(self, value: _Optional[_Union[Value, _Mapping]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("drop_execute_replies",)
    DROP_EXECUTE_REPLIES_FIELD_NUMBER: _ClassVar[int]
    drop_execute_replies: int
    def __init__(self, drop_execute_replies: _Optional[int] = ...) -> None: ...

class InjectFaultReply(_message.Message):
    __slots__ = ("drop_execute_replies_pending",)
    DROP_EXECUTE_REPLIES_PENDING_FIELD_NUMBER: _ClassVar[int]
    drop_execute_replies_pending: int
    def __init__(self, drop_execute_replies_pending: _Optional[int] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("reason", "leader_client_addr", "leader_id", "floor", "window", "limit", "expected_cluster_id", "limit_max", "limit_requested", "floor_bound", "current_fence", "nothing_proposed")
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MAX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_BOUND_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FENCE_FIELD_NUMBER: _ClassVar[int]
    NOTHING_PROPOSED_FIELD_NUMBER: _ClassVar[int]
    reason: Reason
    leader_client_addr: str
    leader_id: int
    floor: int
    window: int
    limit: str
    expected_cluster_id: bytes
    limit_max: int
    limit_requested: int
    floor_bound: int
    current_fence: int
    nothing_proposed: bool
    def __init__(self, reason: _Optional[_Union[Reason, str]] = ..., leader_client_addr: _Optional[str] = ..., leader_id: _Optional[int] = ..., floor: _Optional[int] = ..., window: _Optional[int] = ..., limit: _Optional[str] = ..., expected_cluster_id: _Optional[bytes] = ..., limit_max: _Optional[int] = ..., limit_requested: _Optional[int] = ..., floor_bound: _Optional[int] = ..., current_fence: _Optional[int] = ..., nothing_proposed: _Optional[bool] = ...) -> None: ...

class RaftMessage(_message.Message):
    __slots__ = ("cluster_id", "from_node_id", "payload")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    cluster_id: bytes
    from_node_id: int
    payload: bytes
    def __init__(self, cluster_id: _Optional[bytes] = ..., from_node_id: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...
