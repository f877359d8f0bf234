"""fenced.aio: the fenced client for asyncio (grpc.aio), with the API of
:class:`fenced.Client` and the same semantics::

    import fenced, fenced.aio

    async with fenced.aio.Client("fenced:7420") as c, c.keep("my-swarm", "tick-host1", ttl_ms=10_000) as k:
        def change(tx: fenced.Txn) -> None:   # a plain function, as with the sync client
            tx.put_json("operations", "tick", {"n": 1})
        revision = await c.update("my-swarm", change, fence=k.fence())
        async for ev in c.watch("my-swarm", revision):
            ...

Every call is a coroutine; ``scan_section`` and ``watch`` are async
iterators; ``keep`` is awaited (``k = await c.keep(...)``) or entered
(``async with c.keep(...) as k``). Request building, reply decoding, the
error table, the revision marks, update's policy (reruns, resends, deadline)
and the keeper's rules are the sync client's own code.

``update`` takes the same change as the sync client: a plain function of a
:class:`fenced.Txn`, which it runs in a worker thread (asyncio.to_thread), so
that the reads it makes on demand (``tx.get``, ``tx.section``) are this
client's calls, awaited on the event loop while the thread waits for them. The
change must therefore not touch the event loop's objects; anything it needs
from async code is read before the update. Cancelling the update (its task)
stops it at its next step: a change still running finishes in its thread,
but its reads then raise and its batch is never sent (a plain
CancelledError). Cancelled while its batch may have been sent (the call in
flight, or a resend pending after a lost answer), it raises
:class:`fenced.UpdateCancelled`, still a CancelledError, naming the batch
and its request id: ``await c.fenced_batch(**e.resend_args())`` answers
``replayed`` if it committed.

Not for use across ``fork()``: grpc.aio and asyncio do not follow a fork. A
process that forks while an aio Client is open gives its children nothing
usable; make the Client in the child, or use the "spawn" or "forkserver"
start method.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import time
from typing import Any, AsyncIterator, Callable, Generator, Optional, Sequence, Union

import grpc
import grpc.aio

from . import errors
from .client import (
    DEFAULT_TIMEOUT,
    _view_of,
    _views_committed,
    _batch_request,
    _current,
    _lease,
    _migration,
    _open_channel,
    _page,
    _record,
    _snapshot,
    _QueuedRetries,
    _stream_refused,
    _StreamedSnapshot,
    _WatchLoop,
    _whole_too_large,
)
from .client import Client as _SyncClient
from .keeper import _Acquiring, _Held
from .model import (
    FENCE_MISSING,
    BatchResult,
    ClaimFence,
    Current,
    Event,
    Layout,
    Lease,
    LeaseFence,
    MigrateResult,
    Page,
    Record,
    ReplicaAck,
    Snapshot,
    FenceArg,
    Write,
    lease_fence,
)
from .update import (
    Txn,
    _Commit,
    _Deadline,
    _fence_arg,
    _run_change,
    _RunChange,
    _Sent,
    _Sleep,
    _takes_timeout,
    _update_steps,
    _ViewRuns,
)
from .view import EVERY, SYNC_GRACE_S as _SYNC_GRACE_S, Taken, ViewBehind, _backoff, _Reads, _State
from .v1 import admin_pb2, admin_pb2_grpc, lease_pb2, lease_pb2_grpc, records_pb2, records_pb2_grpc

__all__ = ["Client", "LeaseKeeper", "View"]

_log = logging.getLogger("fenced.keeper")
_view_log = logging.getLogger("fenced.view")


class Client:
    """Calls one fenced deployment from asyncio; the twin of
    :class:`fenced.Client` (same arguments, channel options, errors and
    revision marks). Use it as ``async with``, or ``await close()``. Its
    methods are coroutines of the running event loop."""

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
        channel = _open_channel(grpc.aio, target, token=token, tls=tls, insecure_token=insecure_token, options=options)
        self._init(channel, token=token, timeout=timeout, owns=True)

    @classmethod
    def from_channel(
        cls, channel: grpc.aio.Channel, *, token: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT
    ) -> "Client":
        """A Client over an existing grpc.aio channel; :meth:`close` leaves it open."""
        c = cls.__new__(cls)
        c._init(channel, token=token, timeout=timeout, owns=False)
        return c

    def _init(self, channel: grpc.aio.Channel, *, token: Optional[str], timeout: float, owns: bool) -> None:
        self._channel = channel
        self._owns = owns
        self._timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", "Bearer " + token),) if token else ()
        self._seen: dict[str, int] = {}
        self._seen_lock = threading.Lock()  # update's change reads from its thread too
        self._plain_watch = False
        self._closed = False
        self._records = records_pb2_grpc.RecordsServiceStub(channel)
        self._leases = lease_pb2_grpc.LeaseServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._views: dict[tuple[str, tuple[str, ...]], "View"] = {}
        self._views_lock = threading.Lock()

    # The sync client's bookkeeping of the swarm revisions seen.
    _saw = _SyncClient._saw
    _mark = _SyncClient._mark
    _read = _SyncClient._read
    _cancelled_by_caller = _SyncClient._cancelled_by_caller

    async def close(self) -> None:
        """Close the channel the Client opened (not one given to from_channel),
        and its views."""
        self._closed = True
        with self._views_lock:
            views, self._views = list(self._views.values()), {}
        for v in views:
            await v.close()
        if self._owns:
            await self._channel.close()

    def view(self, slug: str, *sections: str) -> "View":
        """The swarm's :class:`View` (every section but archive, meta
        included; or the sections named), made and started on first use on
        the running event loop and shared until the Client closes: see
        :meth:`fenced.Client.view`."""
        return _view_of(self, slug, sections, View)  # type: ignore[no-any-return]

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: object, timeout: Optional[float], request_id: str = "") -> Any:
        """The sync client's _call: sent again when fenced refused it its turn."""
        retries = _QueuedRetries(self._timeout if timeout is None else timeout)
        while True:
            try:
                return await method(request, timeout=retries.left(), metadata=self._metadata)
            except grpc.RpcError as e:
                err = errors.decode(e)
                err.request_id = request_id
                pause = retries.pause(err)
                if pause is None:
                    raise err from e
            await asyncio.sleep(pause)

    # Records.

    async def layout(self, slug: str, *, timeout: Optional[float] = None) -> Layout:
        """As :meth:`fenced.Client.layout`."""
        resp = await self._call(self._records.Layout, records_pb2.LayoutRequest(slug=slug), timeout)
        return Layout(resp.layout)

    async def record(self, slug: str, section: str, key: str, *, timeout: Optional[float] = None) -> Optional[Record]:
        """As :meth:`fenced.Client.record`."""
        return (await self.record_at(slug, section, key, timeout=timeout))[0]

    async def record_at(
        self, slug: str, section: str, key: str, *, timeout: Optional[float] = None
    ) -> tuple[Optional[Record], int]:
        """As :meth:`fenced.Client.record_at`."""
        before = self._mark(slug)
        req = records_pb2.RecordRequest(slug=slug, section=section, key=key)
        resp = await self._call(self._records.Record, req, timeout)
        self._read(slug, before, resp.revision)
        return (_record(resp.record) if resp.HasField("record") else None), resp.revision

    async def sections(self, slug: str, *names: str, timeout: Optional[float] = None) -> Snapshot:
        """As :meth:`fenced.Client.sections`: of any size (StreamSections
        past the server's limits for one answer)."""
        before = self._mark(slug)
        try:
            resp = await self._call(self._records.Sections, records_pb2.SectionsRequest(slug=slug, names=names), timeout)
        except errors.SnapshotTooLarge as e:
            if not _whole_too_large(e):
                raise
            call = self._records.StreamSections(records_pb2.StreamSectionsRequest(slug=slug, names=names),
                                                timeout=self._timeout if timeout is None else timeout, metadata=self._metadata)
            got = _StreamedSnapshot()
            try:
                async for part in call:
                    snap = got.add(part)
                    if snap is not None:
                        self._read(slug, before, snap.revision)
                        return snap
            except grpc.RpcError as err:
                raise _stream_refused(errors.decode(err), e) from err
            finally:
                call.cancel()
            raise errors.FencedError("StreamSections ended without its end", code=grpc.StatusCode.INTERNAL) from e
        self._read(slug, before, resp.revision)
        return _snapshot(resp)

    async def scan_section(
        self,
        slug: str,
        section: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        skip_too_large: bool = False,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[Page]:
        """As :meth:`fenced.Client.scan_section`, an async iterator of pages."""
        token = page_token
        skipped: list[errors.SnapshotTooLarge] = []
        while True:
            req = records_pb2.ScanSectionRequest(slug=slug, section=section, page_size=page_size, page_token=token)
            before = self._mark(slug)
            try:
                resp = await self._call(self._records.ScanSection, req, timeout)
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

    async def fenced_batch(
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
        """As :meth:`fenced.Client.fenced_batch`."""
        req = _batch_request(slug, writes, fence, request_id, replica_ack, claim)
        resp = await self._call(self._records.FencedBatch, req, timeout, request_id or "")
        self._saw(slug, resp.revision)
        _views_committed(self._views, slug, resp.revision, writes, claim)
        return BatchResult(resp.revision, resp.replayed, resp.replicas_acked)

    async def watch(
        self, slug: str, from_revision: int = 0, *, sections: Sequence[str] = (), progress: bool = False
    ) -> AsyncIterator[Event]:
        """As :meth:`fenced.Client.watch`: an async iterator of events,
        reopened from the last revision (with the same backoff) when the
        stream breaks. Leave the loop (or ``aclose()`` it) to cancel the stream."""
        loop = _WatchLoop(self, slug, from_revision, sections, progress)
        while True:
            req, compression = loop.request(0)
            call = self._records.Watch(req, metadata=self._metadata, compression=compression)
            err: Optional[grpc.RpcError] = None
            try:
                async for resp in call:
                    for ev in loop.events(resp):
                        yield ev
            except grpc.RpcError as e:
                err = e
            finally:
                call.cancel()
            pause = loop.broke(err, 0)
            err = None
            if pause > 0:
                await asyncio.sleep(pause)

    async def update(
        self,
        slug: str,
        change: Callable[[Txn], None],
        *,
        fence: FenceArg = FENCE_MISSING,
        replica_ack: Optional[ReplicaAck] = None,
        timeout: Optional[float] = None,
        claim: Optional[ClaimFence] = None,
        view: bool = True,
    ) -> int:
        """As :meth:`fenced.Client.update` (the same reruns, resends under
        one request id, and overall ``timeout``; ``fence`` required unless
        ``claim`` is given; reading from the swarm's :meth:`view` unless
        ``view`` is False); ``change`` is a plain function, run in a worker
        thread (see the module's doc)."""
        lease_fence(fence, claim)  # ValueError before anything runs
        per_call = self._timeout
        deadline = _Deadline(per_call if timeout is None else timeout)
        reads = _LoopReads(self, asyncio.get_running_loop(), deadline, per_call)
        views = _ViewRuns(self.view(slug), deadline, per_call) if view and not self._closed else None
        steps = _update_steps(slug, deadline, per_call, self._cancelled_by_caller)
        try:
            return await _drive(steps, reads, self, slug, change, fence, replica_ack, claim, views)
        finally:
            reads.done = True

    # Leases.

    async def acquire(self, slug: str, owner: str, *, ttl_ms: int, name: str = "", timeout: Optional[float] = None) -> Lease:
        """As :meth:`fenced.Client.acquire`."""
        req = lease_pb2.AcquireRequest(slug=slug, name=name, owner=owner, ttl_ms=ttl_ms)
        resp = await self._call(self._leases.Acquire, req, timeout)
        self._saw(slug, resp.revision)
        return _lease(resp.lease, resp.revision, resp.replicas_acked)

    async def renew(self, slug: str, owner: str, epoch: int, *, ttl_ms: int, name: str = "", timeout: Optional[float] = None) -> Lease:
        """As :meth:`fenced.Client.renew`."""
        req = lease_pb2.RenewRequest(slug=slug, name=name, owner=owner, epoch=epoch, ttl_ms=ttl_ms)
        resp = await self._call(self._leases.Renew, req, timeout)
        self._saw(slug, resp.revision)
        return _lease(resp.lease, resp.revision, resp.replicas_acked)

    async def release(self, slug: str, owner: str, epoch: int, *, name: str = "", timeout: Optional[float] = None) -> int:
        """As :meth:`fenced.Client.release`."""
        req = lease_pb2.ReleaseRequest(slug=slug, name=name, owner=owner, epoch=epoch)
        revision = (await self._call(self._leases.Release, req, timeout)).revision
        self._saw(slug, revision)
        return int(revision)

    async def current(self, slug: str, *, name: str = "", timeout: Optional[float] = None) -> Current:
        """As :meth:`fenced.Client.current`."""
        before = self._mark(slug)
        resp = await self._call(self._leases.Current, lease_pb2.CurrentRequest(slug=slug, name=name), timeout)
        self._read(slug, before, resp.revision)
        return _current(resp)

    def keep(self, slug: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> "_Keeping":
        """Acquire and keep the swarm's lease: ``k = await c.keep(...)`` or
        ``async with c.keep(...) as k``; see :class:`LeaseKeeper`."""
        return _Keeping(LeaseKeeper(self, slug, owner, ttl_ms=ttl_ms), wait)

    def keep_claim(self, slug: str, name: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> "_Keeping":
        """Acquire and keep the swarm's claim ``name``: ``k = await
        c.keep_claim(...)`` or ``async with c.keep_claim(...) as k``; the
        keeper's fence is ``claim=k.claim()`` (see :class:`fenced.ClaimKeeper`)."""
        return _Keeping(LeaseKeeper(self, slug, owner, ttl_ms=ttl_ms, name=name), wait)

    # Administration.

    async def migrate(
        self, slug: str, *, dry_run: bool = False, writers_upgraded: bool = False, timeout: Optional[float] = None
    ) -> MigrateResult:
        """Move the swarm from the document layout onto records
        (AdminService.Migrate, proto/fenced/v1/admin.proto): every record of
        the document written with one new revision, in one transaction.
        ``writers_upgraded`` confirms that every live reader and writer of the
        swarm reads the records layout (required: INVALID_ARGUMENT naming
        writers_upgraded without it); ``dry_run`` answers the plan and writes
        nothing. A swarm already moved, or without state, answers
        ``records == 0`` (``already_moved``, ``no_state``).

        Raises InvalidArgument, LayoutDocument (Redis Cluster), RevisionConflict
        (the swarm kept changing; nothing committed: run it again),
        Unavailable, FencedError."""
        req = admin_pb2.MigrateRequest(slug=slug, writers_upgraded=writers_upgraded, dry_run=dry_run)
        out = _migration(await self._call(self._admin.Migrate, req, timeout))
        if out.revision:
            self._saw(slug, out.revision)
        return out


async def _drive(
    steps: Generator[Any, Any, int],
    reads: "_LoopReads",
    c: Client,
    slug: str,
    change: Callable[[Txn], None],
    fence: FenceArg,
    replica_ack: Optional[ReplicaAck],
    claim: Optional[ClaimFence] = None,
    views: Optional[Any] = None,
) -> int:
    """Run update's steps (fenced.update._update_steps) on the event loop.
    A cancellation while the batch may have been sent is UpdateCancelled,
    naming it (fenced.update._Sent)."""
    result: Any = None
    sent = _Sent()
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, _Sleep):
                    await asyncio.sleep(step.seconds)
                    result = None
                elif isinstance(step, _RunChange):
                    result = await asyncio.to_thread(_run_change, reads, slug, change, views, step.conflict)
                else:
                    assert isinstance(step, _Commit)
                    result = (await c.fenced_batch(
                        slug, step.writes, fence=fence, request_id=step.request_id, replica_ack=replica_ack,
                        timeout=step.timeout, claim=claim,
                    )).revision
            except asyncio.CancelledError as e:
                steps.close()
                if (commit := sent.at(step)) is None:
                    raise
                out = errors.UpdateCancelled(*e.args)
                out._in_flight(slug, commit.request_id, commit.writes, _fence_arg(fence), claim, replica_ack)
                raise out from e
            except BaseException as e:  # noqa: BLE001 - the policy decides; it re-raises what it does not handle
                sent.answered(step, e)
                step = steps.throw(e)
            else:
                sent.answered(step, None)
                step = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class _LoopReads:
    """The aio Client as the Txn of an update sees it from its worker thread:
    each coroutine method runs on the event loop and is waited for; each
    call that takes a ``timeout`` gets the Client's or what is left of the
    update's. After the update ends (or is cancelled) every call raises."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop, deadline: _Deadline, per_call: float) -> None:
        self._c = client
        self._loop = loop
        self._deadline = deadline
        self._per_call = per_call
        self.done = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._c, name)
        if inspect.iscoroutinefunction(attr):
            return self._bridge(attr)
        if inspect.isasyncgenfunction(attr):
            return self._bridge_iter(attr)
        return attr

    def _kwargs(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.done:
            raise errors.FencedError("update: a read after the update ended (cancelled or timed out)",
                                     code=grpc.StatusCode.CANCELLED)
        if _takes_timeout(fn):
            kwargs.setdefault("timeout", self._deadline.call_timeout(self._per_call))
        return kwargs

    def _bridge(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs = self._kwargs(fn, kwargs)
            return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop).result()

        return call

    def _bridge_iter(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def iterate(*args: Any, **kwargs: Any) -> Any:
            it = fn(*args, **self._kwargs(fn, kwargs))
            while True:
                try:
                    yield asyncio.run_coroutine_threadsafe(it.__anext__(), self._loop).result()
                except StopAsyncIteration:
                    return

        return iterate


class LeaseKeeper(_Held):
    """Holds a swarm's lease from an asyncio task: :class:`fenced.LeaseKeeper`'s
    rules (acquire within ``wait``, renew every third of the TTL, lost on
    StaleLease, when no renewal succeeded in time, or on a take-over heard
    on the swarm's Watch stream by another task; logged the same way) with
    :attr:`lost` an ``asyncio.Event``. Made by :meth:`Client.keep`; ``await
    close()`` (or leave ``async with``) stops it and releases the lease."""

    def __init__(self, client: Client, slug: str, owner: str, *, ttl_ms: int, name: str = "") -> None:
        super().__init__(slug, owner, ttl_ms, name)
        self._c = client
        self.lost = asyncio.Event()
        """Set when the lease is lost (or released by close)."""
        self._task: Optional["asyncio.Task[None]"] = None
        self._follower: Optional["asyncio.Task[None]"] = None

    def _signal_lost(self) -> None:
        self.lost.set()
        f = self._follower
        if f is not None and f is not asyncio.current_task():
            f.cancel()

    async def _start(self, wait: Optional[float]) -> "LeaseKeeper":
        a = _Acquiring(self._label, self.owner, self._ttl, self._c._timeout if wait is None else wait)
        while True:
            sent = time.monotonic()
            try:
                lease = await self._c.acquire(self.slug, self.owner, ttl_ms=self.ttl_ms, name=self.name,
                                              timeout=a.call_timeout(self._c._timeout))
                break
            except errors.FencedError as e:
                pause = a.pause(e)
            await asyncio.sleep(pause)
        self._granted(sent, lease)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._renew(), name=f"fenced-keeper-{self.slug}")
        self._follower = loop.create_task(self._follow(lease.revision), name=f"fenced-keeper-follow-{self.slug}")
        return self

    async def _follow(self, start: int) -> None:
        """As the sync keeper's: a take-over heard on the swarm's Watch
        stream (meta records, claim events) marks the lease lost at once."""
        wait = 0.05
        while not self.lost.is_set():
            try:
                async for ev in self._c.watch(self.slug, start, sections=("meta",)):
                    start = ev.revision
                    wait = 0.05
                    err = self._taken_over(ev)
                    if err is not None:
                        self._mark_lost(err)
                        return
            except errors.RevisionCompacted:
                start = 0  # what was missed cannot be read: from now on
            except errors.FencedError as e:
                _log.debug("keep %s: its watch ended (%s); opening it again", self._label, e)
            await asyncio.sleep(wait * random.uniform(0.5, 1.5))
            wait = min(wait * 2, 5.0)

    async def _renew(self) -> None:
        period = self._ttl / 3
        while True:
            await asyncio.sleep(period)
            sent = time.monotonic()
            try:
                await self._c.renew(self.slug, self.owner, self.epoch, ttl_ms=self.ttl_ms, name=self.name, timeout=period)
            except errors.FencedError as e:
                if self._renewal_failed(e):
                    return
                continue
            self._renewed(sent)

    async def close(self) -> None:
        """Stop renewing and release the lease if it is still held. Idempotent;
        raises FencedError when the release fails for another reason than StaleLease."""
        for task in (self._task, self._follower):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self.error is not None:
            return
        try:
            await self._c.release(self.slug, self.owner, self.epoch, name=self.name)
        except errors.StaleLease as e:
            self._mark_lost(e)
            return
        self._mark_lost(errors.FencedError(f"lease of {self._label} released"), released=True)

    async def __aenter__(self) -> "LeaseKeeper":
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            await self.close()
        except errors.FencedError:
            if exc_type is None:
                raise


class _Keeping:
    """What :meth:`Client.keep` answers: awaited, the started keeper; as
    ``async with``, the keeper for the block, closed after it."""

    def __init__(self, keeper: LeaseKeeper, wait: Optional[float]) -> None:
        self._k = keeper
        self._wait = wait

    def __await__(self) -> Generator[Any, None, LeaseKeeper]:
        return self._k._start(self._wait).__await__()

    async def __aenter__(self) -> LeaseKeeper:
        return await self._k._start(self._wait)

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self._k.__aexit__(exc_type, exc, tb)



class View(_Reads):
    """A swarm's records kept by its Watch stream, from a task of the event
    loop it was made on: :class:`fenced.View`'s rules, its reads awaited
    (``await view.sync()``, ``await view.snapshot(...)``, ``await
    view.record(...)``, ``await view.close()``); ``revision`` and
    ``memory_bytes()`` as the sync view's. Made by :meth:`Client.view`;
    ``update`` reads from it from its worker thread."""

    def __init__(self, client: Client, slug: str, names: tuple[str, ...] = ()) -> None:
        self._c = client
        self.slug = slug
        self.names = names
        self._s = _State(slug, names)
        self._born = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()
        self._s.on_change = self._woken.set  # under the lock, on the loop (lists, events, commits)
        self._relist_wanted = False
        self._following: Optional["asyncio.Task[None]"] = None
        self._task = self._loop.create_task(self._run(), name=f"fenced-view-{slug}")

    async def sync(self, timeout: Optional[float] = None) -> int:
        """As :meth:`fenced.View.sync`, awaited."""
        end = self._timeout(timeout)
        await self._until(lambda: self._s.loaded, end, 0)
        want = (await self._c.current(self.slug, timeout=max(end - time.monotonic(), 0.001))).revision
        with self._s.lock:
            gen = self._s.generation
        try:
            await self._until(lambda: self._s.caught_up(want), min(end, time.monotonic() + _SYNC_GRACE_S), want)
            return int(want)
        except ViewBehind:
            if time.monotonic() >= end:
                raise
        with self._s.lock:
            moved = self._s.generation != gen
        if not moved:
            self._relist_now()
        await self._until(lambda: self._s.caught_up(want), end, want)
        return int(want)

    async def snapshot(self, *names: str, fresh: bool = True, timeout: Optional[float] = None) -> Snapshot:
        """As :meth:`fenced.View.snapshot`, awaited."""
        return self._snapshot_of(await self._take(fresh, timeout), names)

    async def record(self, section: str, key: str, *, fresh: bool = True, timeout: Optional[float] = None) -> Optional[Record]:
        """As :meth:`fenced.View.record`, awaited."""
        return self._record_of(await self._take(fresh, timeout), section, key)

    async def close(self) -> None:
        """Stop following the swarm. Idempotent."""
        with self._s.lock:
            self._s.closed = True
            self._s.cond.notify_all()
        self._woken.set()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    def __repr__(self) -> str:
        return f"<fenced.aio.View {self.slug!r} at {self.revision}>"

    async def _take(self, fresh: bool, timeout: Optional[float]) -> Taken:
        end = self._timeout(timeout)
        if fresh:
            await self.sync(max(end - time.monotonic(), 0.001))
        else:
            await self._until(lambda: self._s.loaded, end, 0)
        with self._s.lock:
            return self._s.take()

    async def _until(self, ok: Callable[[], bool], end: float, want: int) -> None:
        """_Reads._wait on the event loop."""
        while True:
            with self._s.lock:
                if ok():
                    return
                self._why_not(end, want)
                self._woken.clear()
            try:
                await asyncio.wait_for(self._woken.wait(), max(end - time.monotonic(), 0))
            except asyncio.TimeoutError:
                pass

    # From update's worker thread.

    def _current_revision(self, timeout: float) -> int:
        fut = asyncio.run_coroutine_threadsafe(self._c.current(self.slug, timeout=timeout), self._loop)
        return int(fut.result(timeout + 5).revision)

    def _ask_relist(self) -> None:
        self._loop.call_soon_threadsafe(self._relist_now)

    # The task.

    def _relist_now(self) -> None:
        self._relist_wanted = True
        if self._following is not None:
            self._following.cancel()

    def _failed(self, e: BaseException) -> None:
        with self._s.lock:
            self._s.error = e
            self._s.cond.notify_all()
        self._woken.set()

    async def _run(self) -> None:
        waits = iter(_backoff())
        layout: Optional[Layout] = None
        while layout is None:
            try:
                layout = await self._c.layout(self.slug)
            except errors.FencedError as e:
                self._failed(e)
                await asyncio.sleep(next(waits))
        if layout != Layout.RECORDS:
            with self._s.lock:
                self._s.unsupported = layout
                self._s.cond.notify_all()
            self._woken.set()
            return
        waits = iter(_backoff())
        while not self._s.closed:
            try:
                await self._list(EVERY, 0)
                if self._relist_wanted:
                    continue  # asked while that list ran, which may predate what the asker saw: list again
                self._following = self._loop.create_task(self._follow())
                await asyncio.wait({self._following})
                following, self._following = self._following, None
                if not following.cancelled():
                    following.result()  # its error, if any
                waits = iter(_backoff())
            except errors.RevisionCompacted as e:
                _view_log.info("view %s: %s; listing again", self.slug, e)
            except (errors.FencedError, grpc.RpcError, ValueError) as e:
                self._failed(e)
                pause = next(waits)
                _view_log.warning("view %s: %s; listing again in %.2fs", self.slug, e, pause)
                await asyncio.sleep(pause)
            finally:
                if self._following is not None:
                    self._following.cancel()

    async def _list(self, names: frozenset, at: int) -> None:  # type: ignore[type-arg]
        seq = 0
        if not names:
            with self._s.lock:
                self._s.lists_started += 1
                seq = self._s.lists_started
            self._relist_wanted = False
        try:
            snap = await self._c.sections(self.slug, *sorted(names or self.names))
        except errors.RevisionWentBackwards:
            snap = await self._c.sections(self.slug, *sorted(names or self.names))
        with self._s.lock:
            self._s.load(snap, names, at, seq)

    async def _follow(self) -> None:
        start = self._s.revision
        from_now = start == 0
        async for ev in self._c.watch(self.slug, start, progress=True):
            if from_now and ev.progress:
                from_now = False
                if ev.revision != 0:
                    await self._list(EVERY, 0)
                continue
            with self._s.lock:
                need = self._s.apply(ev)
            if need is not None:
                await self._list(need, ev.revision)
