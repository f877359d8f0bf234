"""Update: "read, change, write" as one fenced batch, as the Go client's
``client.Update`` (client/update.go), with the same semantics."""

from __future__ import annotations

import inspect
import json
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, MutableMapping, Optional, Sequence, Union

import grpc

from . import errors
from .model import (
    FENCE_MISSING,
    UNFENCED,
    Check,
    CheckCount,
    CheckRecords,
    CheckSection,
    ClaimFence,
    Delete,
    FenceArg,
    LeaseFence,
    Put,
    Record,
    ReplicaAck,
    Write,
    count_check,
    dumps,
    lease_fence,
    new_request_id,
)
from .revisions import later_revision
from .view import _NO_STATS, count_check_of

if TYPE_CHECKING:
    from .client import Client
    from .view import Taken

__all__ = ["MAX_LOST_REPLY_RETRIES", "MAX_UPDATE_ATTEMPTS", "SectionView", "Txn", "commit", "update"]

MAX_UPDATE_ATTEMPTS = 16
"""How many times update runs a change that keeps meeting revision conflicts
before it raises KeptChanging."""

MAX_LOST_REPLY_RETRIES = 3
"""How many times update resends a batch whose answer leaves open whether it
committed (UNAVAILABLE but REPLICATION_TIMEOUT, DEADLINE_EXCEEDED of one call,
CANCELLED not by the caller), under the same request id."""

_log = logging.getLogger("fenced.update")

# The sleep before a rerun grows, as the Go client's (RerunWait*): 2 ms before
# the second attempt, doubling up to 256 ms, each randomised by +-50 %.
_RERUN_INITIAL_S, _RERUN_MULTIPLIER, _RERUN_MAX_S, _RERUN_RANDOMISATION = 0.002, 2, 0.256, 0.5

# The Go client resends a lost reply after backoff's default exponential
# schedule: 0.5 s, times 1.5 each time, each randomised by +-50 %.
_RESEND_INITIAL_S, _RESEND_MULTIPLIER, _RESEND_RANDOMISATION = 0.5, 1.5, 0.5

_Ref = tuple[str, str]  # (section, key)


class _Pending:
    __slots__ = ("value", "bound")

    def __init__(self, value: Optional[str], bound: bool = False) -> None:
        self.value = value  # None: delete
        self.bound = bound  # a put bound to the batch's claim


class Txn:
    """One run of an update's change: reads on demand, records what was read,
    and buffers writes (read-your-writes). Not safe for use by several threads;
    valid only inside the change.

    Reading a key (``get``, ``tx.section(s)[key]``, ``key in``) checks that
    record at commit. Reading a section whole (iterating a
    :class:`SectionView`, ``len``, ``==``, ``keys``/``items``/``values``,
    ``copy``) fences the batch by every record the section held when read
    (the in-house ``fencing.write`` rule): one :class:`CheckCount` of the
    snapshot, or one :class:`CheckRecords` of its records when a record read
    is stored after the snapshot's revision. Any writer's change to them,
    fenced's or not, conflicts; inserts of other keys pass. ``tx.section(name, phantom_proof=True)`` fences it with one
    :class:`CheckSection` instead (see :meth:`section`).
    """

    def __init__(self, client: "Client", slug: str, taken: Optional["Taken"] = None) -> None:
        self._c = client
        self._slug = slug
        # The swarm's view at the attempt's start (update reads from it):
        # what it holds is read with no call.
        self._taken = taken
        self._read: dict[_Ref, Record] = {}
        self._absent: set[_Ref] = set()
        self._sections: dict[str, dict[str, Record]] = {}
        self._section_revs: dict[str, int] = {}
        self._snap_revs: dict[str, int] = {}  # the swarm revision each section's snapshot was read at
        self._phantom_proof: set[str] = set()
        self._whole: set[str] = set()
        self._pending: dict[_Ref, _Pending] = {}  # insertion order: first-write order
        self.seen = taken.revision if taken is not None else 0
        """The highest swarm revision this Txn read at."""

    def _see(self, rev: int) -> None:
        self.seen = later_revision(self.seen, rev)

    def _lookup(self, r: _Ref) -> Optional[Record]:
        if r in self._read:
            return self._read[r]
        if r in self._absent:
            return None
        sec = self._sections.get(r[0])
        if sec is None and self._taken is not None and self._taken.covers(r[0]):
            sec = self._taken.section(r[0])
        if sec is not None:
            rec = sec.get(r[1])
        else:
            rec, rev = self._c.record_at(self._slug, r[0], r[1])
            self._see(rev)
        if rec is None:
            self._absent.add(r)
        else:
            self._read[r] = rec
        return rec

    def get(self, section: str, key: str) -> Optional[str]:
        """One record's JSON text (None when absent), seeing this Txn's own
        writes. The record is checked at commit. Raises FencedError."""
        r = (section, key)
        if r in self._pending:
            return self._pending[r].value
        rec = self._lookup(r)
        return None if rec is None else rec.value

    def get_json(self, section: str, key: str, default: Any = None) -> Any:
        """``get`` parsed with json.loads; ``default`` when absent."""
        raw = self.get(section, key)
        return default if raw is None else json.loads(raw)

    def put(self, section: str, key: str, value: str, bind_to_claim: bool = False) -> None:
        """Store ``value`` (JSON text) at commit, expecting the revision the
        record was read at (it is read first when this Txn has not read it).
        ``bind_to_claim=True`` binds it to the update's claim (``claim=``; see
        :class:`fenced.Put`)."""
        if not isinstance(value, str):
            raise TypeError(f"put {section}/{key}: value must be JSON text (str); use put_json or fenced.dumps")
        self._write((section, key), _Pending(value, bind_to_claim))

    def put_json(self, section: str, key: str, obj: Any, bind_to_claim: bool = False) -> None:
        """``put`` of :func:`fenced.dumps` (obj), bound to the update's claim
        with ``bind_to_claim=True``."""
        self.put(section, key, dumps(obj), bind_to_claim)

    def delete(self, section: str, key: str) -> None:
        """Remove (section, key) at commit, expecting the revision it was read at."""
        self._write((section, key), _Pending(None))

    def _write(self, r: _Ref, p: _Pending) -> None:
        self._lookup(r)
        self._pending[r] = p  # a rewrite keeps the first-write position

    def section(self, name: str, *, phantom_proof: bool = False) -> "SectionView":
        """Load a whole section (one snapshot, on first use) and return a
        mutable mapping view of it, with this Txn's writes applied. Raises FencedError.

        Read whole, the section is checked at commit by every record it held
        (one CheckCount, or CheckRecords). With ``phantom_proof=True`` (in any call of this Txn
        for ``name``) it is checked by its section revision instead (one
        CheckSection): the batch then also conflicts with any record inserted
        into the section since the read, by anyone, so a busy section's update
        may rerun until KeptChanging. Caveat: section revisions are kept by
        fenced alone; a writer that bypasses fenced (an older Lua batch writing
        the hash) raises none, so its changes to the records read are missed.
        """
        if phantom_proof:
            self._phantom_proof.add(name)
        t = self._taken
        if name in self._phantom_proof and name in self._sections and name not in self._section_revs:
            del self._sections[name]  # taken from the view, which keeps no section revisions: read it from fenced
        if name not in self._sections and t is not None and t.covers(name) and name not in self._phantom_proof:
            # From the view: its records, no call; every batch up to its
            # revision applied (records applied ahead stand after it).
            self._sections[name] = t.section(name)  # type: ignore[assignment]
            self._snap_revs[name] = t.revision
        if name not in self._sections:
            snap = self._c.sections(self._slug, name)
            self._see(snap.revision)
            self._sections[name] = dict(snap.sections.get(name, {}))
            self._section_revs[name] = snap.section_revisions.get(name, 0)
            self._snap_revs[name] = snap.revision
        return SectionView(self, name)

    def _current(self, name: str) -> dict[str, str]:
        """The section as the change sees it; marks it read whole."""
        self._whole.add(name)
        out = {k: rec.value for k, rec in self._sections[name].items()}
        for (section, key), p in self._pending.items():
            if section != name:
                continue
            if p.value is None:
                out.pop(key, None)
            else:
                out[key] = p.value
        return out

    def _batch(self) -> Optional[list[Write]]:
        """The diff as writes (puts and deletes expecting their read revisions,
        then a check of every other record read); None when nothing changes."""

        def expected(r: _Ref) -> int:
            rec = self._read.get(r)
            return rec.revision if rec is not None else 0

        writes: list[Write] = []
        written: set[_Ref] = set()
        for r, p in self._pending.items():
            rec = self._read.get(r)
            same = p.value is not None and rec is not None and rec.value == p.value and not p.bound and not rec.claim
            if (p.value is None and rec is None) or same:
                continue  # no change: checked below like any other read (a bound put, or one unbinding, is a change)
            if p.value is None:
                writes.append(Delete(r[0], r[1], expected(r)))
            else:
                writes.append(Put(r[0], r[1], expected(r), p.value, p.bound))
            written.add(r)
        if not writes:
            return None

        # A record of a section read whole that was also read on its own at
        # another revision than the snapshot's (it changed between the two
        # reads) is checked by itself, not by the section's check.
        def covered(r: _Ref) -> bool:
            if r[0] not in self._whole:
                return False
            snap = self._sections[r[0]].get(r[1])
            rec = self._read.get(r)
            if rec is not None:
                return snap is not None and snap.revision == rec.revision
            return snap is None

        # A section read whole is fenced by one write, whatever its size: a
        # CheckCount of its snapshot when that rule holds (_count_check), else
        # a CheckRecords of every record of the snapshot and every key of it
        # read as absent (unless written, or checked by itself), or with
        # phantom_proof a CheckSection at the section revision read. Keys of
        # a counted section read as absent are checked one by one (below):
        # the count lets inserts of other keys through.
        counted: set[str] = set()
        for name in sorted(self._whole):
            if name in self._phantom_proof:
                writes.append(CheckSection(name, self._section_revs[name]))
                continue
            cc = self._count_check(name)
            if cc is not None:
                counted.add(name)
                if any((name, k) not in written for k in self._sections[name]):
                    writes.append(cc)  # else each record is checked by its own write
                continue
            checks: dict[str, int] = {}
            for key, snap_rec in self._sections[name].items():
                r = (name, key)
                on_its_own = r in self._read or r in self._absent
                if r not in written and (not on_its_own or covered(r)):
                    checks[key] = snap_rec.revision
            for r in self._absent:
                if r[0] == name and r not in written and covered(r):
                    checks[r[1]] = 0
            if checks:
                writes.append(CheckRecords(name, dict(sorted(checks.items()))))

        checked: set[_Ref] = set()
        for r in sorted(self._read) + sorted(self._absent):
            if r in written or r in checked or covered(r) and not (r[0] in counted and r in self._absent):
                continue
            checked.add(r)
            writes.append(Check(r[0], r[1], expected(r)))
        return writes


    def _count_check(self, name: str) -> Optional[CheckCount]:
        """The CheckCount of section ``name`` read whole (count_check of its
        snapshot), or None when it would not be the records check's rule: a
        record stored after the snapshot's revision, a section read empty, or a
        record of the snapshot read on its own at another revision or as
        absent (it changed between the two reads)."""
        snap = self._sections[name]
        for r, rec in self._read.items():
            s = snap.get(r[1]) if r[0] == name else None
            if s is not None and s.revision != rec.revision:
                return None
        for r in self._absent:
            if r[0] == name and r[1] in snap:
                return None
        t = self._taken
        if t is not None and snap is t.section(name):
            return count_check_of(name, self._snap_revs[name], t.stats.get(name, _NO_STATS))  # the view's sums
        return count_check(name, self._snap_revs[name], snap)


class SectionView(MutableMapping[str, str]):
    """A Txn's view of one whole section: key -> JSON text, with the Txn's own
    writes applied. ``view[key]``, ``get``, ``in`` read one key (checked at
    commit); ``view[key] = text`` puts, ``del view[key]`` deletes; iterating,
    ``len``, ``==``, ``keys``/``items``/``values`` and ``copy`` read it whole
    (one CheckRecords of its records at commit; one CheckSection when the
    section was taken with ``phantom_proof=True``). Iteration is in key
    order."""

    def __init__(self, tx: Txn, name: str) -> None:
        self._tx = tx
        self.name = name

    def __getitem__(self, key: str) -> str:
        v = self._tx.get(self.name, key)
        if v is None:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, value: str) -> None:
        self._tx.put(self.name, key, value)

    def __delitem__(self, key: str) -> None:
        if self._tx.get(self.name, key) is None:
            raise KeyError(key)
        self._tx.delete(self.name, key)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tx._current(self.name)))

    def __len__(self) -> int:
        return len(self._tx._current(self.name))

    def __eq__(self, other: object) -> bool:
        cur = self._tx._current(self.name)
        if isinstance(other, SectionView):
            return cur == other._tx._current(other.name)
        if isinstance(other, dict):
            return cur == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> dict[str, str]:
        """The section's records as a dict (reads it whole)."""
        return self._tx._current(self.name)

    def get_json(self, key: str, default: Any = None) -> Any:
        """The record parsed with json.loads; ``default`` when absent."""
        return self._tx.get_json(self.name, key, default)

    def put_json(self, key: str, obj: Any) -> None:
        """Put :func:`fenced.dumps` (obj) under key."""
        self._tx.put_json(self.name, key, obj)

    def __repr__(self) -> str:
        return f"<fenced.SectionView {self.name!r}>"


def update(
    client: "Client",
    slug: str,
    change: Callable[[Txn], None],
    *,
    fence: FenceArg = FENCE_MISSING,
    replica_ack: Optional[ReplicaAck] = None,
    timeout: Optional[float] = None,
    claim: Optional[ClaimFence] = None,
    view: bool = True,
) -> int:
    """Turn "read, change, write" into one fenced batch, as the Go client's Update.

    Runs ``change`` on a fresh :class:`Txn`, which reads records on demand and
    records what was read: each key, and whether a section was read whole.
    With ``view`` (the default) it reads from the Client's view of the swarm
    (:meth:`fenced.Client.view`, kept by its Watch stream; no call for what
    the view holds), a rerun once the view has caught up with the swarm;
    a swarm that cannot have one (the document layout, no state yet) is
    read from fenced, as with ``view=False``. The
    result is diffed into puts and deletes expecting the revisions they were
    read at, plus a check of every record read but not written (one
    CheckRecords of its records for a section read whole, or one CheckSection
    with ``tx.section(name, phantom_proof=True)``), and sent as one batch under ``fence``
    (the lease's, keeper.fence(); or :data:`fenced.UNFENCED`, unfenced by
    choice) and ``claim`` (a :class:`ClaimFence`). ``fence`` left out or None
    without a ``claim`` raises ValueError at once: ``change`` does not run,
    nothing is sent. A change that writes nothing sends nothing and answers
    the highest revision it saw.

    On RevisionConflict it sleeps (2 ms, doubling up to 256 ms, +-50 %) and
    reruns ``change``, up
    to MAX_UPDATE_ATTEMPTS (16) in all, then raises KeptChanging ("the swarm
    fencing state kept changing; nothing was committed"; its ``__cause__`` is
    the last conflict). ``change`` may run several times: it must have no side
    effects outside the Txn. On StaleLease, on any other error and on an
    exception of ``change`` itself, it stops at once and raises it.

    Every attempt's batch carries a fresh request id. An answer after which
    the batch may have committed is resent under the same id (fenced answers a
    batch that did commit with its original revision, so it is applied at most
    once), up to MAX_LOST_REPLY_RETRIES times, 0.5 s apart growing 1.5 times
    (+-50 %): Unavailable (but not ReplicationTimeout, which did commit),
    DeadlineExceeded of that one call, and Cancelled unless the Client was
    closed. Each resend is logged (logger ``fenced.update``, WARNING).

    ``timeout`` bounds the whole update, in seconds (None: the Client's
    timeout): every call it makes (reads, batches, resends) gets the Client's
    timeout or what is left, whichever is less, and it never sleeps past it.
    When it runs out it raises DeadlineExceeded, whose ``request_id`` names the
    last batch sent (which may or may not have committed when its answer was
    lost) and whose ``__cause__`` is the last error. Every error raised from a
    batch carries its ``request_id``.

    Returns the revision the batch committed at.
    """
    lease_fence(fence, claim)  # ValueError before anything runs
    per_call = client._timeout
    deadline = _Deadline(per_call if timeout is None else timeout)
    reads = _BoundedReads(client, deadline, per_call)
    views = _ViewRuns(client.view(slug), deadline, per_call) if view and not client._closed else None
    steps = _update_steps(slug, deadline, per_call, client._cancelled_by_caller)
    return _drive(client, slug, steps, fence, replica_ack,
                  lambda step: _run_change(reads, slug, change, views, step.conflict), time.sleep, claim)


def commit(
    client: "Client",
    slug: str,
    writes: Sequence[Write],
    *,
    fence: FenceArg = FENCE_MISSING,
    replica_ack: Optional[ReplicaAck] = None,
    timeout: Optional[float] = None,
    sleep: Callable[[float], None] = time.sleep,
    claim: Optional[ClaimFence] = None,
) -> int:
    """Send ``writes`` as one fenced batch under a fresh request id and resend
    it under the same id while its answer leaves open whether it committed:
    :func:`update`'s resends (the same outcomes, MAX_LOST_REPLY_RETRIES, the
    same waits, logged the same way) without its reruns. ``timeout`` bounds
    the sends and their waits in all, in seconds (None: the Client's timeout;
    ``math.inf``: only the Client's per-call timeout bounds each send); past
    it, DeadlineExceeded with the ``request_id``. ``sleep`` waits between
    sends. fenced.port's ``write`` commits through it.

    Returns the revision committed at. Raises what ``fenced_batch`` raises,
    each error carrying the ``request_id``."""
    per_call = client._timeout
    deadline = _Deadline(per_call if timeout is None else timeout)
    steps = _commit_steps(slug, list(writes), deadline, per_call, client._cancelled_by_caller)
    return _drive(client, slug, steps, fence, replica_ack, None, sleep, claim)


def _drive(
    client: "Client",
    slug: str,
    steps: Generator["_Step", Any, int],
    fence: FenceArg,
    replica_ack: Optional[ReplicaAck],
    run_change: Optional[Callable[["_RunChange"], tuple[Optional[list[Write]], int]]],
    sleep: Callable[[float], None],
    claim: Optional[ClaimFence] = None,
) -> int:
    """Run a policy's steps (_update_steps, _commit_steps) with blocking I/O;
    fenced.aio drives the same steps on its event loop. A KeyboardInterrupt
    while the batch may have been sent is UpdateInterrupted, naming it."""
    result: Any = None
    sent = _Sent()
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, _Sleep):
                    sleep(step.seconds)
                    result = None
                elif isinstance(step, _RunChange):
                    assert run_change is not None
                    result = run_change(step)
                else:
                    result = client.fenced_batch(
                        slug, step.writes, fence=fence, request_id=step.request_id, replica_ack=replica_ack,
                        timeout=step.timeout, claim=claim,
                    ).revision
            except KeyboardInterrupt as e:
                steps.close()
                if (commit := sent.at(step)) is None:
                    raise
                out = errors.UpdateInterrupted(*e.args)
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


class _Sent:
    """Whether a driver's batch may have been sent and not answered (a
    cancellation then leaves its outcome unknown): while its commit step is
    in flight, and after an answer that leaves the outcome open (the
    policy's resend pending), until a step ends it."""

    def __init__(self) -> None:
        self.pending: Optional[_Commit] = None

    def answered(self, step: "_Step", err: Optional[BaseException]) -> None:
        """step ended, with err (None: its result)."""
        if isinstance(step, _Commit):
            unknown = isinstance(err, errors.Unavailable) and not isinstance(err, errors.ReplicationTimeout)
            self.pending = step if unknown else None
        elif isinstance(step, _RunChange):
            self.pending = None

    def at(self, step: "_Step") -> Optional[_Commit]:
        """The batch whose outcome a cut at step leaves unknown, or None."""
        if isinstance(step, _Commit):
            return step
        return self.pending


def _fence_arg(fence: Any) -> Any:
    """The fence a resend of the batch goes under: the one given, UNFENCED
    for one left out (a claim fenced the batch)."""
    return UNFENCED if fence is FENCE_MISSING or fence is None else fence


# update's policy, as steps for a driver: the sync update above and
# fenced.aio's run the same generator, each doing the I/O its own way.


class _Sleep:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class _RunChange:
    """Run the change on a fresh Txn; send back (writes or None, seen).
    ``conflict``: the last attempt's (None for the first)."""

    __slots__ = ("conflict",)

    def __init__(self, conflict: Optional[errors.RevisionConflict] = None) -> None:
        self.conflict = conflict


class _Commit:
    """Send the batch; send back its revision (or throw its error)."""

    __slots__ = ("writes", "request_id", "timeout")

    def __init__(self, writes: list[Write], request_id: str, timeout: float) -> None:
        self.writes, self.request_id, self.timeout = writes, request_id, timeout


_Step = Union[_Sleep, _RunChange, _Commit]


class _Deadline:
    """An update's overall deadline, on the monotonic clock."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        return self.end - time.monotonic()

    def call_timeout(self, per_call: float) -> float:
        """A call's timeout: the per-call one, or what is left if less.
        Raises DeadlineExceeded when nothing is left."""
        left = self.left()
        if left <= 0:
            raise errors.DeadlineExceeded(
                f"update: its timeout of {self.timeout:g}s passed", code=grpc.StatusCode.DEADLINE_EXCEEDED
            )
        return min(per_call, left)


def _run_change(
    reads: Any, slug: str, change: Callable[[Txn], None], views: Optional["_ViewRuns"] = None,
    conflict: Optional[errors.RevisionConflict] = None,
) -> tuple[Optional[list[Write]], int]:
    """One run of the change on a fresh Txn reading through ``reads`` (and
    from the swarm's view, with ``views``; ``conflict``: the last attempt's):
    its batch (None when it changes nothing) and the highest revision it saw."""
    tx = Txn(reads, slug, views.take(conflict) if views is not None else None)
    try:
        change(tx)
    except Exception:
        if views is not None and not views.confirm(tx._taken):
            return _run_change(reads, slug, change, views)  # on the view caught up
        raise
    batch = tx._batch()
    if batch is None and views is not None and not views.confirm(tx._taken):
        return _run_change(reads, slug, change, views)
    return batch, tx.seen


class _ViewRuns:
    """The view an update's attempts read from: the first as the view
    stands; each rerun (after a conflict) once the view has caught up with
    the swarm (see fenced/view.py). A view that cannot serve (not listed in
    time, not caught up in time) leaves the update's later attempts to read
    from fenced."""

    def __init__(self, view: Any, deadline: "_Deadline", per_call: float) -> None:
        self.view = view
        self.deadline = deadline
        self.per_call = per_call
        self.taken: Optional["Taken"] = None
        self.caught_up = False  # the view has just caught up with the swarm (confirm)
        self.as_of_now = False  # the last take was after catching up

    def take(self, conflict: Optional[errors.RevisionConflict] = None) -> Optional["Taken"]:
        v = self.view
        if v is None:
            return None
        try:
            if self.caught_up:
                pass
            elif self.taken is None:
                if not v._usable(self.deadline.call_timeout(self.per_call)):
                    self.view = None
                    return None
            else:
                v._after_conflict(self.taken, self.deadline.call_timeout(self.per_call), conflict)
            self.as_of_now, self.caught_up = self.caught_up or self.taken is not None, False
            self.taken = v.take()
        except errors.FencedError as e:
            if isinstance(e, errors.DeadlineExceeded) and self.deadline.left() <= 0:
                raise
            _log.warning("update %s: its view cannot serve (%s); reading from fenced", v.slug, e)
            self.view = self.taken = None
        return self.taken


    def confirm(self, taken: Optional["Taken"]) -> bool:
        """Whether an attempt that sends nothing read the swarm as of now
        from ``taken``: always after a catch-up (a rerun); else the view
        catches up and must have applied nothing since. False: run the
        change again, on the view caught up (or reading from fenced when it
        cannot catch up in time)."""
        v = self.view
        if v is None or taken is None or self.as_of_now:
            return True
        try:
            if v._confirm(taken, self.deadline.call_timeout(self.per_call)):
                return True
            self.caught_up = True
        except errors.FencedError as e:
            if isinstance(e, errors.DeadlineExceeded) and self.deadline.left() <= 0:
                raise
            _log.warning("update %s: its view cannot catch up (%s); reading from fenced", v.slug, e)
            self.view = self.taken = None
        return False


def _gave_up(slug: str, deadline: _Deadline, request_id: str, cause: Optional[BaseException], committed: str) -> errors.DeadlineExceeded:
    err = errors.DeadlineExceeded(
        f"update {slug}: its timeout of {deadline.timeout:g}s passed; {committed}",
        code=grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    err.request_id = request_id
    err.__cause__ = cause
    return err


def _update_steps(
    slug: str, deadline: _Deadline, per_call: float, by_caller: Callable[[BaseException], bool]
) -> Generator[_Step, Any, int]:
    """update's reruns on conflict, within the deadline."""
    last: Optional[errors.RevisionConflict] = None
    wait = _RERUN_INITIAL_S
    for attempt in range(1, MAX_UPDATE_ATTEMPTS + 1):
        if attempt > 1:
            pause = wait * random.uniform(1 - _RERUN_RANDOMISATION, 1 + _RERUN_RANDOMISATION)
            wait = min(wait * _RERUN_MULTIPLIER, _RERUN_MAX_S)
            if pause >= deadline.left():
                assert last is not None
                raise _gave_up(slug, deadline, last.request_id, last, f"nothing was committed ({attempt - 1} attempts met conflicts)")
            _log.debug("update %s: attempt %d met a revision conflict; rerunning in %.3fs", slug, attempt - 1, pause)
            yield _Sleep(pause)
        writes, seen = yield _RunChange(last)
        if writes is None:
            return seen  # type: ignore[no-any-return]
        if deadline.left() <= 0:
            raise _gave_up(slug, deadline, "", last, "this attempt's batch was not sent")
        try:
            return (yield from _commit_steps(slug, writes, deadline, per_call, by_caller))
        except errors.RevisionConflict as e:
            last = e
    assert last is not None
    raise errors.KeptChanging(slug, MAX_UPDATE_ATTEMPTS, last) from last


def _commit_steps(
    slug: str, writes: list[Write], deadline: _Deadline, per_call: float, by_caller: Callable[[BaseException], bool]
) -> Generator[_Step, Any, int]:
    """Send one batch under a fresh request id and, while its answer leaves
    open whether it committed, resend it under the same id."""
    request_id = new_request_id()
    delay = _RESEND_INITIAL_S
    for resend in range(MAX_LOST_REPLY_RETRIES + 1):
        left = deadline.left()
        if left <= 0:
            raise _gave_up(slug, deadline, request_id, None, f"the batch under request id {request_id} may have committed")
        timeout = min(per_call, left)
        try:
            return (yield _Commit(writes, request_id, timeout))  # type: ignore[no-any-return]
        except errors.ReplicationTimeout:
            raise  # it committed; too few replicas acknowledged it
        except errors.Unavailable as e:  # DeadlineExceeded and Cancelled included
            if by_caller(e):
                raise
            # A call that ran into the update's own deadline leaves no time
            # to resend: the pause below outlasts what is left.
            if resend == MAX_LOST_REPLY_RETRIES:
                raise
            pause = delay * random.uniform(1 - _RESEND_RANDOMISATION, 1 + _RESEND_RANDOMISATION)
            delay *= _RESEND_MULTIPLIER
            if pause >= deadline.left():
                raise _gave_up(slug, deadline, request_id, e, f"the batch under request id {request_id} may have committed") from e
            _log.warning(
                "update %s: batch %s answered %s (it may have committed); resending under the same request id in %.2fs (%d of %d)",
                slug, request_id, e.code.name if isinstance(e.code, grpc.StatusCode) else e.code, pause,
                resend + 1, MAX_LOST_REPLY_RETRIES,
                extra={"slug": slug, "request_id": request_id},
            )
            yield _Sleep(pause)
    raise AssertionError("unreachable")


class _BoundedReads:
    """The Client as a Txn sees it during an update: each call that takes a
    ``timeout`` gets the Client's or what is left of the update's, whichever
    is less (unless it is given one)."""

    def __init__(self, client: Any, deadline: _Deadline, per_call: float) -> None:
        self._c = client
        self._deadline = deadline
        self._per_call = per_call

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._c, name)
        if not callable(attr) or not _takes_timeout(attr):
            return attr

        def bounded(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self._deadline.call_timeout(self._per_call))
            return attr(*args, **kwargs)

        return bounded


def _takes_timeout(fn: Callable[..., Any]) -> bool:
    try:
        return "timeout" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
