from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcquireRequest(_message.Message):
    __slots__ = ["name", "owner", "slug", "ttl_ms"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    slug: str
    ttl_ms: int
    def __init__(self, slug: _Optional[str] = ..., owner: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ["lease", "replicas_acked", "revision"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACKED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    replicas_acked: int
    revision: int
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., revision: _Optional[int] = ..., replicas_acked: _Optional[int] = ...) -> None: ...

class CurrentRequest(_message.Message):
    __slots__ = ["name", "slug"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    name: str
    slug: str
    def __init__(self, slug: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class CurrentResponse(_message.Message):
    __slots__ = ["lease", "live", "now_ms", "revision"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    live: bool
    now_ms: int
    revision: int
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., live: bool = ..., now_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ["epoch", "expires_at_ms", "name", "owner"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    expires_at_ms: int
    name: str
    owner: str
    def __init__(self, owner: _Optional[str] = ..., epoch: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class LeaseName(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["epoch", "name", "owner", "slug"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    name: str
    owner: str
    slug: str
    def __init__(self, slug: _Optional[str] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ["revision"]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ["epoch", "name", "owner", "slug", "ttl_ms"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    name: str
    owner: str
    slug: str
    ttl_ms: int
    def __init__(self, slug: _Optional[str] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ["lease", "replicas_acked", "revision"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACKED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    replicas_acked: int
    revision: int
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., revision: _Optional[int] = ..., replicas_acked: _Optional[int] = ...) -> None: ...
