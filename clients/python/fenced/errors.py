"""Typed errors of the fenced client, decoded from gRPC status details only.

fenced answers errors as a gRPC status code chosen by what the caller should
do next, with machine-readable google.rpc details in the
``grpc-status-details-bin`` trailer (ErrorInfo reason and metadata,
PreconditionFailure, BadRequest, RetryInfo). :func:`decode` reads only those
(never the message text) through one table, :data:`REASONS`, mirroring the Go
client's ``client.Decode`` (client/errors.go):

=====================  ===================  ==================================
code                   ErrorInfo reason     exception
=====================  ===================  ==================================
ABORTED                REVISION_CONFLICT    :class:`RevisionConflict`
FAILED_PRECONDITION    LEASE_STALE          :class:`StaleLease`
FAILED_PRECONDITION    LEASE_HELD           :class:`LeaseHeld`
FAILED_PRECONDITION    LAYOUT_DOCUMENT      :class:`LayoutDocument`
INVALID_ARGUMENT       REQUEST_ID_REUSED    :class:`RequestIdReused`
INVALID_ARGUMENT       (any other)          :class:`InvalidArgument`
UNAVAILABLE            REPLICATION_TIMEOUT  :class:`ReplicationTimeout`
UNAVAILABLE            REDIS_UNAVAILABLE    :class:`Unavailable`
UNAVAILABLE            REDIS_* (others)     :class:`RedisRefusal`
UNAVAILABLE            (any other)          :class:`Unavailable`
DEADLINE_EXCEEDED      (any)                :class:`DeadlineExceeded`
CANCELLED              (any)                :class:`Cancelled`
RESOURCE_EXHAUSTED     REDIS_*              :class:`RedisRefusal`
RESOURCE_EXHAUSTED     SNAPSHOT_TOO_LARGE   :class:`SnapshotTooLarge`
RESOURCE_EXHAUSTED     TOO_MANY_CALLS_QUEUED :class:`CallsQueued`
RESOURCE_EXHAUSTED     (any other)          :class:`ResourceExhausted`
OUT_OF_RANGE           REVISION_COMPACTED   :class:`RevisionCompacted`
OUT_OF_RANGE           REVISION_LIMIT       :class:`RevisionLimit`
(any other)            (any)                :class:`FencedError`
=====================  ===================  ==================================

The client itself raises :class:`RevisionWentBackwards` (a read below a swarm
revision it saw) and :class:`KeptChanging` (update's attempts ran out).

Every exception is a :class:`FencedError` carrying the status ``code``, the
ErrorInfo ``reason`` and ``metadata``, the server's ``message`` (for people,
never to be parsed) and, when it was raised by a batch sent under a request id
(:meth:`fenced.Client.fenced_batch` with ``request_id``, every batch of
:meth:`fenced.Client.update`), that ``request_id``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
from typing import Callable, Mapping, Optional, Sequence

import grpc

from . import _rpc_pb2 as rpc
from .v1 import errors_pb2
from .model import Lease

__all__ = [
    "CallsQueued",
    "Cancelled",
    "Conflict",
    "DeadlineExceeded",
    "FencedError",
    "FieldViolation",
    "InvalidArgument",
    "KeptChanging",
    "LayoutDocument",
    "BatchInFlight",
    "UpdateCancelled",
    "UpdateInterrupted",
    "FenceRequired",
    "LeaseHeld",
    "REASONS",
    "Reason",
    "RedisRefusal",
    "RequestIdReused",
    "ReplicationTimeout",
    "ResourceExhausted",
    "RevisionCompacted",
    "RevisionConflict",
    "RevisionLimit",
    "RevisionWentBackwards",
    "SnapshotTooLarge",
    "StaleLease",
    "Unavailable",
    "decode",
    "declared_reasons",
]

# The trailer carrying the serialized google.rpc.Status.
_DETAILS_KEY = "grpc-status-details-bin"


@dataclasses.dataclass(frozen=True)
class Conflict:
    """One write of a refused batch whose expected revision did not match.

    Attributes:
        section: the record's section.
        key: the record's key; empty for a section check (CheckSection).
        write: the write's index in the batch.
        expected: the revision the write named.
        actual: the stored revision (0: absent).
    """

    section: str
    key: str
    write: int
    expected: int
    actual: int


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """One bad field of a refused request: its path (``writes[3].value``) and why."""

    field: str
    description: str


class FencedError(Exception):
    """Any error answered by fenced (or by the transport to it).

    Attributes:
        code: the gRPC status code.
        reason: the ErrorInfo reason ("" when the answer had none).
        metadata: the ErrorInfo metadata (empty when none).
        message: the status message, for people: never parse it.
        request_id: the request id of the batch that raised it ("" when the
            call was not a batch sent under one). A batch that may have
            committed (Unavailable, DeadlineExceeded, Cancelled) is resent
            safely under this id: fenced answers the original revision.
    """

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.request_id = ""

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        tail = f" ({self.reason})" if self.reason else ""
        rid = f" [request id {self.request_id}]" if self.request_id else ""
        return f"fenced: {name}{tail}: {self.message}{rid}"


class StaleLease(FencedError):
    """FAILED_PRECONDITION + LEASE_STALE: the caller's lease is gone (expired,
    taken over or released). Stop writing; do not retry.

    Attributes:
        holder: the lease the server found (owner, epoch, expires_at_ms); None
            when there was none.
    """

    holder: Optional[Lease] = None


class LeaseHeld(FencedError):
    """FAILED_PRECONDITION + LEASE_HELD: another owner holds a live lease.

    Attributes:
        holder: that lease (None when the server did not say).
        retry_after: how long the holder's lease has left, in seconds (RetryInfo).
    """

    holder: Optional[Lease] = None
    retry_after: float = 0.0


class RevisionConflict(FencedError):
    """ABORTED + REVISION_CONFLICT: records changed since they were read.
    Nothing was written: read again and rerun the change.

    Attributes:
        conflicts: every conflicting write the server listed, in request order.
        total: how many conflicted (the server lists at most 64).
    """

    conflicts: Sequence[Conflict] = ()
    total: int = 0


class LayoutDocument(FencedError):
    """FAILED_PRECONDITION + LAYOUT_DOCUMENT: the swarm is stored as one
    document, which fenced serves on standalone Redis only: on Redis Cluster
    it must be moved onto records (fenced migrate, on the standalone Redis it
    lives on)."""


class FenceRequired(FencedError):
    """FAILED_PRECONDITION + FENCE_REQUIRED: the server requires a fence
    (--require-fence) for a section this unfenced batch writes; nothing was
    written. Fence it with the swarm's lease (keeper.fence()).

    Attributes:
        sections: the sections written that require one.
    """

    sections: tuple[str, ...] = ()


def _fence_required(e: FenceRequired, d: _Details) -> None:
    e.sections = tuple(s for s in e.metadata.get("sections", "").split(",") if s)


class InvalidArgument(FencedError):
    """INVALID_ARGUMENT: the request was refused as malformed; nothing was written.

    Attributes:
        violations: every bad field the server named (BadRequest).
    """

    violations: Sequence[FieldViolation] = ()


class RequestIdReused(InvalidArgument):
    """INVALID_ARGUMENT + REQUEST_ID_REUSED: the request_id names a different
    batch within the server's window; use a new id for a new change."""


class Unavailable(FencedError):
    """UNAVAILABLE: fenced or its Redis could not be reached. A batch may or
    may not have committed: resend it with the same request_id, or read first."""


class DeadlineExceeded(Unavailable):
    """DEADLINE_EXCEEDED: the call's deadline passed (the client's ``timeout``,
    an update's overall ``timeout``, or fenced's --first-message-timeout). As
    UNAVAILABLE: a batch may or may not have committed (it may still commit
    once a slow Redis catches up); resend it under its ``request_id``, or read
    first. :meth:`fenced.Client.update` raises it, with ``request_id``, when
    its own ``timeout`` runs out."""


class Cancelled(Unavailable):
    """CANCELLED: the call was cancelled before its answer came (the channel
    was closed: by :meth:`fenced.Client.close`, or around a ``fork()``; or
    fenced cancelled it). As UNAVAILABLE: a batch may or may not have
    committed; resend it under its ``request_id``. A cancellation the caller
    asked for (an asyncio task cancelled) is ``asyncio.CancelledError``, not
    this: :class:`UpdateCancelled` when an update's batch may have been sent."""


class BatchInFlight:
    """What an update (or ``fenced.port`` write) cut short by its caller
    carries when its batch may have been sent, so that the caller can learn
    whether it committed: its batch (``slug``, ``writes``, ``fence``,
    ``claim``, ``replica_ack``) and the ``request_id`` it went under. Resend
    it, ``client.fenced_batch(**e.resend_args())`` (awaited with
    fenced.aio), within the server's --request-id-window (10 min by
    default): a batch that committed answers ``replayed`` with its revision,
    writing nothing; one that did not commits now. Either way it is applied
    once."""

    slug: str = ""
    request_id: str = ""
    writes: tuple = ()  # type: ignore[type-arg]
    fence: object = None
    claim: object = None
    replica_ack: object = None

    def _in_flight(self, slug: str, request_id: str, writes: Sequence[object], fence: object, claim: object,
                   replica_ack: object) -> None:
        self.slug, self.request_id, self.writes = slug, request_id, tuple(writes)
        self.fence, self.claim, self.replica_ack = fence, claim, replica_ack

    def resend_args(self) -> dict[str, object]:
        """The arguments of ``fenced_batch`` that resend the batch under its
        request id."""
        return {"slug": self.slug, "writes": list(self.writes), "fence": self.fence, "claim": self.claim,
                "request_id": self.request_id, "replica_ack": self.replica_ack}


class UpdateCancelled(asyncio.CancelledError, BatchInFlight):
    """An ``asyncio.CancelledError`` (the task was cancelled: it stays one)
    raised by fenced.aio's ``update`` cancelled while its batch may have been
    sent (the call in flight, or its answer lost and a resend pending): a
    :class:`BatchInFlight`, whose ``request_id`` and ``resend_args()`` learn
    the outcome. A cancellation that comes while nothing of the batch left
    (the change running, a wait after a conflict) is a plain
    ``asyncio.CancelledError``: nothing was committed."""


class UpdateInterrupted(KeyboardInterrupt, BatchInFlight):
    """A ``KeyboardInterrupt`` (it stays one) raised by the sync ``update``
    or ``fenced.port`` write interrupted while its batch may have been sent:
    a :class:`BatchInFlight`, as :class:`UpdateCancelled` for asyncio. An
    update's own ``timeout`` running out raises :class:`DeadlineExceeded`
    with ``request_id`` instead."""


class ReplicationTimeout(Unavailable):
    """UNAVAILABLE + REPLICATION_TIMEOUT: the batch committed on the primary,
    but fewer replicas than asked acknowledged it in time.

    Attributes:
        revision: the committed revision.
        acked: replicas that acknowledged it.
        wanted: replicas asked for.
    """

    revision: int = 0
    acked: int = 0
    wanted: int = 0


class RedisRefusal(Unavailable):
    """fenced's Redis refused the call for a state of its own that an operator
    fixes: ``reason`` says which (REDIS_OUT_OF_MEMORY, answered
    RESOURCE_EXHAUSTED; REDIS_READ_ONLY, REDIS_WRITE_ERROR, REDIS_NO_REPLICAS,
    REDIS_BUSY, REDIS_LOADING, REDIS_MASTER_DOWN, REDIS_TRY_AGAIN,
    REDIS_CLUSTER_DOWN, REDIS_NO_SCRIPT, REDIS_NOT_PERMITTED, REDIS_MAY_EVICT,
    answered UNAVAILABLE). An Unavailable, as the Go client's
    RedisRefusalError matches ErrUnavailable: retry later, under the same
    request_id for a batch."""


class ResourceExhausted(FencedError):
    """RESOURCE_EXHAUSTED: the answer or request is over a server limit
    (e.g. SNAPSHOT_TOO_LARGE: read the section with scan_section)."""


class SnapshotTooLarge(ResourceExhausted):
    """RESOURCE_EXHAUSTED + SNAPSHOT_TOO_LARGE: a ``sections`` snapshot over
    the server's limits (``key`` empty: read the section with
    :meth:`fenced.Client.scan_section`), or one record alone over the
    limit (a foreign writer's; fenced writes at most --max-value-bytes),
    from ``record`` or ``scan_section``: nothing of it was read. As the Go
    client's ``*TooLargeError``.

    Attributes:
        section: the record's section ("" for a whole snapshot).
        key: the record's key ("" for a whole snapshot).
        bytes: the record's stored length, in bytes (0 for a whole snapshot).
        max_bytes: the server's limit, in bytes (--max-snapshot-bytes).
        next_page_token: from ``scan_section``, the page token past the
            record: ``scan_section(..., page_token=e.next_page_token)`` scans
            on past it (``skip_too_large=True`` does so by itself).
    """

    section: str = ""
    key: str = ""
    bytes: int = 0
    max_bytes: int = 0
    next_page_token: str = ""


class CallsQueued(ResourceExhausted):
    """RESOURCE_EXHAUSTED + TOO_MANY_CALLS_QUEUED: fenced's fair queue refused
    the call its turn at Redis (its caller had too many calls waiting, or it
    would not have gone before its deadline); nothing was sent to Redis,
    nothing written. The client sends such a call again by itself after
    ``retry_after`` while its timeout allows; it raises this when it does
    not. As the Go client's ``*QueuedError``.

    Attributes:
        why: "queue_full" or "deadline".
        queued: the caller's calls waiting; max_queued: how many may wait.
        retry_after: the server's delay, in seconds (RetryInfo).
    """

    why: str = ""
    queued: int = 0
    max_queued: int = 0
    retry_after: float = 0.0


class RevisionLimit(FencedError):
    """OUT_OF_RANGE + REVISION_LIMIT: the batch or lease change would issue a
    revision or epoch past 10^14-1, or meets a stored number past 2^53-1;
    nothing was written. Only a swarm whose stored numbers were set by hand
    gets there: repair them.

    Attributes:
        section: the record's section ("" when not a record).
        key: the record's key, or "revision", "epoch", "meta/<name>".
        max_revision: the largest stored number fenced reads, 2^53-1.
        max_issued: the largest revision or epoch fenced issues, 10^14-1 (0
            from a server older than this client).
    """

    section: str = ""
    key: str = ""
    max_revision: int = 0
    max_issued: int = 0


class RevisionCompacted(FencedError):
    """OUT_OF_RANGE + REVISION_COMPACTED: batches after the revision a watch was
    to resume from have left the swarm's log (it keeps at least the last 1000), or
    left it before the server's reader read them, or Redis lost batches this watch
    was sent (a restart without persistence, a failover). Read the swarm again
    (sections) and watch from that snapshot's revision.

    Attributes:
        from_revision: the revision the watch asked to start after.
        oldest: the revision of the oldest batch the log still holds (after a
            loss: the batch that followed it).
    """

    from_revision: int = 0
    oldest: int = 0


class RevisionWentBackwards(FencedError):
    """A read showed a swarm revision earlier (:func:`fenced.compare_revisions`)
    than one this Client saw before (from a read, a commit or a lease change):
    Redis lost acknowledged writes (a crash, a failover to a lagging replica, a
    restored snapshot). Records read or
    written since may be gone; fenced never issues those revisions again, so
    stale expectations fail as conflicts. Raised by the client, once: the next
    read goes on from the earlier revision. Code UNKNOWN, no reason. As the Go
    client's ErrRevisionWentBackwards.

    Attributes:
        slug: the swarm.
        highest: the latest swarm revision the client had seen.
        revision: the earlier one the read answered.
    """

    def __init__(self, slug: str, highest: int, revision: int) -> None:
        super().__init__(
            f"swarm {slug!r} revision went backwards from {highest} to {revision}: Redis lost acknowledged writes"
        )
        self.slug, self.highest, self.revision = slug, highest, revision


class KeptChanging(RevisionConflict):
    """:meth:`fenced.Client.update` met a revision conflict on every attempt;
    nothing was committed. It is also a :class:`RevisionConflict` (the last
    one's conflicts), as the Go client's ErrKeptChanging wraps the last
    *ConflictError; ``__cause__`` is that last conflict.

    Attributes:
        attempts: how many times the change ran.
        last: the last RevisionConflict.
    """

    MESSAGE = "the swarm fencing state kept changing; nothing was committed"

    def __init__(self, slug: str, attempts: int, last: RevisionConflict) -> None:
        super().__init__(
            f"update {slug} after {attempts} attempts: {self.MESSAGE}",
            code=last.code,
            reason=last.reason,
            metadata=last.metadata,
        )
        self.request_id = last.request_id
        self.attempts = attempts
        self.last = last
        self.conflicts = last.conflicts
        self.total = last.total


@dataclasses.dataclass
class _Details:
    """The decoded google.rpc details of one status."""

    info: Optional[rpc.ErrorInfo] = None
    precondition: Optional[rpc.PreconditionFailure] = None
    bad_request: Optional[rpc.BadRequest] = None
    retry: Optional[rpc.RetryInfo] = None


def _int(md: Mapping[str, str], key: str) -> int:
    """md[key] as a decimal integer; 0 when absent or malformed (as the Go client)."""
    try:
        return int(md.get(key, "0"))
    except ValueError:
        return 0


def _holder(md: Mapping[str, str]) -> Optional[Lease]:
    if "owner" not in md:
        return None
    return Lease(owner=md["owner"], epoch=_int(md, "epoch"), expires_at_ms=_int(md, "expires_at_ms"))


def _conflict(err: RevisionConflict, d: _Details) -> None:
    md = err.metadata
    err.total = _int(md, "conflicts")
    err.conflicts = []
    for i, v in enumerate(d.precondition.violations if d.precondition else ()):
        section, _, key = v.subject.partition("/")
        n = str(i)
        err.conflicts.append(
            Conflict(section, key, _int(md, "write_" + n), _int(md, "expected_" + n), _int(md, "actual_" + n))
        )


def _stale(err: StaleLease, d: _Details) -> None:
    err.holder = _holder(err.metadata)


def _held(err: LeaseHeld, d: _Details) -> None:
    err.holder = _holder(err.metadata)
    if d.retry is not None:
        err.retry_after = d.retry.retry_delay.seconds + d.retry.retry_delay.nanos / 1e9


def _invalid(err: InvalidArgument, d: _Details) -> None:
    err.violations = [
        FieldViolation(v.field, v.description) for v in (d.bad_request.field_violations if d.bad_request else ())
    ]


def _queued(err: CallsQueued, d: _Details) -> None:
    md = err.metadata
    err.why, err.queued, err.max_queued = md.get("why", ""), _int(md, "queued"), _int(md, "max_queued")
    if d.retry is not None:
        err.retry_after = d.retry.retry_delay.seconds + d.retry.retry_delay.nanos / 1e9


def _replication(err: ReplicationTimeout, d: _Details) -> None:
    md = err.metadata
    err.revision, err.acked, err.wanted = _int(md, "revision"), _int(md, "replicas_acked"), _int(md, "replicas_wanted")


def _compacted(err: RevisionCompacted, d: _Details) -> None:
    err.oldest = _int(err.metadata, "oldest_revision")


def _too_large(err: SnapshotTooLarge, d: _Details) -> None:
    md = err.metadata
    err.section, err.key, err.next_page_token = md.get("section", ""), md.get("key", ""), md.get("next_page_token", "")
    err.bytes, err.max_bytes = _int(md, "bytes"), _int(md, "max_bytes")


def _limit(err: RevisionLimit, d: _Details) -> None:
    md = err.metadata
    err.section, err.key, err.max_revision = md.get("section", ""), md.get("key", ""), _int(md, "max_revision")
    err.max_issued = _int(md, "max_issued")


_Filler = Callable[[FencedError, _Details], None]

# The reason names come from the enum declared in proto/fenced/v1/errors.proto
# (ErrorInfo.reason carries a value's name, never its number).
_Reasons = errors_pb2.ErrorReason.Reason


def _r(value: int) -> str:
    return _Reasons.Name(value)


# Redis's refusals: every reason with this prefix but REDIS_UNAVAILABLE (the
# Go client's redisRefusalPrefix; a newer server's reason with it is one too).
_REDIS_REFUSAL = "REDIS_*"


@dataclasses.dataclass(frozen=True)
class Reason:
    """One row of :data:`REASONS`: answers with this code and an ErrorInfo
    reason matching ``reason`` become ``error``, whose fields ``fill`` sets
    from the details. ``reason`` is a name, or a pattern (``REDIS_*``); ""
    matches any reason of that code (a fallback row)."""

    code: grpc.StatusCode
    reason: str
    error: type[FencedError]
    fill: Optional[_Filler] = None

    def matches(self, code: grpc.StatusCode, reason: str) -> bool:
        """Whether an answer with this code and reason is this row's."""
        return self.code == code and (self.reason == "" or fnmatch.fnmatchcase(reason, self.reason))


# REASONS is the one table of decoded errors, first match wins: exact names
# before the patterns they would also match, fallbacks (reason "") last. The
# names are fenced.v1.ErrorReason.Reason's; the rows those of the Go
# client's Decode.
REASONS: Sequence[Reason] = (
    Reason(grpc.StatusCode.ABORTED, _r(_Reasons.REVISION_CONFLICT), RevisionConflict, _conflict),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.FAILED_PRECONDITION, _r(_Reasons.LEASE_STALE), StaleLease, _stale),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.FAILED_PRECONDITION, _r(_Reasons.LEASE_HELD), LeaseHeld, _held),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.FAILED_PRECONDITION, _r(_Reasons.LAYOUT_DOCUMENT), LayoutDocument),
    Reason(grpc.StatusCode.FAILED_PRECONDITION, _r(_Reasons.FENCE_REQUIRED), FenceRequired, _fence_required),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.INVALID_ARGUMENT, _r(_Reasons.REQUEST_ID_REUSED), RequestIdReused, _invalid),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.INVALID_ARGUMENT, "", InvalidArgument, _invalid),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.UNAVAILABLE, _r(_Reasons.REPLICATION_TIMEOUT), ReplicationTimeout, _replication),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.UNAVAILABLE, _r(_Reasons.REDIS_UNAVAILABLE), Unavailable),
    Reason(grpc.StatusCode.UNAVAILABLE, _REDIS_REFUSAL, RedisRefusal),
    Reason(grpc.StatusCode.UNAVAILABLE, "", Unavailable),
    Reason(grpc.StatusCode.DEADLINE_EXCEEDED, "", DeadlineExceeded),
    Reason(grpc.StatusCode.CANCELLED, "", Cancelled),
    Reason(grpc.StatusCode.RESOURCE_EXHAUSTED, _REDIS_REFUSAL, RedisRefusal),
    Reason(grpc.StatusCode.RESOURCE_EXHAUSTED, _r(_Reasons.SNAPSHOT_TOO_LARGE), SnapshotTooLarge, _too_large),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.RESOURCE_EXHAUSTED, _r(_Reasons.TOO_MANY_CALLS_QUEUED), CallsQueued, _queued),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.RESOURCE_EXHAUSTED, "", ResourceExhausted),
    Reason(grpc.StatusCode.OUT_OF_RANGE, _r(_Reasons.REVISION_COMPACTED), RevisionCompacted, _compacted),  # type: ignore[arg-type]
    Reason(grpc.StatusCode.OUT_OF_RANGE, _r(_Reasons.REVISION_LIMIT), RevisionLimit, _limit),  # type: ignore[arg-type]
)

def declared_reasons() -> frozenset[str]:
    """Every ErrorInfo reason fenced declares: the names of
    ``fenced.v1.ErrorReason.Reason`` (proto/fenced/v1/errors.proto) but its
    zero value."""
    return frozenset(n for n, v in _Reasons.items() if v != 0)


_DETAIL_TYPES = {
    "google.rpc.ErrorInfo": ("info", rpc.ErrorInfo),
    "google.rpc.PreconditionFailure": ("precondition", rpc.PreconditionFailure),
    "google.rpc.BadRequest": ("bad_request", rpc.BadRequest),
    "google.rpc.RetryInfo": ("retry", rpc.RetryInfo),
}


def _details(trailers: Sequence[tuple[str, object]] | None) -> _Details:
    d = _Details()
    raw = next((v for k, v in trailers or () if k == _DETAILS_KEY), None)
    if not isinstance(raw, bytes):
        return d
    status = rpc.Status()
    try:
        status.ParseFromString(raw)
    except Exception:  # a malformed trailer: decode by code alone  # noqa: BLE001
        return d
    for any_ in status.details:
        name = any_.type_url.rpartition("/")[2]
        if name not in _DETAIL_TYPES:
            continue
        attr, cls = _DETAIL_TYPES[name]
        msg = cls()
        try:
            msg.ParseFromString(any_.value)
        except Exception:  # noqa: BLE001
            continue
        setattr(d, attr, msg)
    return d


def decode(err: grpc.RpcError) -> FencedError:
    """Turn a gRPC error from fenced into the typed exception of :data:`REASONS`,
    reading only the code and the google.rpc details. An error without a status
    (a transport failure) becomes :class:`FencedError` with code UNKNOWN, or
    its own code when it has one (UNAVAILABLE: :class:`Unavailable`)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    d = _details(trailers)  # type: ignore[arg-type]
    reason = d.info.reason if d.info is not None else ""
    metadata = dict(d.info.metadata) if d.info is not None else {}
    for row in REASONS:
        if row.matches(code, reason):
            out = row.error(message or "", code=code, reason=reason, metadata=metadata)
            if row.fill is not None:
                row.fill(out, d)
            return out
    return FencedError(message or "", code=code, reason=reason, metadata=metadata)
