from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MigrateRequest(_message.Message):
    __slots__ = ["dry_run", "slug", "writers_upgraded"]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    WRITERS_UPGRADED_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    slug: str
    writers_upgraded: bool
    def __init__(self, slug: _Optional[str] = ..., writers_upgraded: bool = ..., dry_run: bool = ...) -> None: ...

class MigrateResponse(_message.Message):
    __slots__ = ["already_moved", "no_state", "records", "revision", "sections"]
    ALREADY_MOVED_FIELD_NUMBER: _ClassVar[int]
    NO_STATE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    already_moved: bool
    no_state: bool
    records: int
    revision: int
    sections: _containers.RepeatedCompositeFieldContainer[MigratedSection]
    def __init__(self, records: _Optional[int] = ..., revision: _Optional[int] = ..., sections: _Optional[_Iterable[_Union[MigratedSection, _Mapping]]] = ..., already_moved: bool = ..., no_state: bool = ...) -> None: ...

class MigratedSection(_message.Message):
    __slots__ = ["bytes", "name", "records"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    name: str
    records: int
    def __init__(self, name: _Optional[str] = ..., records: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...
