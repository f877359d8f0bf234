"""The values the fenced client takes and answers: records, writes, leases."""

from __future__ import annotations

import dataclasses
import enum
import json
import secrets
import types
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from .revisions import compare_revisions

if TYPE_CHECKING:
    from .errors import SnapshotTooLarge

__all__ = [
    "BLIND",
    "BatchResult",
    "Change",
    "Check",
    "CheckCount",
    "CheckRecords",
    "CheckSection",
    "Current",
    "Delete",
    "Event",
    "Layout",
    "Lease",
    "LeaseFence",
    "MigratedSection",
    "MigrateResult",
    "Page",
    "Put",
    "Record",
    "ReplicaAck",
    "Snapshot",
    "Write",
    "count_check",
    "dumps",
    "new_request_id",
]

BLIND = -1
"""The ``expected`` revision that disables a write's check (not allowed for Check)."""


def dumps(obj: Any, *, allow_nan: bool = False) -> str:
    """Serialise any JSON-serialisable object as compact JSON text for a put.

    No whitespace between tokens, dict keys in their insertion order, non-ASCII
    characters kept as they are (UTF-8 on the wire). NaN and infinities are
    refused (ValueError) unless ``allow_nan`` is True: then they are written
    ``NaN``, ``Infinity`` and ``-Infinity`` as json.dumps writes them by
    default, which fenced stores and serves byte for byte
    (docs/design/02-redis-layout.md §2.2) and json.loads reads back, but
    strict JSON readers (Go's encoding/json) refuse. Raises TypeError for
    objects json cannot serialise.
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)


def new_request_id() -> str:
    """A fresh random request id for fenced_batch: 32 hex digits (128 random bits)."""
    return secrets.token_hex(16)


class Layout(enum.IntEnum):
    """How a swarm's fencing state is stored in Redis (fenced.v1.Layout)."""

    UNSPECIFIED = 0
    """No fencing state yet: the first committed batch makes it RECORDS."""
    RECORDS = 1
    """One Redis hash per section, one field per record (what fenced writes)."""
    DOCUMENT = 2
    """One JSON document for the whole swarm (older writers): served through the
    same calls on standalone Redis, refused on Redis Cluster (LayoutDocument)."""


@dataclasses.dataclass(frozen=True)
class Record:
    """One stored record.

    Attributes:
        revision: the swarm revision of the batch that last put it (>= 1).
        value: its JSON text, byte for byte as its writer sent it.
        claim: the claim the record is bound to (a Put with ``bind_to_claim``,
            docs/design/12-claims.md §12.4); "" when bound to none. A bound
            record is answered only while that claim's grant of epoch
            ``claim_epoch`` is live: after its release or lapse it is absent.
        claim_epoch: the epoch of that grant; 0 when unbound.
    """

    revision: int
    value: str
    claim: str = ""
    claim_epoch: int = 0

    def json(self) -> Any:
        """The value parsed with :func:`json.loads`."""
        return json.loads(self.value)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Sections read at one instant (:meth:`fenced.Client.sections`).

    Attributes:
        revision: the swarm revision at the snapshot (0: nothing ever committed).
        sections: each section's records by key.
        section_revisions: each section's revision (fence on it with CheckSection).
    """

    revision: int
    sections: Mapping[str, Mapping[str, Record]]
    section_revisions: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of :meth:`fenced.Client.scan_section`.

    Attributes:
        records: this page's records by key (at most the page size; maybe none).
        revision: the swarm revision when the page was read.
        section_revision: the section revision when the page was read; compare
            the first and last pages' to know whether the section changed.
        next_page_token: the next page's token; "" on the last page.
        skipped: with ``scan_section(..., skip_too_large=True)``, the records
            over the server's limit the scan stepped past since the page
            before, each a :class:`fenced.SnapshotTooLarge` naming its
            ``section``, ``key`` and ``bytes``; () otherwise.
    """

    records: Mapping[str, Record]
    revision: int
    section_revision: int
    next_page_token: str
    skipped: tuple["SnapshotTooLarge", ...] = ()


@dataclasses.dataclass(frozen=True)
class Put:
    """Store ``value`` (one JSON text, a str: see :func:`dumps`) under
    (section, key), if the record is at revision ``expected`` (0: absent;
    BLIND: no check).

    ``bind_to_claim=True`` binds the record to the batch's claim (``claim=``,
    docs/design/12-claims.md §12.4): once that claim is released or lapses the
    record is absent to every read and write. A later Put without it unbinds
    the record; one under another claim rebinds it. Without ``claim=`` the
    batch is refused (InvalidArgument naming ``writes[i].bind_to_claim``)."""

    section: str
    key: str
    expected: int
    value: str
    bind_to_claim: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise TypeError(f"Put {self.section}/{self.key}: value must be JSON text (str); use fenced.dumps(obj)")


@dataclasses.dataclass(frozen=True)
class Delete:
    """Remove (section, key) if it is at revision ``expected`` (0 or BLIND:
    deleting an absent record is allowed)."""

    section: str
    key: str
    expected: int


@dataclasses.dataclass(frozen=True)
class Check:
    """Write nothing; only require (section, key) to be at revision ``expected`` (0: absent)."""

    section: str
    key: str
    expected: int


@dataclasses.dataclass(frozen=True)
class CheckSection:
    """Write nothing; require the section's revision to be ``expected``. One
    check stands for the whole section, and also catches records inserted
    since it was read (by anyone: every insert conflicts it). Caveat: only
    fenced raises section revisions, so it misses the changes of a writer that
    bypasses fenced (an older Lua batch writing the hash)."""

    section: str
    expected: int


@dataclasses.dataclass(frozen=True)
class CheckRecords:
    """Write nothing; require every record of ``checks`` (key -> the revision
    it was read at; 0: must be absent; never BLIND) in ``section`` to be at it,
    compared in the batch's atomic step: how :meth:`Client.update` fences a
    section read whole when a :class:`CheckCount` does not hold. It catches every writer's changes to those records,
    fenced's or not, and lets inserts of other keys through.

    One CheckRecords counts as one write of the batch whatever its pairs: at
    most the server's ``--max-checks`` (default 20000) pairs in all, their key
    bytes counted in ``--max-batch-value-bytes``. A key may be named once in a
    batch (not also by another write). A mismatch raises RevisionConflict with
    one Conflict per record (its ``key``, and ``write`` the CheckRecords'
    index). ``checks`` is copied into a read-only mapping, in its order.
    """

    section: str
    checks: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", types.MappingProxyType(dict(self.checks)))


REVISION_SUM_MODULUS = 10**14
"""What a :class:`CheckCount`'s ``revision_sum`` is taken modulo."""


@dataclasses.dataclass(frozen=True)
class CheckCount:
    """Write nothing; the check of a section read whole by what it held, in a
    few bytes: ``revision`` is the swarm revision the section was read at (the
    snapshot's), ``count`` how many records it held (>= 1) and
    ``revision_sum`` the sum of their revisions modulo 10**14. It passes when
    the section holds exactly ``count`` records stored at or before
    ``revision`` (issue order), summing to ``revision_sum``, and the swarm
    revision is not before it: the rule of a :class:`CheckRecords` of every
    one of them when every record read is at or before ``revision``
    (docs/design/03-fenced-batch.md §3.4). Inserts of other keys pass; a
    change or delete of a record read conflicts (a RevisionConflict whose
    first Conflict names the section, ``expected`` the revision and
    ``actual`` the count found, then one per record stored after it). It
    counts as ``count`` record checks against ``--max-checks``. Make one with
    :func:`count_check`."""

    section: str
    revision: int
    count: int
    revision_sum: int


def count_check(section: str, revision: int, records: Mapping[str, Any]) -> Optional[CheckCount]:
    """The :class:`CheckCount` of ``section`` as a snapshot read it at
    ``revision`` (``records``: key -> :class:`Record`), or None when its rule
    is not the records check's: a section read empty, or a record stored after
    ``revision`` (check those with :class:`CheckRecords`)."""
    if not records or revision < 1:
        return None
    total = 0
    for rec in records.values():
        if rec.revision < 1 or compare_revisions(rec.revision, revision) > 0:
            return None
        total += rec.revision
    return CheckCount(section, revision, len(records), total % REVISION_SUM_MODULUS)


Write = Union[Put, Delete, Check, CheckSection, CheckRecords, CheckCount]
"""One write of a batch."""


@dataclasses.dataclass(frozen=True)
class LeaseFence:
    """A batch's condition on the swarm's lease: it commits only while the
    lease is live and has this epoch (and owner, when not empty).

    Attributes:
        owner: the owner the caller believes it is; "": any owner.
        epoch: the fencing token (>= 1).
        now_ms: the caller's clock in ms since the Unix epoch; 0: unknown. It can
            only make the server's check stricter.
    """

    owner: str
    epoch: int
    now_ms: int = 0


class Unfenced:
    """The type of :data:`UNFENCED` (one instance)."""

    _one: "Optional[Unfenced]" = None

    def __new__(cls) -> "Unfenced":
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __repr__(self) -> str:
        return "fenced.UNFENCED"

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (Unfenced, ())


UNFENCED = Unfenced()
"""The ``fence`` of a batch written without the swarm's lease, by choice:
it is sent with no fence at all, so it commits on its revisions alone,
whoever holds the lease (a hive's batches, which hold none). ``fence`` left
out, or None, without a ``claim`` is refused (ValueError) before anything is
sent: an unfenced write is never an accident (docs/api.md, "Fences")."""


class _FenceMissing:
    def __repr__(self) -> str:
        return "<fence not given>"


FENCE_MISSING: Any = _FenceMissing()
"""The default of ``fence`` arguments: none was given."""

FenceArg = Union[LeaseFence, Unfenced, None]
"""What ``fence=`` takes: a LeaseFence (keeper.fence()) or UNFENCED."""

NO_FENCE_TEXT = ("no fence: pass fence=keeper.fence() (the swarm's lease), a claim=, "
                 "or fence=fenced.UNFENCED to write without one by choice")


def lease_fence(fence: Any, claim: Any) -> Optional[LeaseFence]:
    """The lease fence a batch is sent under: None for UNFENCED (or a fence
    left out beside a claim, which fences it). Raises ValueError for a fence
    left out or None without a claim, TypeError for anything else that is no
    LeaseFence."""
    if fence is UNFENCED:
        return None
    if fence is FENCE_MISSING or fence is None:
        if claim is not None:
            return None
        raise ValueError(f"fenced: {NO_FENCE_TEXT}")
    if isinstance(fence, ClaimFence):
        raise TypeError("a ClaimFence goes in claim=, not fence= (fence= is the swarm's lease)")
    if not isinstance(fence, LeaseFence):
        raise TypeError(f"fence= takes a fenced.LeaseFence (LeaseKeeper.fence()) or fenced.UNFENCED, not {type(fence).__name__}")
    return fence


@dataclasses.dataclass(frozen=True)
class ClaimFence:
    """A batch's condition on one of the swarm's claims (a named lease,
    docs/design/12-claims.md): it commits only while that claim is live and
    held by this owner at this epoch, checked in the same atomic step as the
    lease fence and every revision. A failed check raises StaleLease whose
    metadata has ``fence`` = ``claim`` and ``claim`` = the name.

    Attributes:
        name: the claim's name (1-200 bytes of ``[A-Za-z0-9._:@/-]``).
        owner: the owner the caller believes it is (required).
        epoch: the claim's fencing token, its grant's epoch (>= 1).
        now_ms: the caller's clock in ms since the Unix epoch; 0: unknown.
    """

    name: str
    owner: str
    epoch: int
    now_ms: int = 0


@dataclasses.dataclass(frozen=True)
class ReplicaAck:
    """Ask fenced to wait until ``replicas`` replicas acknowledged a commit
    (Redis WAIT), at most ``timeout_ms`` ms (0: the server's default).
    Fewer in time raises ReplicationTimeout (with the committed revision)."""

    replicas: int
    timeout_ms: int = 0


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """A committed batch.

    Attributes:
        revision: the swarm revision it committed at (for checks alone: the current one).
        replayed: True when its request_id named a batch committed before (nothing written now).
        replicas_acked: replicas that acknowledged it, when a wait was asked for.
    """

    revision: int
    replayed: bool = False
    replicas_acked: int = 0


@dataclasses.dataclass(frozen=True)
class MigratedSection:
    """What a migration writes (or, dry run, would write) for one section.

    Attributes:
        name: the section ("meta": the meta records and the layout marker).
        records: records written in it.
        bytes: bytes of their values, as stored.
    """

    name: str
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class MigrateResult:
    """A move of a swarm from the document layout onto the records
    (:meth:`fenced.Client.migrate`; AdminService/Migrate).

    Attributes:
        records: records written (dry run: would be), meta records and the
            layout marker included; 0 when already moved or without state.
        revision: the revision every written record carries; 0 when nothing was written.
        sections: the plan, one entry per section written, meta last.
        already_moved: the swarm was on the records layout already (nothing written).
        no_state: the swarm has no fencing state (nothing written).
    """

    records: int
    revision: int
    sections: tuple[MigratedSection, ...] = ()
    already_moved: bool = False
    no_state: bool = False


@dataclasses.dataclass(frozen=True)
class Lease:
    """A swarm's lease.

    Attributes:
        owner: the controller holding it.
        epoch: the fencing token (>= 1).
        expires_at_ms: when it ends, in ms since the Unix epoch by Redis's clock.
        revision: the swarm revision the grant or renewal committed at (0 when
            not from acquire/renew).
        replicas_acked: replicas that acknowledged the grant or renewal, when the
            server requires acknowledgements; else 0.
    """

    owner: str
    epoch: int
    expires_at_ms: int
    revision: int = 0
    replicas_acked: int = 0

    def fence(self, now_ms: int = 0) -> LeaseFence:
        """The fence for batches under this lease."""
        return LeaseFence(self.owner, self.epoch, now_ms)


@dataclasses.dataclass(frozen=True)
class Current:
    """A swarm's lease as Redis sees it now (:meth:`fenced.Client.current`).

    Attributes:
        lease: the lease record; None when there is none (never granted, or released).
        live: whether it is live (expires after now_ms).
        now_ms: Redis's clock, in ms since the Unix epoch.
        revision: the swarm revision (0: nothing ever committed).
    """

    lease: Optional[Lease]
    live: bool
    now_ms: int
    revision: int


@dataclasses.dataclass(frozen=True)
class Change:
    """One record a watched batch put or deleted.

    Attributes:
        section: the record's section.
        key: the record's key.
        delete: True when the batch deleted it; else it put it.
        record: for a put, the record as it stood when fenced read the event
            (a revision above the event's means a later batch overwrote it:
            its event follows); None when deleted since, or for a delete.
    """

    section: str
    key: str
    delete: bool
    record: Optional[Record]


@dataclasses.dataclass(frozen=True)
class Event:
    """One committed batch of a watched swarm (:meth:`fenced.Client.watch`).

    Attributes:
        revision: the revision it committed at; events come in issue order
            (:func:`fenced.compare_revisions`).
        owner: the lease owner that fenced it ("" when unfenced).
        request_id: its request id, when it had one.
        changes: the records it put or deleted (only the watched sections'); empty when truncated.
        truncated: it named too many keys for the log: read ``sections`` again.
        sections: for a truncated event, the sections it changed.
        progress: no batch, only how far the stream is (``revision``); yielded
            only with ``progress=True``.
        claim: what the batch did to a claim (a named lease), else None;
            yielded whatever ``sections`` names.
    """

    revision: int
    owner: str = ""
    request_id: str = ""
    changes: tuple[Change, ...] = ()
    truncated: bool = False
    sections: tuple[str, ...] = ()
    progress: bool = False
    claim: Optional["ClaimEvent"] = None


@dataclasses.dataclass(frozen=True)
class ClaimEvent:
    """One change of a claim (:attr:`Event.claim`).

    Attributes:
        name: the claim's name.
        kind: "granted" (a new grant, a new epoch), "renewed", "released" or
            "lapsed" (expired unrenewed and reclaimed by fenced).
        owner: the claim's owner.
        epoch: the grant's epoch, its fencing token.
        expires_at_ms: when the grant ends (for a release or a lapse: when it
            ended), ms since the Unix epoch by Redis's clock.
    """

    name: str
    kind: str
    owner: str
    epoch: int
    expires_at_ms: int
