"""Views: a swarm's records kept in this process by its Watch stream.

A :class:`View` lists the swarm once (``sections``: one Sections read, or
StreamSections when too large), then follows its Watch stream from the
list's revision and applies each batch, so that reading the swarm costs no
call at all. It lists again when the stream cannot tell it what changed: a
REVISION_COMPACTED, a truncated event (its keys did not fit the log), or a
batch whose log entry names no keys (the in-house writers' entries carry
none: "something changed"). The Kubernetes API server's consistent read
from its cache is the model: a read "as of now" (:meth:`View.sync`) asks
the swarm's current revision with one cheap call (LeaseService/Current:
one short script, TIME, GET and HGET) and waits until the view has applied
every batch up to it, bounded by the caller's deadline; past it, it
refuses (:class:`ViewBehind`) rather than answer stale.

Writers need no fresh read: fenced.port's ``write`` and ``update`` read from
the view as it stands and their batch checks every record the change read,
as before, so a view behind Redis can only cost a conflict; the rerun then
waits for the view to catch up (and lists again if the view, caught up,
still cannot explain the conflict: a record whose claim lapsed, a writer
that bypassed the log). A batch this process commits is applied to the view
at once (its writes, at its revision), ahead of its event.

One view per swarm (and set of sections) per :class:`fenced.Client`, shared
by every thread; made on first use by ``Client.view``, the port and
``update``, kept until the Client closes (or :meth:`View.close`). The view
holds the records' JSON texts (and, for fenced.port, each value read once
more in marshal's encoding, and decoded, ready to hand out again):
:meth:`View.memory_bytes` says how much.

The shared core (:class:`_State`) is the asyncio view's too (fenced.aio).
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

import grpc

from . import _fork, errors
from ._fork import gate as _gate
from .model import REVISION_SUM_MODULUS, CheckCount, Delete, Event, Layout, Put, Record, Snapshot, Write
from .revisions import compare_revisions

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ARCHIVE", "View", "ViewBehind", "ViewUnsupported"]

_log = logging.getLogger("fenced.view")

ARCHIVE = "archive"
"""The section a view of "every section" leaves out (as Sections does)."""

EVERY: frozenset[str] = frozenset()
"""A relist of every section of the view."""

SYNC_GRACE_S = 0.25
"""How long a read as of now waits for the batches up to the swarm's
revision to reach the view by its stream before it lists again (when the
view applied nothing meanwhile): fenced's Watch hands a batch on within its
fan-out interval (50 ms); a writer that bypasses the log entirely leaves
only the counter moved."""


class ViewBehind(errors.DeadlineExceeded):
    """A read "as of now" from a view could not be answered within its
    deadline: the view had not applied every batch up to the swarm's current
    revision (``want``; ``have``: the view's). Nothing stale was answered.
    A :class:`fenced.DeadlineExceeded`."""

    def __init__(self, slug: str, want: int, have: int, why: str = "") -> None:
        super().__init__(
            f"view of {slug}: not caught up with revision {want} within the deadline (at {have}){why}",
            code=grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        self.slug, self.want, self.have = slug, want, have


class ViewUnsupported(errors.FencedError):
    """The swarm cannot be followed by a view: it is on the document layout
    (whose writes leave no log) or has no fencing state yet. Read it with
    the Client's calls; the port and ``update`` do so by themselves."""

    def __init__(self, slug: str, layout: Layout) -> None:
        super().__init__(f"view of {slug}: the swarm's layout is {layout.name}, not RECORDS",
                         code=grpc.StatusCode.FAILED_PRECONDITION)
        self.slug, self.layout = slug, layout


def _later(a: int, b: int) -> bool:
    return compare_revisions(a, b) > 0


class Taken:
    """What one read of a view holds: its sections at one point. The
    section dicts are the view's own, never changed after they were taken
    (the view copies a section before it next changes it)."""

    __slots__ = ("revision", "secs", "names", "generation", "cache", "free", "stats", "sorted_keys")

    def __init__(self, revision: int, secs: Mapping[str, Mapping[str, Record]], names: tuple[str, ...],
                 generation: int, cache: dict[tuple[str, str], tuple[int, str, bytes]],
                 free: Optional[dict[tuple[str, str], tuple[bytes, Any]]] = None,
                 stats: Optional[Mapping[str, "SectionStats"]] = None,
                 sorted_keys: Optional[dict[str, tuple[Mapping[str, Record], list[str]]]] = None) -> None:
        self.revision = revision
        """Every batch up to this revision is in ``secs``."""
        self.secs = secs
        self.names = names
        self.generation = generation
        """How many batches and lists the view had applied when taken."""
        self.cache = cache
        self.free = free if free is not None else {}
        """fenced.port's values as decoded, unchanged and held by nothing else, ready to hand out again."""
        self.stats = stats if stats is not None else {}
        """Each section's :class:`SectionStats` as ``secs`` holds it."""
        self.sorted_keys = sorted_keys if sorted_keys is not None else {}
        """fenced.port's sorted keys of a section: name -> (the section dict they are of, its keys sorted)."""

    def covers(self, section: str) -> bool:
        """Whether the view holds ``section`` (else it is read from fenced)."""
        return section != ARCHIVE if not self.names else section in self.names

    def section(self, name: str) -> Mapping[str, Record]:
        return self.secs.get(name, _EMPTY)


_EMPTY: Mapping[str, Record] = {}


class SectionStats(NamedTuple):
    """What a check of a section read whole by its count needs (model.count_check),
    kept by the view as it applies batches rather than summed per read."""

    count: int
    """How many records the section holds."""
    total: int
    """The sum of their revisions (exact)."""
    latest: int
    """The latest of their revisions in issue order (0: none; -1: unknown
    until recounted, after the latest record left)."""
    low: int
    """How many of them have a revision below 1."""


_NO_STATS = SectionStats(0, 0, 0, 0)


def _stats_of(recs: Mapping[str, Record]) -> SectionStats:
    total = low = 0
    latest = 0
    for r in recs.values():
        rev = r.revision
        total += rev
        if rev < 1:
            low += 1
        elif latest == 0 or compare_revisions(rev, latest) > 0:
            latest = rev
    return SectionStats(len(recs), total, latest, low)


def _restat(st: SectionStats, old: Optional[Record], new: Optional[Record]) -> SectionStats:
    """``st`` after a record ``old`` (None: absent) became ``new`` (None: gone)."""
    n, total, latest, low = st
    if old is not None:
        n, total = n - 1, total - old.revision
        if old.revision < 1:
            low -= 1
        elif old.revision == latest:
            latest = -1  # recounted when taken
    if new is not None:
        n, total = n + 1, total + new.revision
        if new.revision < 1:
            low += 1
        elif latest == 0 or (latest > 0 and compare_revisions(new.revision, latest) > 0):
            latest = new.revision
    if n == 0:
        latest = 0
    return SectionStats(n, total, latest, low)


def count_check_of(section: str, revision: int, st: SectionStats) -> Optional[CheckCount]:
    """model.count_check of a section whose records ``st`` sums, read at ``revision``."""
    if st.count < 1 or revision < 1 or st.low or st.latest < 1 or compare_revisions(st.latest, revision) > 0:
        return None
    return CheckCount(section, revision, st.count, st.total % REVISION_SUM_MODULUS)


class _State:
    """A view's records and how far they go, and how a list, an event and a
    commit of this process change them. Thread-safe (``lock``; ``cond`` is
    notified on every change)."""

    def __init__(self, slug: str, names: tuple[str, ...]) -> None:
        self.slug = slug
        self.names = names
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.secs: dict[str, dict[str, Record]] = {}
        self.shared: set[str] = set()  # sections handed out since they were last copied
        self.revision = 0  # every batch up to it is applied
        self.loaded = False
        self.floor: dict[str, int] = {}  # a section listed again at a later revision than self.revision
        self.tombs: dict[tuple[str, str], int] = {}  # records this process deleted ahead of their events
        self.generation = 0  # batches and lists applied
        self.lists_started = 0  # lists of every section begun
        self.listed = 0  # the latest of them taken (lists_started's number)
        self.error: Optional[BaseException] = None  # why the last list or stream failed; None once well again
        self.unsupported: Optional[Layout] = None
        self.closed = False
        # fenced.port's cache of values read: (section, key) -> (revision, text, marshal of json.loads(text)).
        self.cache: dict[tuple[str, str], tuple[int, str, bytes]] = {}
        # fenced.port's values as decoded, unchanged and held by nothing else: (section, key) -> (its cache
        # entry's marshal text, the value); taken out (dict.pop) by the attempt that hands it out.
        self.free: dict[tuple[str, str], tuple[bytes, Any]] = {}
        self.stats: dict[str, SectionStats] = {}  # each section's, as secs holds it
        self.sorted_keys: dict[str, tuple[Mapping[str, Record], list[str]]] = {}  # fenced.port's, by section dict
        self.on_change: Callable[[], None] = lambda: None  # the asyncio view's wake-up

    def covers(self, section: str) -> bool:
        return section != ARCHIVE if not self.names else section in self.names

    def _changed(self) -> None:
        self.generation += 1
        self.cond.notify_all()
        self.on_change()

    def _set(self, name: str, key: str, rec: Optional[Record]) -> None:
        """Set a record (None: delete it, when held), keeping the section's stats."""
        old = self.secs.get(name, _EMPTY).get(key)
        if rec is None:
            if old is None:
                return
            del self._section(name)[key]
        else:
            self._section(name)[key] = rec
        self.stats[name] = _restat(self.stats.get(name, _NO_STATS), old, rec)

    def _section(self, name: str) -> dict[str, Record]:
        """The section's dict, to be changed: a copy when it was handed out."""
        sec = self.secs.get(name)
        if sec is None:
            sec = self.secs[name] = {}
        elif name in self.shared:
            sec = self.secs[name] = dict(sec)
            self.shared.discard(name)
        return sec

    # Under the lock.

    def take(self) -> Taken:
        self.shared.update(self.secs)
        for name, st in self.stats.items():
            if st.latest < 0:
                self.stats[name] = _stats_of(self.secs.get(name, _EMPTY))
        return Taken(self.revision, dict(self.secs), self.names, self.generation, self.cache, self.free, dict(self.stats),
                     self.sorted_keys)

    def load(self, snap: Snapshot, names: frozenset[str], at: int = 0, seq: int = 0) -> None:
        """Take a list: every section of the view (names EVERY; ``seq``: its
        number, lists_started when it began), or those named; ``at``: the
        event that asked for it (its batch is in it)."""
        if not names:
            self.listed = max(self.listed, seq)
            self.secs = {n: dict(recs) for n, recs in snap.sections.items() if self.covers(n)}
            self.stats = {n: _stats_of(recs) for n, recs in self.secs.items()}
            self.sorted_keys.clear()  # of the sections replaced
            self.shared.clear()
            self.floor.clear()
            self.revision = snap.revision
            self.tombs = {r: v for r, v in self.tombs.items() if _later(v, snap.revision)}
            self.loaded = True
            live = {(n, k) for n, recs in self.secs.items() for k in recs}
            for r in [r for r in list(self.cache) if r not in live]:  # list(): port threads add to it meanwhile
                self.cache.pop(r, None)
            for r in [r for r in list(self.free) if r not in live]:
                self.free.pop(r, None)
        else:
            for n in names:
                self.secs[n] = dict(snap.sections.get(n, {}))
                self.stats[n] = _stats_of(self.secs[n])
                self.shared.discard(n)
                self.floor[n] = snap.revision
            if at and _later(at, self.revision):
                self.revision = at
        self.error = None
        self._changed()

    def apply(self, ev: Event) -> Optional[frozenset[str]]:
        """Apply one event; answers the sections to list again (EVERY: all)
        when the event cannot be applied (truncated, or keys not logged),
        and then applies nothing."""
        if ev.progress:
            if _later(ev.revision, self.revision):
                self.revision = ev.revision
                self._changed()
            return None
        if not _later(ev.revision, self.revision):
            return None  # in a list taken since
        if ev.truncated:
            if not ev.sections:
                return EVERY  # a writer that logs no keys (the in-house Lua): anything may have changed
            names = frozenset(s for s in ev.sections if self.covers(s))
            if names:
                return names
        if ev.claim is not None and ev.claim.kind in ("released", "lapsed"):
            self._drop_bound(ev.claim.name, ev.claim.epoch)
        for ch in ev.changes:
            s = ch.section
            if not self.covers(s):
                continue
            fl = self.floor.get(s)
            if fl is not None and not _later(ev.revision, fl):
                continue
            self._put(s, ch.key, ch.record if not ch.delete else None, ev.revision)
        self.revision = ev.revision
        if self.floor:
            self.floor = {n: r for n, r in self.floor.items() if _later(r, self.revision)}
        if self.tombs:
            self.tombs = {r: v for r, v in self.tombs.items() if _later(v, self.revision)}
        self._changed()
        return None

    def _put(self, s: str, k: str, rec: Optional[Record], at: int) -> None:
        """Set (s, k) to rec (None: absent) as of revision ``at``, unless
        the view already holds a later state of it."""
        cur = self.secs.get(s, _EMPTY).get(k)
        cur_rev = cur.revision if cur is not None else self.tombs.get((s, k), 0)
        if rec is None:
            if cur is not None and not _later(cur_rev, at):
                self._set(s, k, None)
        elif _later(rec.revision, cur_rev) or (cur is None and rec.revision == cur_rev):
            self._set(s, k, rec)
            self.tombs.pop((s, k), None)

    def _drop_bound(self, claim: str, epoch: int) -> None:
        """Records bound to a grant that ended are gone for every reader
        (docs/design/12-claims.md §12.4), whatever their events say."""
        for s, recs in list(self.secs.items()):
            gone = [k for k, r in recs.items() if r.claim == claim and r.claim_epoch == epoch]
            for k in gone:
                self._set(s, k, None)

    def committed(self, revision: int, writes: Sequence[Write], claim: str, claim_epoch: int) -> None:
        """A batch of this process committed at ``revision``: its puts and
        deletes, ahead of its event (which then changes nothing)."""
        touched = False
        for w in writes:
            if isinstance(w, Put) and self.covers(w.section):
                rec = Record(revision, w.value, claim if w.bind_to_claim else "", claim_epoch if w.bind_to_claim else 0)
                cur = self.secs.get(w.section, _EMPTY).get(w.key)
                if cur is None or not _later(cur.revision, revision):
                    self._set(w.section, w.key, rec)
                    self.tombs.pop((w.section, w.key), None)
                    touched = True
            elif isinstance(w, Delete) and self.covers(w.section):
                cur = self.secs.get(w.section, _EMPTY).get(w.key)
                if cur is None or not _later(cur.revision, revision):
                    if cur is not None:
                        self._set(w.section, w.key, None)
                    self.tombs[(w.section, w.key)] = revision
                    touched = True
        if touched:
            self._changed()

    def caught_up(self, want: int) -> bool:
        return self.loaded and not _later(want, self.revision)

    def memory_bytes(self) -> int:
        """What the view holds, in bytes (sys.getsizeof of its dicts, keys,
        records and texts, and of fenced.port's cache of values)."""
        size = sys.getsizeof
        n = size(self.secs)
        for recs in self.secs.values():
            n += size(recs)
            for k, r in recs.items():
                n += size(k) + size(r) + size(r.__dict__) + size(r.value) + size(r.claim)
        n += size(self.cache)
        for _, _, m in self.cache.values():
            n += size(m) + 64  # the tuple and its key
        n += size(self.free)
        for _, v in list(self.free.values()):
            n += _deep_size(v) + 64
        return n


def _deep_size(v: Any) -> int:
    """sys.getsizeof of a decoded JSON value and everything in it."""
    n, todo = 0, [v]
    while todo:
        o = todo.pop()
        n += sys.getsizeof(o)
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, list):
            todo.extend(o)
    return n


def _backoff() -> Iterable[float]:
    """The waits between lists or streams that failed: 50 ms doubling to 5 s, +-50 %."""
    wait = 0.05
    while True:
        yield wait * random.uniform(0.5, 1.5)
        wait = min(wait * 2, 5.0)


class _Reads:
    """What every view answers, from any thread, blocking: the reads, and
    what update and the port use. The following (the list, the stream) is
    its subclass's: View's thread, or fenced.aio's task."""

    _c: Any
    slug: str
    names: tuple[str, ...]
    _s: _State
    _born: float

    # Reads.

    @property
    def revision(self) -> int:
        """The revision the view has applied every batch up to (0: not listed yet)."""
        with self._s.lock:
            return self._s.revision

    def memory_bytes(self) -> int:
        """The memory the view holds, in bytes (an estimate by sys.getsizeof)."""
        with self._s.lock:
            return self._s.memory_bytes()

    def _timeout(self, timeout: Optional[float]) -> float:
        return time.monotonic() + (self._c._timeout if timeout is None else timeout)

    def _sync_until(self, end: float) -> int:
        """Wait until the view holds every batch up to the swarm's current
        revision, until ``end`` (monotonic); answers that revision. A view
        still behind after SYNC_GRACE_S that applied nothing meanwhile lists
        again: the counter moved by a writer that left no log entry at all."""
        self._wait(lambda: self._s.loaded, end, 0)
        want = self._current_revision(max(end - time.monotonic(), 0.001))
        with self._s.lock:
            gen = self._s.generation
        try:
            self._wait(lambda: self._s.caught_up(want), min(end, time.monotonic() + SYNC_GRACE_S), want)
            return want
        except ViewBehind:
            if time.monotonic() >= end:
                raise
        with self._s.lock:
            moved = self._s.generation != gen
        if not moved:
            _log.info("view %s: no batch up to revision %d reached it in %.2fs; listing again", self.slug, want, SYNC_GRACE_S)
            self._ask_relist()
        self._wait(lambda: self._s.caught_up(want), end, want)
        return want

    def take(self, *, fresh: bool = False, timeout: Optional[float] = None) -> Taken:
        """The view's sections at one point, for one read or one attempt of
        a change (``fresh``: as of now, after catching up with the swarm's
        current revision within ``timeout``; else as the view stands). Raises
        ViewBehind, ViewUnsupported, FencedError."""
        end = self._timeout(timeout)
        if fresh:
            self._sync_until(end)
        else:
            self._wait(lambda: self._s.loaded, end, 0)
        with self._s.lock:
            return self._s.take()

    def _snapshot_of(self, t: Taken, names: Sequence[str]) -> Snapshot:
        for n in names:
            if not t.covers(n):
                raise KeyError(f"view of {self.slug}: section {n!r} is not held "
                               f"(it holds {', '.join(self.names) or 'every section but archive'})")
        want = names or tuple(sorted(t.secs))
        return Snapshot(revision=t.revision, sections={n: t.section(n) for n in want}, section_revisions={})

    def _record_of(self, t: Taken, section: str, key: str) -> Optional[Record]:
        if not t.covers(section):
            raise KeyError(f"view of {self.slug}: section {section!r} is not held")
        return t.section(section).get(key)

    # What update and the port use (from their own thread).

    def _committed(self, revision: int, writes: Sequence[Write], claim: str = "", claim_epoch: int = 0) -> None:
        with self._s.lock:
            if self._s.loaded:
                self._s.committed(revision, writes, claim, claim_epoch)

    def _after_conflict(self, taken: Taken, timeout: float, conflict: Optional[errors.RevisionConflict] = None) -> None:
        """Before a rerun: catch up with the swarm. When that explains
        nothing (no batch applied since ``taken``, a record the conflict
        names held otherwise than Redis holds it: a record whose claim
        lapsed, a writer that bypassed the log; a section whose check
        conflicted unchanged since ``taken``), list again."""
        end = time.monotonic() + timeout
        self._sync_until(end)
        with self._s.lock:
            moved = self._s.generation != taken.generation
            asked = self._s.lists_started
            for c in conflict.conflicts if conflict is not None else ():
                if not self._s.covers(c.section):
                    continue
                if not c.key:
                    if self._s.secs.get(c.section) is taken.secs.get(c.section):
                        moved = False  # a section's check (CheckCount), the view's section unchanged since taken
                    continue
                rec = self._s.secs.get(c.section, _EMPTY).get(c.key)
                have = rec.revision if rec is not None else 0
                if have != c.actual and not _later(c.actual, self._s.revision):
                    moved = False  # the view holds it otherwise than Redis, though it applied every batch up to it
        if not moved:
            self._ask_relist()
            self._wait(lambda: self._s.listed > asked, end, 0)

    def _confirm(self, taken: Taken, timeout: float) -> bool:
        """Whether ``taken`` (the view as it stood) was the swarm as of now:
        the view catches up with the swarm's current revision and has
        applied nothing since. Asked of an attempt that sends no batch (its
        change raised, or changed nothing): nothing checks what it read.
        Raises ViewBehind, FencedError."""
        want = self._sync_until(time.monotonic() + timeout)
        with self._s.lock:
            return want == taken.revision and self._s.generation == taken.generation

    def _usable(self, timeout: float) -> bool:
        """Whether the view can serve reads (listed), waiting for its first list."""
        try:
            self._wait(lambda: self._s.loaded, time.monotonic() + timeout, 0)
        except errors.FencedError:
            return False
        return True

    def _wait(self, ok: Callable[[], bool], end: float, want: int) -> None:
        """Wait until ok() (under the lock) or ``end``: then raise why not."""
        with self._s.lock:
            while not ok():
                self._why_not(end, want)
                self._s.cond.wait(end - time.monotonic())

    def _why_not(self, end: float, want: int) -> None:
        """Raise why a wait must end (the lock held): the view's end, a
        lasting failure, or the deadline."""
        if self._s.unsupported is not None:
            raise ViewUnsupported(self.slug, self._s.unsupported)
        if self._s.closed:
            raise errors.FencedError(f"view of {self.slug}: closed", code=grpc.StatusCode.CANCELLED)
        err = self._s.error
        lasting = isinstance(err, errors.FencedError) and not isinstance(err, errors.Unavailable)
        if lasting and not self._s.loaded:
            raise err  # type: ignore[misc]  # e.g. PERMISSION_DENIED: waiting would not help
        if end - time.monotonic() <= 0:
            if lasting:
                raise err  # type: ignore[misc]
            why = f" (last failure: {err})" if err is not None else ""
            raise ViewBehind(self.slug, want, self._s.revision, why)

    # The subclass's.

    def _current_revision(self, timeout: float) -> int:
        raise NotImplementedError

    def _ask_relist(self) -> None:
        raise NotImplementedError


class View(_Reads):
    """A swarm's records (every section but archive, meta included; or the
    sections named), kept in this process by its Watch stream. Made by
    :meth:`fenced.Client.view`; see the module's doc. Thread-safe.

    Reads: :meth:`snapshot` and :meth:`record` (``fresh=True``: as of now,
    waiting for the view to catch up within ``timeout``; False: as the view
    stands, no call at all), :attr:`revision`, :meth:`sync`,
    :meth:`memory_bytes`. The view follows the swarm from a daemon thread
    until :meth:`close` (or the Client's close).
    """

    def __init__(self, client: "Client", slug: str, names: tuple[str, ...] = ()) -> None:
        self._c = client
        self.slug = slug
        self.names = names
        """The sections held; () for every section but archive (meta included)."""
        self._s = _State(slug, names)
        self._stream = _fork.Stream()
        self._relist_wanted = False
        self._born = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"fenced-view-{slug}", daemon=True)
        self._thread.start()

    def sync(self, timeout: Optional[float] = None) -> int:
        """Wait until the view has applied every batch up to the swarm's
        current revision (read with one Current call), at most ``timeout``
        seconds in all (None: the Client's timeout); answers that revision.
        Raises ViewBehind (not caught up in time: nothing stale is
        answered), ViewUnsupported, FencedError (the Current call's, or the
        view's own lasting failure)."""
        return self._sync_until(self._timeout(timeout))

    def snapshot(self, *names: str, fresh: bool = True, timeout: Optional[float] = None) -> Snapshot:
        """Sections from the view, as :meth:`fenced.Client.sections` answers
        them (no names: every section the view holds); ``section_revisions``
        is empty (a view keeps none). ``fresh`` as :meth:`take`. A section
        the view does not hold raises KeyError."""
        return self._snapshot_of(self.take(fresh=fresh, timeout=timeout), names)

    def record(self, section: str, key: str, *, fresh: bool = True, timeout: Optional[float] = None) -> Optional[Record]:
        """One record from the view (None when absent); as :meth:`snapshot`."""
        return self._record_of(self.take(fresh=fresh, timeout=timeout), section, key)

    def close(self) -> None:
        """Stop following the swarm and let the records go. Idempotent."""
        with self._s.lock:
            self._s.closed = True
            self._s.cond.notify_all()
        _gate.wake()
        self._drop_stream()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __repr__(self) -> str:
        return f"<fenced.View {self.slug!r} at {self.revision}>"

    def _current_revision(self, timeout: float) -> int:
        return int(self._c.current(self.slug, timeout=timeout).revision)

    def _ask_relist(self) -> None:
        self._relist_wanted = True
        self._drop_stream()

    # The thread.

    def _drop_stream(self) -> None:
        call, self._stream.call = self._stream.call, None
        if call is not None:
            call.cancel()

    def _stopping(self) -> bool:
        return self._s.closed or self._relist_wanted

    def _failed(self, e: BaseException) -> None:
        with self._s.lock:
            self._s.error = e
            self._s.cond.notify_all()

    def _run(self) -> None:
        waits = iter(_backoff())
        layout: Optional[Layout] = None
        while layout is None:
            try:
                layout = self._c.layout(self.slug)
            except errors.FencedError as e:
                self._failed(e)
                if _gate.sleep(next(waits), lambda: self._s.closed):
                    return
        if layout != Layout.RECORDS:
            with self._s.lock:
                self._s.unsupported = layout
                self._s.cond.notify_all()
            return
        waits = iter(_backoff())
        while not self._s.closed:
            try:
                self._list(EVERY, 0)
                self._follow()
                waits = iter(_backoff())
            except errors.RevisionCompacted as e:
                _log.info("view %s: %s; listing again", self.slug, e)
            except ValueError as e:  # grpcio: "Cannot invoke RPC on closed channel!"
                if "closed channel" not in str(e).lower() and "channel closed" not in str(e).lower():
                    raise
                _log.info("view %s: its channel is closed; the view ends", self.slug)
                with self._s.lock:
                    self._s.closed = True
                    self._s.cond.notify_all()
                return
            except Exception as e:  # noqa: BLE001 - kept for the readers; the view tries again
                if self._s.closed:
                    return
                self._failed(e)
                pause = next(waits)
                _log.warning("view %s: %s; listing again in %.2fs", self.slug, e, pause)
                if _gate.sleep(pause, lambda: self._s.closed):
                    return

    def _list(self, names: frozenset[str], at: int) -> None:
        """List the view's sections (names EVERY: all) and take the list."""
        seq = 0
        if not names:
            with self._s.lock:
                self._s.lists_started += 1
                seq = self._s.lists_started
            self._relist_wanted = False
        try:
            snap = self._c.sections(self.slug, *sorted(names or self.names))
        except errors.RevisionWentBackwards:
            # Redis lost batches: the Client said so once; read again from the earlier revision.
            snap = self._c.sections(self.slug, *sorted(names or self.names))
        with self._s.lock:
            self._s.load(snap, names, at, seq)

    def _follow(self) -> None:
        """Apply the swarm's events from the view's revision until the view
        closes or wants a new list."""
        start = self._s.revision
        from_now = start == 0
        for ev in self._c._watch_events(self.slug, start, self._stream, self._stopping):
            if from_now and ev.progress:
                from_now = False
                if ev.revision != 0:
                    self._list(EVERY, 0)  # batches came between the empty list and the stream
                continue
            with self._s.lock:
                need = self._s.apply(ev)
            if need is not None:
                self._list(need, ev.revision)
