"""The fenced client: one channel to fenced, methods mirroring its RPCs."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import grpc

from . import errors
from . import _fork
from ._fork import gate as _gate
from .keeper import ClaimKeeper, LeaseKeeper
from .model import (
    FENCE_MISSING,
    BatchResult,
    Change,
    Check,
    CheckCount,
    CheckRecords,
    CheckSection,
    ClaimEvent,
    ClaimFence,
    Current,
    Delete,
    Event,
    Layout,
    Lease,
    LeaseFence,
    MigratedSection,
    MigrateResult,
    Page,
    Put,
    Record,
    ReplicaAck,
    Snapshot,
    FenceArg,
    Write,
    lease_fence,
    new_request_id,
)
from .revisions import compare_revisions, later_revision
from .update import Txn
from .update import update as _update
from .view import View
from .v1 import admin_pb2, admin_pb2_grpc, lease_pb2, lease_pb2_grpc, records_pb2, records_pb2_grpc

__all__ = ["Client", "MAX_MESSAGE_BYTES", "new_request_id"]

MAX_MESSAGE_BYTES = 64 << 20
"""The largest message the client sends or receives by default (64 MiB): room
for a whole large swarm (sections) and the largest batch the server's default
limits allow (8 MiB of values). As the Go client's MaxMessageBytes."""

DEFAULT_TIMEOUT = 30.0
"""Each call's default deadline, in seconds."""

# The Go client's service config (client/client.go retryReads): read-only RPCs
# are retried on UNAVAILABLE (4 attempts, 50 ms growing to 1 s); commits and
# lease changes are never retried by the transport.
_RETRY_READS = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "fenced.v1.RecordsService", "method": "Layout"},
                    {"service": "fenced.v1.RecordsService", "method": "Sections"},
                    {"service": "fenced.v1.RecordsService", "method": "Record"},
                    {"service": "fenced.v1.LeaseService", "method": "Current"},
                ],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

# Channel options mirroring the Go client's Dial: keepalive pings every 30 s
# of idleness with a 10 s timeout, 64 MiB messages both ways, reads retried.
CHANNEL_OPTIONS: Sequence[tuple[str, Union[int, str]]] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _RETRY_READS),
)


def _open_channel(
    channels: Any,
    target: str,
    *,
    token: Optional[str],
    tls: Union[bool, grpc.ChannelCredentials, None],
    insecure_token: bool,
    options: Sequence[tuple[str, Union[int, str]]],
) -> Any:
    """A channel to target from ``channels`` (the module ``grpc`` or
    ``grpc.aio``: both Clients open theirs alike), CHANNEL_OPTIONS
    overridden by options; TLS when tls is True (the system roots) or
    credentials. Raises ValueError for a bearer token without TLS unless
    insecure_token."""
    opts = list({**dict(CHANNEL_OPTIONS), **dict(options)}.items())
    if tls:
        creds = grpc.ssl_channel_credentials() if tls is True else tls
        return channels.secure_channel(target, creds, options=opts)
    if token is not None and not insecure_token:
        raise ValueError("fenced client: a bearer token is sent over TLS only (pass tls=..., or insecure_token=True)")
    return channels.insecure_channel(target, options=opts)

_KINDS = {
    Put: records_pb2.WRITE_KIND_PUT,
    Delete: records_pb2.WRITE_KIND_DELETE,
    Check: records_pb2.WRITE_KIND_CHECK,
    CheckSection: records_pb2.WRITE_KIND_CHECK_SECTION,
    CheckRecords: records_pb2.WRITE_KIND_CHECK_RECORDS,
    CheckCount: records_pb2.WRITE_KIND_CHECK_COUNT,
}

_watch_log = logging.getLogger("fenced.watch")


def _record(r: records_pb2.Record) -> Record:
    return Record(revision=r.revision, value=r.value, claim=r.claim, claim_epoch=r.claim_epoch)


def _lease(l: lease_pb2.Lease, revision: int = 0, replicas_acked: int = 0) -> Lease:
    return Lease(l.owner, l.epoch, l.expires_at_ms, revision, replicas_acked)


def _event(e: records_pb2.WatchEvent) -> Event:
    return Event(
        revision=e.revision,
        owner=e.owner,
        request_id=e.request_id,
        changes=tuple(
            Change(ch.section, ch.key, ch.kind == records_pb2.CHANGE_KIND_DELETE,
                   _record(ch.record) if ch.HasField("record") else None)
            for ch in e.changes
        ),
        truncated=e.truncated,
        sections=tuple(e.sections),
        progress=e.progress,
        claim=ClaimEvent(
            name=e.claim.name,
            kind=_CLAIM_KINDS.get(e.claim.kind, ""),
            owner=e.claim.owner,
            epoch=e.claim.epoch,
            expires_at_ms=e.claim.expires_at_ms,
        ) if e.HasField("claim") else None,
    )


_CLAIM_KINDS = {
    records_pb2.CLAIM_EVENT_KIND_GRANTED: "granted",
    records_pb2.CLAIM_EVENT_KIND_RENEWED: "renewed",
    records_pb2.CLAIM_EVENT_KIND_RELEASED: "released",
    records_pb2.CLAIM_EVENT_KIND_LAPSED: "lapsed",
}


# Watch's reopen backoff (the Go client's): 50 ms doubling to 5 s, each
# randomised by +-50 %, reset by every answer.
_WATCH_BACKOFF_S = (0.05, 2.0, 5.0, 0.5)


# A call fenced's fair queue refused its turn at Redis (RESOURCE_EXHAUSTED +
# TOO_MANY_CALLS_QUEUED: nothing was sent to Redis, so a batch too is safe to
# send again) is sent again after the server's delay (RetryInfo) or the Go
# client's backoff (client/queued.go: 50 ms growing 1.5 times to 5 s, each
# randomised by +-50 %), whichever is longer, while the call's timeout leaves
# room for the delay: at most QUEUED_RETRIES sends in all.
QUEUED_RETRIES = 8
_QUEUED_BACKOFF_S = (0.05, 1.5, 5.0, 0.5)


class _QueuedRetries:
    """The pauses of one call refused its turn (see QUEUED_RETRIES)."""

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.wait = _QUEUED_BACKOFF_S[0]
        self.sends = 0

    def left(self) -> float:
        """The seconds of the call's timeout left for its next send."""
        return max(self.deadline - time.monotonic(), 0.0)

    def pause(self, err: errors.FencedError) -> Optional[float]:
        """The seconds to wait before sending the call again after err, or
        None when it must be raised: not a refusal of its turn, the sends are
        spent, or the timeout leaves no room for the pause."""
        self.sends += 1
        if not isinstance(err, errors.CallsQueued) or self.sends >= QUEUED_RETRIES:
            return None
        _, multiplier, most, spread = _QUEUED_BACKOFF_S
        pause = max(err.retry_after, self.wait * random.uniform(1 - spread, 1 + spread))
        self.wait = min(self.wait * multiplier, most)
        return pause if pause < self.left() else None


def _code(err: grpc.RpcError) -> Optional[grpc.StatusCode]:
    """The status code of a call's error; None for one without a status."""
    return err.code() if hasattr(err, "code") else None


def _watch_resumable(err: grpc.RpcError) -> bool:
    """Whether a reopen from the last revision mends a broken watch stream:
    UNAVAILABLE (fenced or Redis away, a shutdown, a lost connection) and
    RESOURCE_EXHAUSTED + WATCHER_TOO_SLOW or TOO_MANY_CALLS_QUEUED (the open
    refused its turn at Redis); anything without a status."""
    code = _code(err)
    if code is None or code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.decode(err).reason in ("WATCHER_TOO_SLOW", "TOO_MANY_CALLS_QUEUED")
    return False


def _write(w: Write) -> records_pb2.RecordWrite:
    kind = _KINDS.get(type(w))
    if kind is None:
        raise TypeError(f"not a fenced write: {w!r} (use fenced.Put, Delete, Check, CheckSection, CheckRecords or CheckCount)")
    if isinstance(w, CheckCount):
        return records_pb2.RecordWrite(
            kind=kind, section=w.section, expected=w.revision, count=w.count, revision_sum=w.revision_sum
        )
    if isinstance(w, CheckRecords):
        return records_pb2.RecordWrite(
            kind=kind,
            section=w.section,
            checks=[records_pb2.RecordCheck(key=k, expected=e) for k, e in w.checks.items()],
        )
    return records_pb2.RecordWrite(
        kind=kind,
        section=w.section,
        key=getattr(w, "key", ""),
        expected=w.expected,
        value=getattr(w, "value", ""),
        bind_to_claim=getattr(w, "bind_to_claim", False),
    )


# Request building and reply decoding, shared by Client and fenced.aio.Client.


def _batch_request(
    slug: str,
    writes: Sequence[Write],
    fence: Any,
    request_id: Optional[str],
    replica_ack: Optional[ReplicaAck],
    claim: Optional[ClaimFence] = None,
) -> records_pb2.FencedBatchRequest:
    lease = lease_fence(fence, claim)  # ValueError for no fence and no claim: nothing is sent
    req = records_pb2.FencedBatchRequest(slug=slug, writes=[_write(w) for w in writes], request_id=request_id or "")
    if lease is not None:
        req.fence.CopyFrom(records_pb2.LeaseFence(owner=lease.owner, epoch=lease.epoch, now_ms=lease.now_ms))
    if claim is not None:
        if not isinstance(claim, ClaimFence):
            raise TypeError(f"claim= takes a fenced.ClaimFence (ClaimKeeper.claim()), not {type(claim).__name__}")
        req.claim.CopyFrom(records_pb2.ClaimFence(name=claim.name, owner=claim.owner, epoch=claim.epoch, now_ms=claim.now_ms))
    if replica_ack is not None:
        req.replica_ack.CopyFrom(records_pb2.ReplicaAck(replicas=replica_ack.replicas, timeout_ms=replica_ack.timeout_ms))
    return req


def _snapshot(resp: records_pb2.SectionsResponse) -> Snapshot:
    return Snapshot(
        revision=resp.revision,
        sections={n: {k: _record(r) for k, r in s.records.items()} for n, s in resp.sections.items()},
        section_revisions={n: s.revision for n, s in resp.sections.items()},
    )


class _StreamedSnapshot:
    """A StreamSections snapshot as its messages come (shared by the sync and
    asyncio clients): the records of the current attempt (a ``restart``
    drops them), a value sent in parts joined, and the Snapshot once the
    ``end`` comes."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, Record]] = {}
        self.parts: list[str] = []  # of a value whose last part is still to come

    def add(self, resp: records_pb2.StreamSectionsResponse) -> Optional[Snapshot]:
        """Take one message; answers the Snapshot after its end, else None."""
        if resp.restart:
            self.sections, self.parts = {}, []
            return None
        for r in resp.records:
            value = r.record.value
            if r.more or self.parts:
                self.parts.append(value)
                if r.more:
                    continue
                value, self.parts = "".join(self.parts), []
            self.sections.setdefault(r.section, {})[r.key] = Record(
                revision=r.record.revision, value=value, claim=r.record.claim, claim_epoch=r.record.claim_epoch)
        if not resp.HasField("end"):
            return None
        for name in resp.end.section_revisions:
            self.sections.setdefault(name, {})
        return Snapshot(revision=resp.end.revision, sections=self.sections, section_revisions=dict(resp.end.section_revisions))


def _stream_refused(err: errors.FencedError, too_large: errors.SnapshotTooLarge) -> errors.FencedError:
    """What a StreamSections refusal raises: the SnapshotTooLarge that
    asked for it when the server has no StreamSections (an older fenced,
    UNIMPLEMENTED), else the refusal."""
    return too_large if err.code == grpc.StatusCode.UNIMPLEMENTED else err


def _whole_too_large(e: errors.SnapshotTooLarge) -> bool:
    """A Sections refusal for the whole snapshot's size (not one record's
    alone), which StreamSections reads."""
    return not e.key


def _page(resp: records_pb2.ScanSectionResponse, skipped: tuple[errors.SnapshotTooLarge, ...] = ()) -> Page:
    return Page(
        records={k: _record(r) for k, r in resp.records.items()},
        revision=resp.revision,
        section_revision=resp.section_revision,
        next_page_token=resp.next_page_token,
        skipped=skipped,
    )


def _current(resp: lease_pb2.CurrentResponse) -> Current:
    lease = _lease(resp.lease) if resp.HasField("lease") else None
    return Current(lease, resp.live, resp.now_ms, resp.revision)


def _migration(resp: admin_pb2.MigrateResponse) -> MigrateResult:
    return MigrateResult(
        records=resp.records,
        revision=resp.revision,
        sections=tuple(MigratedSection(s.name, s.records, s.bytes) for s in resp.sections),
        already_moved=resp.already_moved,
        no_state=resp.no_state,
    )


def _never() -> bool:
    return False


# Views (fenced/view.py), shared by the sync and asyncio clients.

# A view that found the swarm on the document layout is made again after
# this long (a migration moves it onto the records); one that found no
# state at all, at once (the first commit makes the records).
_VIEW_DOCUMENT_RETRY_S = 10.0


def _view_of(client: Any, slug: str, sections: Sequence[str], make: Callable[..., Any]) -> Any:
    names = tuple(sorted(set(sections)))
    with client._views_lock:
        if client._closed:
            raise errors.FencedError("the Client is closed", code=grpc.StatusCode.CANCELLED)
        v = client._views.get((slug, names))
        if v is None and "archive" not in names:  # a view of every section leaves archive out
            v = client._views.get((slug, ()))
        if v is not None and v._s.closed:
            client._views.pop((slug, v.names), None)
            v = None
        if v is not None and v._s.unsupported is not None:
            retry = 0.0 if v._s.unsupported != Layout.DOCUMENT else _VIEW_DOCUMENT_RETRY_S
            if time.monotonic() - v._born >= retry:
                client._views.pop((slug, v.names), None)
                v = None
        if v is None:
            v = make(client, slug, names)
            v._born = time.monotonic()
            client._views[(slug, names)] = v
        return v


def _views_committed(views: dict, slug: str, revision: int, writes: Sequence[Write], claim: Optional[ClaimFence]) -> None:
    """A batch of this Client committed: its writes go into its views of the swarm."""
    if not views:
        return
    for (s, _), v in list(views.items()):
        if s == slug:
            v._committed(revision, writes, claim.name if claim is not None else "", claim.epoch if claim is not None else 0)


def _drop(stream: "_fork.Stream") -> None:
    """Cancel a stream's call and let it go."""
    call, stream.call = stream.call, None
    if call is not None:
        call.cancel()


class _WatchLoop:
    """One watch's state across its streams (the Go client's Watch), shared by
    the sync and asyncio clients: the request to (re)open with, the events of
    an answer, and what to do when a stream ends."""

    def __init__(self, client: Any, slug: str, from_revision: int, sections: Sequence[str], progress: bool) -> None:
        self.c = client
        self.slug = slug
        self.from_revision = from_revision
        self.sections = sections
        self.progress = progress
        self.wait = _WATCH_BACKOFF_S[0]
        self.gzipped = True
        self.generation = 0

    def request(self, generation: int) -> tuple[records_pb2.WatchRequest, grpc.Compression]:
        """The request of the next stream and its compression; generation:
        the fork generation it opens in."""
        self.generation = generation
        # gzip: fenced answers in kind, compressing each message once
        # for every watcher that asks (docs/design/06-reads-and-scans.md §6.1); none once a
        # server refused it.
        self.gzipped = not self.c._plain_watch
        compression = grpc.Compression.Gzip if self.gzipped else grpc.Compression.NoCompression
        req = records_pb2.WatchRequest(slug=self.slug, start_revision=self.from_revision, sections=self.sections)
        return req, compression

    def events(self, resp: records_pb2.WatchResponse) -> list[Event]:
        """The events of one answer to yield (progress ones only when asked)."""
        self.wait = _WATCH_BACKOFF_S[0]
        out = []
        for e in resp.events:
            self.from_revision = later_revision(self.from_revision, e.revision)
            if e.progress and not self.progress:
                continue
            self.c._saw(self.slug, e.revision)
            out.append(_event(e))
        return out

    def broke(self, err: Optional[grpc.RpcError], generation: int) -> float:
        """A stream ended (err None: the server ended it cleanly): the seconds
        to wait before reopening (0: at once), or raise the decoded error."""
        if err is not None and self.gzipped and _code(err) == grpc.StatusCode.UNIMPLEMENTED:
            # A fenced without gzip (older than the clients that ask for
            # it) refuses the request before reading it: grpc-go answers
            # 'grpc: Decompressor is not installed for grpc-encoding
            # "gzip"'. Ask again uncompressed, at once, and so every later
            # watch of this Client.
            self.c._plain_watch = True
            return 0.0
        if err is not None and _code(err) == grpc.StatusCode.CANCELLED and not self.c._closed:
            # Not this client's doing (it cancels a stream only when the
            # watch is left, or around a fork): fenced cancelled it. Reopen.
            generation = -1
        if generation != self.generation:
            # The stream was cut by a fork() of this process (see
            # fenced/_fork.py): reopen at once, from the last revision.
            _watch_log.debug("watch %s: stream closed around fork(); reopening from revision %d", self.slug, self.from_revision)
            return 0.0
        if err is not None and not _watch_resumable(err):
            out = errors.decode(err)
            if isinstance(out, errors.RevisionCompacted):
                out.from_revision = self.from_revision
            # Not chained: the error of a stream is its call, which holds its
            # channel for as long as it is referenced.
            raise out
        _, multiplier, most, spread = _WATCH_BACKOFF_S
        pause = self.wait * random.uniform(1 - spread, 1 + spread)
        self.wait = min(self.wait * multiplier, most)
        if err is not None:
            refused = errors.decode(err)
            if isinstance(refused, errors.CallsQueued):
                pause = max(pause, refused.retry_after)  # the server's delay at least
        _watch_log.info(
            "watch %s: stream ended (%s); reopening from revision %d in %.2fs",
            self.slug, "closed by the server" if err is None else errors.decode(err), self.from_revision, pause,
        )
        return pause


class Client:
    """Calls one fenced deployment. Safe for concurrent use by threads.

    ``Client(target)`` opens a gRPC channel to ``target`` (any gRPC target:
    ``"host:7420"``, ``"dns:///fenced.ns:7420"``) with the Go client's defaults:
    keepalive pings every 30 s (10 s timeout), messages up to
    :data:`MAX_MESSAGE_BYTES` both ways, and transport retries of reads on
    UNAVAILABLE only. Use it as a context manager, or call :meth:`close`.

    Args:
        target: where fenced listens.
        token: a bearer token sent with every call ("authorization: Bearer
            <token>"), as fenced's --auth-tokens-file checks. Sent over TLS
            only, unless ``insecure_token`` is True.
        tls: True for TLS with the system's roots, or grpc.ChannelCredentials
            (grpc.ssl_channel_credentials(...)) ; None or False: plaintext.
        insecure_token: also send ``token`` over plaintext (a connection
            encrypted by other means: a mesh's mTLS, loopback, tests).
        timeout: each call's deadline in seconds, unless the call is given
            one; also the default overall deadline of :meth:`update` and the
            default ``wait`` of :meth:`keep`.
        options: extra gRPC channel options; each replaces the default of the same name.

    Raises:
        ValueError: a token over plaintext without ``insecure_token``.

    It remembers the latest swarm revision it has seen per swarm (from every
    read, commit and lease change, in issue order: :func:`compare_revisions`):
    fenced issues every revision after every earlier one, even after Redis lost
    acknowledged writes, so a read showing an earlier one means Redis lost data
    this client saw. That read raises :class:`RevisionWentBackwards`, once; the
    client then goes on from the earlier revision. A swarm moving from fenced's
    former 16-digit revisions to its 14-digit ones is not going backwards.

    fork(): the process may fork (os.fork, multiprocessing's "fork" start
    method) while Clients, LeaseKeepers and watches are in use. Around each
    fork the package holds new calls back, waits for those in flight (at most
    5 s), cuts the watch streams (each reopens from its last revision after
    the fork) and parks its threads; see fenced/_fork.py. A child makes its
    own Client: the parent's raises FencedError there. This needs grpcio's
    fork support, which importing fenced before grpc turns on
    (``GRPC_ENABLE_FORK_SUPPORT=true``).
    """

    def __init__(
        self,
        target: str,
        *,
        token: Optional[str] = None,
        tls: Union[bool, grpc.ChannelCredentials, None] = None,
        insecure_token: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        options: Sequence[tuple[str, Union[int, str]]] = (),
    ) -> None:
        _gate.check_new_client()
        channel = _open_channel(grpc, target, token=token, tls=tls, insecure_token=insecure_token, options=options)
        self._init(channel, token=token, timeout=timeout, owns=True)

    @classmethod
    def from_channel(
        cls, channel: grpc.Channel, *, token: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT
    ) -> "Client":
        """A Client over an existing channel (e.g. one with interceptors);
        :meth:`close` then leaves the channel open."""
        c = cls.__new__(cls)
        c._init(channel, token=token, timeout=timeout, owns=False)
        return c

    def _init(self, channel: grpc.Channel, *, token: Optional[str], timeout: float, owns: bool) -> None:
        self._owns = owns
        self._timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", "Bearer " + token),) if token else ()
        self._seen: dict[str, int] = {}  # slug -> highest swarm revision seen
        self._seen_lock = threading.Lock()
        # A Watch sent with gzip was refused UNIMPLEMENTED (a fenced older
        # than its gzip support): every later watch of this Client goes
        # uncompressed (watch).
        self._plain_watch = False
        self._pid = os.getpid()
        self._closed = False
        self._channel = channel
        self._records = records_pb2_grpc.RecordsServiceStub(channel)
        self._leases = lease_pb2_grpc.LeaseServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._views: dict[tuple[str, tuple[str, ...]], Any] = {}  # (slug, sections) -> fenced.View
        self._views_lock = threading.Lock()
        _gate.register(self)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise errors.FencedError(
                f"this Client was made in process {self._pid}, before a fork(); a process made by fork() "
                "makes its own Client",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )

    def _stub(self, service: str) -> Any:
        """The stub of ``service`` ("records", "leases", "admin")."""
        self._check_process()
        return getattr(self, "_" + service)

    def _streams_open(self) -> int:
        """Streams grpcio still runs on this Client's channel (its channel
        spin thread's calls): a fork waits for them to end (fenced/_fork.py)."""
        state = getattr(self._channel, "_call_state", None)  # grpc._channel.Channel's
        return getattr(state, "managed_calls", 0) if state is not None else 0

    def close(self) -> None:
        """Close the channel the Client opened (not one given to from_channel).
        In a process forked from the one that made the Client, it does nothing."""
        if os.getpid() != self._pid:
            return
        self._closed = True
        with self._views_lock:
            views, self._views = list(self._views.values()), {}
        for v in views:
            v.close()
        if self._owns:
            self._channel.close()

    def _cancelled_by_caller(self, err: BaseException) -> bool:
        """Whether a Cancelled error came from this Client's close (update
        then does not resend)."""
        return isinstance(err, errors.Cancelled) and self._closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, service: str, method: str, request: object, timeout: Optional[float], request_id: str = "") -> Any:
        """One unary call: through the fork gate, errors decoded (carrying
        request_id), sent again when fenced refused it its turn
        (QUEUED_RETRIES)."""
        self._check_process()  # before the gate: a child's copy of a Client never counts in it
        retries = _QueuedRetries(self._timeout if timeout is None else timeout)
        while True:
            _gate.enter()
            try:
                fn = getattr(self._stub(service), method)
                return fn(request, timeout=retries.left(), metadata=self._metadata)
            except grpc.RpcError as e:
                err = errors.decode(e)
                err.request_id = request_id
                pause = retries.pause(err)
                if pause is None:
                    raise err from e
            finally:
                _gate.leave()
            time.sleep(pause)

    def _saw(self, slug: str, revision: int) -> None:
        """Record a swarm revision a commit or lease change answered: it only raises the mark."""
        with self._seen_lock:
            if compare_revisions(revision, self._seen.get(slug, 0)) > 0:
                self._seen[slug] = revision

    def _mark(self, slug: str) -> int:
        """The highest swarm revision seen so far: a read takes it before it is
        sent (a commit ending while the read is in flight may rightly be higher)."""
        with self._seen_lock:
            return self._seen.get(slug, 0)

    def _read(self, slug: str, before: int, revision: int) -> None:
        """Check the swarm revision a read answered against the mark taken
        before it: earlier raises RevisionWentBackwards and moves the mark
        down (unless a later answer raised it meanwhile), so it is said once."""
        with self._seen_lock:
            if compare_revisions(revision, before) < 0:
                if self._seen.get(slug, 0) == before:
                    self._seen[slug] = revision
                raise errors.RevisionWentBackwards(slug, before, revision)
            if compare_revisions(revision, self._seen.get(slug, 0)) > 0:
                self._seen[slug] = revision

    # Records.

    def layout(self, slug: str, *, timeout: Optional[float] = None) -> Layout:
        """How the swarm's fencing state is stored. Raises FencedError."""
        resp = self._call("records", "Layout", records_pb2.LayoutRequest(slug=slug), timeout)
        return Layout(resp.layout)

    def record(self, slug: str, section: str, key: str, *, timeout: Optional[float] = None) -> Optional[Record]:
        """One record (its revision and JSON text), or None when absent. Raises
        RevisionWentBackwards, FencedError."""
        return self.record_at(slug, section, key, timeout=timeout)[0]

    def record_at(
        self, slug: str, section: str, key: str, *, timeout: Optional[float] = None
    ) -> tuple[Optional[Record], int]:
        """One record (None when absent) and the swarm revision, read together.
        Raises RevisionWentBackwards, FencedError."""
        before = self._mark(slug)
        req = records_pb2.RecordRequest(slug=slug, section=section, key=key)
        resp = self._call("records", "Record", req, timeout)
        self._read(slug, before, resp.revision)
        rec = _record(resp.record) if resp.HasField("record") else None
        return rec, resp.revision

    def sections(self, slug: str, *names: str, timeout: Optional[float] = None) -> Snapshot:
        """Whole sections (every section but archive when no names are given)
        and the swarm revision, as one snapshot of any size. It asks with one
        Sections call; a snapshot over the server's limits for one answer
        (SnapshotTooLarge) is read again with StreamSections: one snapshot
        streamed in messages of at most 1 MiB (restarted by the server when a
        write lands in it while it is read; only a complete one is answered),
        within ``timeout`` too. A server older than StreamSections raises the
        SnapshotTooLarge. Raises RevisionWentBackwards, RevisionConflict
        (writes kept landing in a streamed snapshot: read again),
        ResourceExhausted (TOO_MANY_SECTION_STREAMS: the server has as many
        streams open as it allows; retry later), FencedError."""
        before = self._mark(slug)
        try:
            resp = self._call("records", "Sections", records_pb2.SectionsRequest(slug=slug, names=names), timeout)
        except errors.SnapshotTooLarge as e:
            if not _whole_too_large(e):
                raise
            snap = self._stream_sections(slug, names, timeout, e)
            self._read(slug, before, snap.revision)
            return snap
        self._read(slug, before, resp.revision)
        return _snapshot(resp)

    def _stream_sections(
        self, slug: str, names: Sequence[str], timeout: Optional[float], too_large: errors.SnapshotTooLarge
    ) -> Snapshot:
        """The snapshot read with StreamSections (see sections)."""
        self._check_process()
        _gate.enter()
        call = None
        try:
            req = records_pb2.StreamSectionsRequest(slug=slug, names=names)
            call = self._stub("records").StreamSections(
                req, timeout=self._timeout if timeout is None else timeout, metadata=self._metadata)
            got = _StreamedSnapshot()
            for resp in call:
                snap = got.add(resp)
                if snap is not None:
                    return snap
            raise errors.FencedError("StreamSections ended without its end", code=grpc.StatusCode.INTERNAL)
        except grpc.RpcError as e:
            raise _stream_refused(errors.decode(e), too_large) from e
        finally:
            if call is not None:
                call.cancel()
            _gate.leave()

    def scan_section(
        self,
        slug: str,
        section: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        skip_too_large: bool = False,
        timeout: Optional[float] = None,
    ) -> Iterator[Page]:
        """Read a section page by page (a generator): at most ``page_size``
        records a page (0: the server's default), from the section's start or
        from ``page_token`` (a page's ``next_page_token``, or a
        SnapshotTooLarge's, past the record it names). Pages are not one
        snapshot: a record may appear twice if the section changes during the
        scan; compare the first and last pages' section_revision.

        A record over the server's limit alone (a foreign writer's: no page
        can hold it) raises :class:`SnapshotTooLarge` naming its ``section``,
        ``key`` and ``bytes``, with the ``next_page_token`` past it; with
        ``skip_too_large=True`` the scan steps past it instead, and the next
        page names it in ``skipped``. Raises RevisionWentBackwards (a page's
        swarm revision), SnapshotTooLarge, FencedError (while iterating)."""
        token = page_token
        skipped: list[errors.SnapshotTooLarge] = []
        while True:
            req = records_pb2.ScanSectionRequest(slug=slug, section=section, page_size=page_size, page_token=token)
            before = self._mark(slug)
            try:
                resp = self._call("records", "ScanSection", req, timeout)
            except errors.SnapshotTooLarge as e:
                if not (skip_too_large and e.key and e.next_page_token):
                    raise
                skipped.append(e)
                token = e.next_page_token
                continue
            self._read(slug, before, resp.revision)
            yield _page(resp, tuple(skipped))
            skipped = []
            token = resp.next_page_token
            if not token:
                return

    def fenced_batch(
        self,
        slug: str,
        writes: Sequence[Write],
        *,
        fence: FenceArg = FENCE_MISSING,
        request_id: Optional[str] = None,
        replica_ack: Optional[ReplicaAck] = None,
        timeout: Optional[float] = None,
        claim: Optional[ClaimFence] = None,
    ) -> BatchResult:
        """Commit ``writes`` (Put, Delete, Check, CheckSection, CheckRecords) all or none.

        Args:
            slug: the swarm.
            writes: applied in order; each names the revision its record was read at.
            fence: the lease condition (LeaseFence, LeaseKeeper.fence()), or
                :data:`fenced.UNFENCED` to write without one by choice (the
                batch then commits on its revisions alone). Required unless
                ``claim`` is given: left out or None it raises ValueError
                before anything is sent.
            claim: a claim's condition (ClaimFence, ClaimKeeper.claim()), alone
                or beside ``fence``; a refusal's StaleLease says which failed.
            request_id: makes the batch idempotent (1-128 printable ASCII,
                unique per change; :func:`new_request_id`): sent again inside
                the server's window it answers the original revision and writes
                nothing, so a batch whose reply was lost can be resent safely.
                Every error raised carries it (``request_id``).
            replica_ack: wait for replicas (ReplicationTimeout when too few).

        Raises:
            RevisionConflict, StaleLease, LayoutDocument, InvalidArgument,
            RequestIdReused, ReplicationTimeout, Unavailable, DeadlineExceeded
            and Cancelled (it may or may not have committed: resend with the
            same request_id), FencedError.
        """
        req = _batch_request(slug, writes, fence, request_id, replica_ack, claim)
        resp = self._call("records", "FencedBatch", req, timeout, request_id or "")
        self._saw(slug, resp.revision)
        _views_committed(self._views, slug, resp.revision, writes, claim)
        return BatchResult(resp.revision, resp.replayed, resp.replicas_acked)

    def view(self, slug: str, *sections: str) -> "View":
        """The swarm's :class:`fenced.View` (every section but archive, meta
        included; or the sections named), made and started on first use
        and shared by every caller of this Client until it closes: its
        records kept by the swarm's Watch stream (see fenced/view.py). A
        view of every section serves a request for named ones but archive."""
        return _view_of(self, slug, sections, View)

    def watch(
        self,
        slug: str,
        from_revision: int = 0,
        *,
        sections: Sequence[str] = (),
        progress: bool = False,
    ) -> Iterator[Event]:
        """Follow a swarm's committed batches after ``from_revision`` (0: from
        now), in issue order, each once: a generator of :class:`Event`. A
        broken stream (fenced restarting, a lost connection, Redis away for a
        while, the server dropping a watcher that read too slowly) is reopened
        from the last revision seen, with backoff (50 ms to 5 s), yielding
        nothing meanwhile; one closed around a fork() of this process is
        reopened at once. Stop by leaving the loop (or ``close()`` on the
        generator): the stream is cancelled. The list-then-watch pattern::

            snap = c.sections(slug)
            for ev in c.watch(slug, snap.revision):
                ...

        Args:
            sections: only batches that changed these sections, with only
                those changes (default: every section).
            progress: also yield progress events (the stream's revision when it
                opens from now, and after every quiet interval of the server's).

        The request asks for gzip (fenced then compresses each message once
        for all the watchers that ask). A server that answers UNIMPLEMENTED to
        a compressed watch (a fenced older than its gzip support: 'grpc:
        Decompressor is not installed for grpc-encoding "gzip"') is asked again
        at once without compression, and every later watch of this Client
        (reopens included) goes uncompressed; a watch refused UNIMPLEMENTED
        uncompressed too raises it (FencedError).

        Raises (while iterating): RevisionCompacted (watch from a fresh
        snapshot), ResourceExhausted (TOO_MANY_WATCHERS), InvalidArgument,
        FencedError (permission errors and the rest). As the Go client's Watch.
        """
        yield from self._watch_events(slug, from_revision, _fork.Stream(), None, sections, progress)

    def _watch_events(
        self,
        slug: str,
        from_revision: int,
        stream: "_fork.Stream",
        stop: Optional[Callable[[], bool]],
        sections: Sequence[str] = (),
        progress: bool = True,
    ) -> Iterator[Event]:
        """watch's loop, with the Stream holding its call given (cancelling
        that call ends the stream) and ``stop`` (asked before every
        (re)open: True ends the iteration); a View follows its swarm with it."""
        loop = _WatchLoop(self, slug, from_revision, sections, progress)
        # The call is held by a Stream the fork handling can drop; this
        # generator keeps no reference of its own while suspended.
        _gate.track(stream)
        busy = False
        try:
            while True:
                if stop is not None and stop():
                    return
                _gate.enter(busy)
                busy = False
                try:
                    req, compression = loop.request(_gate.generation)
                    stream.call = self._stub("records").Watch(req, metadata=self._metadata, compression=compression)
                finally:
                    _gate.leave()
                if stop is not None and stop():
                    _drop(stream)
                    return
                _watch_log.debug("watch %s: stream opened from revision %d", slug, loop.from_revision)
                err: Optional[grpc.RpcError] = None
                while True:
                    try:
                        resp = _gate.next_response(stream)
                    except grpc.RpcError as e:
                        err, busy = e, True
                        break
                    if resp is None:
                        busy = True
                        break
                    yield from loop.events(resp)
                _drop(stream)
                if stop is not None and stop():
                    return
                try:
                    pause = loop.broke(err, _gate.generation)
                finally:
                    err = None
                if pause > 0:
                    _gate.end_busy()
                    busy = False
                    _gate.sleep(pause, _never if stop is None else stop)
        finally:
            if busy:
                _gate.end_busy()
            _drop(stream)

    def update(
        self,
        slug: str,
        change: Callable[[Txn], None],
        *,
        fence: FenceArg = FENCE_MISSING,
        claim: Optional[ClaimFence] = None,
        replica_ack: Optional[ReplicaAck] = None,
        timeout: Optional[float] = None,
        view: bool = True,
    ) -> int:
        """Read, change, write as one fenced batch, rerun on conflict, within
        ``timeout`` seconds in all (None: the Client's timeout), under
        ``fence`` (keeper.fence(), or :data:`fenced.UNFENCED`: required unless
        ``claim`` is given), reading from the swarm's view unless ``view`` is
        False; see :func:`fenced.update.update`."""
        return _update(self, slug, change, fence=fence, claim=claim, replica_ack=replica_ack, timeout=timeout, view=view)

    # Leases.

    def acquire(self, slug: str, owner: str, *, ttl_ms: int, name: str = "", timeout: Optional[float] = None) -> Lease:
        """Take the swarm's lease for ``ttl_ms`` ms (the live holder acquiring
        again extends it and keeps its epoch). With ``name``, the claim of that
        name instead (a named lease within the swarm, its own owner, expiry
        and epochs; docs/design/12-claims.md); the same applies to renew,
        release and current. Raises LeaseHeld (holder, retry_after),
        ReplicationTimeout (no lease is held: acquire again), InvalidArgument,
        FencedError."""
        req = lease_pb2.AcquireRequest(slug=slug, name=name, owner=owner, ttl_ms=ttl_ms)
        resp = self._call("leases", "Acquire", req, timeout)
        self._saw(slug, resp.revision)
        return _lease(resp.lease, resp.revision, resp.replicas_acked)

    def renew(self, slug: str, owner: str, epoch: int, *, ttl_ms: int, name: str = "", timeout: Optional[float] = None) -> Lease:
        """Extend the live lease of owner at epoch to ``ttl_ms`` ms from Redis's
        now. Raises StaleLease (stop writing), ReplicationTimeout (not a
        renewal), FencedError."""
        req = lease_pb2.RenewRequest(slug=slug, name=name, owner=owner, epoch=epoch, ttl_ms=ttl_ms)
        resp = self._call("leases", "Renew", req, timeout)
        self._saw(slug, resp.revision)
        return _lease(resp.lease, resp.revision, resp.replicas_acked)

    def release(self, slug: str, owner: str, epoch: int, *, name: str = "", timeout: Optional[float] = None) -> int:
        """End the live lease of owner at epoch; answers the revision it
        committed at. Raises StaleLease, FencedError."""
        req = lease_pb2.ReleaseRequest(slug=slug, name=name, owner=owner, epoch=epoch)
        revision = self._call("leases", "Release", req, timeout).revision
        self._saw(slug, revision)
        return revision

    def current(self, slug: str, *, name: str = "", timeout: Optional[float] = None) -> Current:
        """The swarm's lease, whether it is live, Redis's now (ms) and the swarm
        revision. Raises RevisionWentBackwards, FencedError."""
        before = self._mark(slug)
        resp = self._call("leases", "Current", lease_pb2.CurrentRequest(slug=slug, name=name), timeout)
        self._read(slug, before, resp.revision)
        return _current(resp)

    def keep(self, slug: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> LeaseKeeper:
        """Acquire and keep the swarm's lease, waiting at most ``wait`` seconds
        for it (None: the Client's timeout; ``math.inf``: as long as it takes):
        see :class:`fenced.LeaseKeeper`."""
        return LeaseKeeper(self, slug, owner, ttl_ms=ttl_ms, wait=wait)

    def keep_claim(self, slug: str, name: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> ClaimKeeper:
        """Acquire and keep the swarm's claim ``name`` (a named lease), waiting at
        most ``wait`` seconds for it: see :class:`fenced.ClaimKeeper`."""
        return ClaimKeeper(self, slug, name, owner, ttl_ms=ttl_ms, wait=wait)

    # Administration.

    def migrate(
        self, slug: str, *, dry_run: bool = False, writers_upgraded: bool = False, timeout: Optional[float] = None
    ) -> MigrateResult:
        """Move the swarm from the document layout onto the records
        (AdminService/Migrate, as ``fenced migrate``: docs/migration.md), in
        one transaction; a swarm already on the records, or without state,
        answers ``already_moved`` / ``no_state`` and writes nothing, and
        ``dry_run`` answers the plan and writes nothing. Never retried by the
        transport; a repeat is safe (the second answers ``already_moved``).

        Args:
            writers_upgraded: confirms that every live reader and writer of the
                swarm's fencing state reads and writes the records layout
                (older readers read only the document); required.
            timeout: the call's deadline in seconds (None: the Client's).

        Raises:
            InvalidArgument (field ``writers_upgraded`` when it is False;
            nothing moved), LayoutDocument (on Redis Cluster),
            RevisionConflict (the state kept changing; nothing committed: run
            it again), Unavailable, FencedError.
        """
        req = admin_pb2.MigrateRequest(slug=slug, writers_upgraded=writers_upgraded, dry_run=dry_run)
        resp = self._call("admin", "Migrate", req, timeout)
        if resp.revision:
            self._saw(slug, resp.revision)
        return _migration(resp)
