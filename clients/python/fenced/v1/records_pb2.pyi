from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CHANGE_KIND_DELETE: ChangeKind
CHANGE_KIND_PUT: ChangeKind
CHANGE_KIND_UNSPECIFIED: ChangeKind
CLAIM_EVENT_KIND_GRANTED: ClaimEventKind
CLAIM_EVENT_KIND_LAPSED: ClaimEventKind
CLAIM_EVENT_KIND_RELEASED: ClaimEventKind
CLAIM_EVENT_KIND_RENEWED: ClaimEventKind
CLAIM_EVENT_KIND_UNSPECIFIED: ClaimEventKind
DESCRIPTOR: _descriptor.FileDescriptor
LAYOUT_DOCUMENT: Layout
LAYOUT_RECORDS: Layout
LAYOUT_UNSPECIFIED: Layout
WRITE_KIND_CHECK: WriteKind
WRITE_KIND_CHECK_COUNT: WriteKind
WRITE_KIND_CHECK_RECORDS: WriteKind
WRITE_KIND_CHECK_SECTION: WriteKind
WRITE_KIND_DELETE: WriteKind
WRITE_KIND_PUT: WriteKind
WRITE_KIND_UNSPECIFIED: WriteKind

class Change(_message.Message):
    __slots__ = ["key", "kind", "record", "section"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: ChangeKind
    record: Record
    section: str
    def __init__(self, section: _Optional[str] = ..., key: _Optional[str] = ..., kind: _Optional[_Union[ChangeKind, str]] = ..., record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class ClaimEvent(_message.Message):
    __slots__ = ["epoch", "expires_at_ms", "kind", "name", "owner"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    expires_at_ms: int
    kind: ClaimEventKind
    name: str
    owner: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[ClaimEventKind, str]] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class ClaimFence(_message.Message):
    __slots__ = ["epoch", "name", "now_ms", "owner"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    name: str
    now_ms: int
    owner: str
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., now_ms: _Optional[int] = ...) -> None: ...

class FencedBatchRequest(_message.Message):
    __slots__ = ["claim", "fence", "replica_ack", "request_id", "slug", "writes"]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ACK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    claim: ClaimFence
    fence: LeaseFence
    replica_ack: ReplicaAck
    request_id: str
    slug: str
    writes: _containers.RepeatedCompositeFieldContainer[RecordWrite]
    def __init__(self, slug: _Optional[str] = ..., writes: _Optional[_Iterable[_Union[RecordWrite, _Mapping]]] = ..., fence: _Optional[_Union[LeaseFence, _Mapping]] = ..., request_id: _Optional[str] = ..., replica_ack: _Optional[_Union[ReplicaAck, _Mapping]] = ..., claim: _Optional[_Union[ClaimFence, _Mapping]] = ...) -> None: ...

class FencedBatchResponse(_message.Message):
    __slots__ = ["replayed", "replicas_acked", "revision"]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACKED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    replayed: bool
    replicas_acked: int
    revision: int
    def __init__(self, revision: _Optional[int] = ..., replayed: bool = ..., replicas_acked: _Optional[int] = ...) -> None: ...

class LayoutRequest(_message.Message):
    __slots__ = ["slug"]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    slug: str
    def __init__(self, slug: _Optional[str] = ...) -> None: ...

class LayoutResponse(_message.Message):
    __slots__ = ["layout"]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    layout: Layout
    def __init__(self, layout: _Optional[_Union[Layout, str]] = ...) -> None: ...

class LeaseFence(_message.Message):
    __slots__ = ["epoch", "now_ms", "owner"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    now_ms: int
    owner: str
    def __init__(self, owner: _Optional[str] = ..., epoch: _Optional[int] = ..., now_ms: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ["claim", "claim_epoch", "revision", "value"]
    CLAIM_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    claim: str
    claim_epoch: int
    revision: int
    value: str
    def __init__(self, revision: _Optional[int] = ..., value: _Optional[str] = ..., claim: _Optional[str] = ..., claim_epoch: _Optional[int] = ...) -> None: ...

class RecordCheck(_message.Message):
    __slots__ = ["expected", "key"]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    expected: int
    key: str
    def __init__(self, key: _Optional[str] = ..., expected: _Optional[int] = ...) -> None: ...

class RecordRequest(_message.Message):
    __slots__ = ["key", "section", "slug"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    key: str
    section: str
    slug: str
    def __init__(self, slug: _Optional[str] = ..., section: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class RecordResponse(_message.Message):
    __slots__ = ["record", "revision"]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    record: Record
    revision: int
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class RecordWrite(_message.Message):
    __slots__ = ["bind_to_claim", "checks", "count", "expected", "key", "kind", "revision_sum", "section", "value"]
    BIND_TO_CLAIM_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REVISION_SUM_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    bind_to_claim: bool
    checks: _containers.RepeatedCompositeFieldContainer[RecordCheck]
    count: int
    expected: int
    key: str
    kind: WriteKind
    revision_sum: int
    section: str
    value: str
    def __init__(self, kind: _Optional[_Union[WriteKind, str]] = ..., section: _Optional[str] = ..., key: _Optional[str] = ..., expected: _Optional[int] = ..., value: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[RecordCheck, _Mapping]]] = ..., bind_to_claim: bool = ..., count: _Optional[int] = ..., revision_sum: _Optional[int] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ["replicas", "timeout_ms"]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    timeout_ms: int
    def __init__(self, replicas: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ScanSectionRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "section", "slug"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    section: str
    slug: str
    def __init__(self, slug: _Optional[str] = ..., section: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ScanSectionResponse(_message.Message):
    __slots__ = ["next_page_token", "records", "revision", "section_revision"]
    class RecordsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Record
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SECTION_REVISION_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    records: _containers.MessageMap[str, Record]
    revision: int
    section_revision: int
    def __init__(self, records: _Optional[_Mapping[str, Record]] = ..., next_page_token: _Optional[str] = ..., revision: _Optional[int] = ..., section_revision: _Optional[int] = ...) -> None: ...

class Section(_message.Message):
    __slots__ = ["records", "revision"]
    class RecordsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Record
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    records: _containers.MessageMap[str, Record]
    revision: int
    def __init__(self, records: _Optional[_Mapping[str, Record]] = ..., revision: _Optional[int] = ...) -> None: ...

class SectionRecord(_message.Message):
    __slots__ = ["key", "more", "record", "section"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    key: str
    more: bool
    record: Record
    section: str
    def __init__(self, section: _Optional[str] = ..., key: _Optional[str] = ..., record: _Optional[_Union[Record, _Mapping]] = ..., more: bool = ...) -> None: ...

class SectionsRequest(_message.Message):
    __slots__ = ["names", "slug"]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    slug: str
    def __init__(self, slug: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class SectionsResponse(_message.Message):
    __slots__ = ["revision", "sections"]
    class SectionsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Section
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Section, _Mapping]] = ...) -> None: ...
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    sections: _containers.MessageMap[str, Section]
    def __init__(self, sections: _Optional[_Mapping[str, Section]] = ..., revision: _Optional[int] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ["revision", "section_revisions"]
    class SectionRevisionsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SECTION_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    section_revisions: _containers.ScalarMap[str, int]
    def __init__(self, revision: _Optional[int] = ..., section_revisions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StreamSectionsRequest(_message.Message):
    __slots__ = ["names", "slug"]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    slug: str
    def __init__(self, slug: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamSectionsResponse(_message.Message):
    __slots__ = ["end", "records", "restart"]
    END_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    end: SnapshotEnd
    records: _containers.RepeatedCompositeFieldContainer[SectionRecord]
    restart: bool
    def __init__(self, records: _Optional[_Iterable[_Union[SectionRecord, _Mapping]]] = ..., restart: bool = ..., end: _Optional[_Union[SnapshotEnd, _Mapping]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ["changes", "claim", "owner", "progress", "request_id", "revision", "sections", "truncated"]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    claim: ClaimEvent
    owner: str
    progress: bool
    request_id: str
    revision: int
    sections: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    def __init__(self, revision: _Optional[int] = ..., owner: _Optional[str] = ..., request_id: _Optional[str] = ..., changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., truncated: bool = ..., sections: _Optional[_Iterable[str]] = ..., progress: bool = ..., claim: _Optional[_Union[ClaimEvent, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["sections", "slug", "start_revision"]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    sections: _containers.RepeatedScalarFieldContainer[str]
    slug: str
    start_revision: int
    def __init__(self, slug: _Optional[str] = ..., start_revision: _Optional[int] = ..., sections: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ["events"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ...) -> None: ...

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class WriteKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ClaimEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
