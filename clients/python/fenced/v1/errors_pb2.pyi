from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(_message.Message):
    __slots__ = []
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    FENCE_REQUIRED: ErrorReason.Reason
    INVALID_ARGUMENT: ErrorReason.Reason
    LAYOUT_DOCUMENT: ErrorReason.Reason
    LEASE_HELD: ErrorReason.Reason
    LEASE_STALE: ErrorReason.Reason
    METHOD_NOT_PERMITTED: ErrorReason.Reason
    OUTCOME_UNKNOWN: ErrorReason.Reason
    REASON_UNSPECIFIED: ErrorReason.Reason
    RECORD_CORRUPT: ErrorReason.Reason
    REDIS_BUSY: ErrorReason.Reason
    REDIS_CLUSTER_DOWN: ErrorReason.Reason
    REDIS_LOADING: ErrorReason.Reason
    REDIS_MASTER_DOWN: ErrorReason.Reason
    REDIS_MAY_EVICT: ErrorReason.Reason
    REDIS_NOT_PERMITTED: ErrorReason.Reason
    REDIS_NO_REPLICAS: ErrorReason.Reason
    REDIS_NO_SCRIPT: ErrorReason.Reason
    REDIS_OUT_OF_MEMORY: ErrorReason.Reason
    REDIS_READ_ONLY: ErrorReason.Reason
    REDIS_TRY_AGAIN: ErrorReason.Reason
    REDIS_UNAVAILABLE: ErrorReason.Reason
    REDIS_WRITE_ERROR: ErrorReason.Reason
    REPLICATION_TIMEOUT: ErrorReason.Reason
    REQUEST_ID_REUSED: ErrorReason.Reason
    REVISION_COMPACTED: ErrorReason.Reason
    REVISION_CONFLICT: ErrorReason.Reason
    REVISION_LIMIT: ErrorReason.Reason
    SECTION_NOT_SERVED: ErrorReason.Reason
    SLUG_NOT_PERMITTED: ErrorReason.Reason
    SNAPSHOT_TOO_LARGE: ErrorReason.Reason
    TOKEN_MISSING: ErrorReason.Reason
    TOKEN_UNKNOWN: ErrorReason.Reason
    TOO_MANY_BYTES_IN_FLIGHT: ErrorReason.Reason
    TOO_MANY_CALLS_QUEUED: ErrorReason.Reason
    TOO_MANY_CLAIMS: ErrorReason.Reason
    TOO_MANY_HEALTH_WATCHERS: ErrorReason.Reason
    TOO_MANY_REPLICA_WAITS: ErrorReason.Reason
    TOO_MANY_SECTION_STREAMS: ErrorReason.Reason
    TOO_MANY_WATCHERS: ErrorReason.Reason
    UNFENCED_WRITE_NOT_PERMITTED: ErrorReason.Reason
    WATCHER_TOO_SLOW: ErrorReason.Reason
    WRITE_NOT_PERMITTED: ErrorReason.Reason
    def __init__(self) -> None: ...
