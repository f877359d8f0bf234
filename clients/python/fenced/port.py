"""fenced.port: a drop-in for the in-house port and ``fencing.write``.

A tick or hive written against the in-house Python port (``layout``,
``sections``, ``record``, ``fenced_batch``) and ``fencing.write`` imports this
module in their place; every call goes through fenced (a :class:`fenced.Client`)
instead of Redis, on either layout (fenced serves document swarms on
standalone Redis, and a migration in the middle of a write is one more
conflict)::

    from fenced import port as fencing      # was: the in-house port and fencing

    def tick(doc):                          # may run several times: no side effects outside doc
        claims = doc["sections"]["claims"]  # key -> decoded JSON value
        done = [k for k, v in claims.items() if v.get("state") == "done"]   # a whole read
        for k in done:
            doc["sections"]["archive"][k] = claims.pop(k)   # archive: BLIND puts, never checked
        return done

    with fenced.Client(addr) as c, c.keep(slug, owner, ttl_ms=10_000) as keeper:
        fencing.configure(c)                # or only set FENCED_ADDR
        archived = fencing.write(slug, tick, keeper)   # tick's own result

What it keeps of the in-house rules (docs/clients.md, "fenced.port"):

- ``write`` hands ``change`` a document-shaped view (:class:`Document`:
  ``doc["revision"]``, ``doc["meta"]``, ``doc["sections"][name][key]``) of
  decoded JSON values, read on demand, that records what was read. Assigned,
  deleted and in-place mutated values become puts and deletes expecting the
  revision they were read at; every other record read is checked; a section
  read whole (iterated, ``len``, ``keys``/``items``/``values``, ``==``,
  ``copy``) is checked per record, every record it held when read: a writer
  that bypasses fenced and changes one of them is caught, an insert of another
  key is not a conflict.
- ``archive`` is written BLIND and never checked.
- The lease record is the fence's: fenced checks the fence (owner, epoch,
  expiry) at the write; the change reads ``doc["meta"]["lease"]`` unchecked and
  may not write it (nor ``epoch``, ``leader_changes``, ``layout``,
  ``section_revisions``: fenced owns them).
- A revision conflict reruns ``change`` after 1-32 ms (doubling from 1 ms,
  jittered), 16 attempts in all, then raises :class:`KeptChanging` ("the swarm
  fencing state kept changing; nothing was committed"); a stale lease raises
  :class:`StaleLease` ("the controller lease is stale") at once.

Not safe for concurrent use of one :class:`Document` by several threads; the
module functions and :class:`Port` are (a Client is).
"""

from __future__ import annotations

import json
import logging
import marshal
import math
import os
import random
import sys
import threading
import time
from collections.abc import ItemsView, ValuesView
from typing import Any, Callable, Iterator, Mapping, MutableMapping, NamedTuple, Optional, Sequence, TypeVar, Union

import grpc

from . import errors
from . import update as _update
from .client import Client
from .keeper import LeaseKeeper
from .model import BLIND, UNFENCED, Check, CheckRecords, Delete, Layout, Lease, LeaseFence, Put, Record, Unfenced, Write, count_check, dumps
from .revisions import later_revision
from .view import _NO_STATS, Taken, View, ViewUnsupported, count_check_of

__all__ = [
    "ARCHIVE",
    "Document",
    "DocumentSections",
    "FENCE_OWNED_META",
    "KEPT_CHANGING_TEXT",
    "KeptChanging",
    "MAX_WRITE_ATTEMPTS",
    "Port",
    "RecordValue",
    "RevisionConflict",
    "STALE_LEASE_TEXT",
    "Section",
    "SectionValues",
    "StaleLease",
    "client",
    "configure",
    "fenced_batch",
    "layout",
    "record",
    "sections",
    "write",
]

ARCHIVE = "archive"
"""The section ``write`` puts and deletes BLIND and never checks."""

META = "meta"

FENCE_OWNED_META = frozenset({"lease", "epoch", "leader_changes", "layout", "section_revisions"})
"""The meta records only fenced writes (docs/design/02-redis-layout.md §2.3): a
change reads them unchecked (the fence carries the lease) and may not write them."""

MAX_WRITE_ATTEMPTS = 16
"""How many times ``write`` runs a change that keeps meeting revision conflicts
(the first run included) before it raises :class:`KeptChanging`."""

MAX_LOST_REPLY_RESENDS = _update.MAX_LOST_REPLY_RETRIES
"""How many times ``write`` resends a batch whose outcome it cannot know
(UNAVAILABLE but REPLICATION_TIMEOUT, DEADLINE_EXCEEDED, CANCELLED unless the
Client was closed) under the same request id: update's (3)."""

# The in-house fencing.write's schedule: before attempt k (k >= 2) it sleeps
# between half of min(1 ms * 2^(k-2), 32 ms) and all of it, never below 1 ms:
# 1, 1-2, 2-4, 4-8, 8-16, then 16-32 ms.
_WAIT_FIRST_S, _WAIT_MAX_S = 0.001, 0.032

_log = logging.getLogger("fenced.port")

STALE_LEASE_TEXT = "the controller lease is stale"
KEPT_CHANGING_TEXT = errors.KeptChanging.MESSAGE  # "the swarm fencing state kept changing; nothing was committed"

T = TypeVar("T")
_Ref = tuple[str, str]  # (section, key)


# Errors.


class StaleLease(errors.StaleLease):
    """The lease the write was fenced with is gone (expired, taken over,
    released): stop writing. ``str()`` is the in-house text, "the controller
    lease is stale"; ``message``, ``code``, ``reason``, ``metadata`` and
    ``holder`` are fenced's. A :class:`fenced.StaleLease`, so code catching
    either catches it; every function of this module raises this class."""

    def __init__(
        self,
        message: str = STALE_LEASE_TEXT,
        *,
        code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION,
        reason: str = "LEASE_STALE",
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message, code=code, reason=reason, metadata=metadata)

    def __str__(self) -> str:
        return STALE_LEASE_TEXT


class RevisionConflict(errors.RevisionConflict):
    """Records changed since they were read; nothing was committed. ``str()``
    is the in-house text, "the swarm fencing state kept changing; nothing was
    committed"; ``conflicts`` and ``total`` are fenced's. A
    :class:`fenced.RevisionConflict`, so code catching either catches it."""

    def __init__(
        self,
        message: str = KEPT_CHANGING_TEXT,
        *,
        code: grpc.StatusCode = grpc.StatusCode.ABORTED,
        reason: str = "REVISION_CONFLICT",
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message, code=code, reason=reason, metadata=metadata)

    def __str__(self) -> str:
        return KEPT_CHANGING_TEXT


class KeptChanging(RevisionConflict, errors.KeptChanging):
    """``write`` met a revision conflict on all :data:`MAX_WRITE_ATTEMPTS`
    attempts; nothing was committed. A :class:`RevisionConflict` (this
    module's and fenced's) and a :class:`fenced.KeptChanging`: ``attempts``,
    ``last`` (also ``__cause__``), the last ``conflicts``."""

    def __init__(self, slug: str = "", attempts: int = 0, last: Optional[errors.RevisionConflict] = None) -> None:
        errors.FencedError.__init__(
            self,
            f"write {slug} after {attempts} attempts: {KEPT_CHANGING_TEXT}",
            code=last.code if last is not None else grpc.StatusCode.ABORTED,
            reason=last.reason if last is not None else "REVISION_CONFLICT",
            metadata=last.metadata if last is not None else None,
        )
        self.attempts = attempts
        self.last = last  # type: ignore[assignment]
        self.conflicts = last.conflicts if last is not None else ()
        self.total = last.total if last is not None else 0


def _port_error(e: errors.FencedError) -> errors.FencedError:
    """fenced's StaleLease and RevisionConflict as this module's (the
    in-house texts); any other error as it is."""
    if isinstance(e, (StaleLease, RevisionConflict)):
        return e
    if isinstance(e, errors.StaleLease):
        stale = StaleLease(e.message, code=e.code, reason=e.reason, metadata=e.metadata)
        stale.holder = e.holder
        return stale
    if isinstance(e, errors.RevisionConflict):
        conflict = RevisionConflict(e.message, code=e.code, reason=e.reason, metadata=e.metadata)
        conflict.conflicts, conflict.total = e.conflicts, e.total
        return conflict
    return e


# Reads.


class RecordValue(NamedTuple):
    """One record as :func:`record` answers it: its revision and its decoded
    JSON value (``rev, value = port.record(...)``)."""

    revision: int
    value: Any


class SectionValues(dict):  # type: ignore[type-arg]
    """What :func:`sections` answers: section name -> {key: decoded JSON value},
    read at one instant.

    Attributes:
        revision: the swarm revision of the read (0: nothing ever committed).
        revisions: section name -> {key: the record's revision}, for the
            expectations of a :func:`fenced_batch`.
    """

    revision: int = 0
    revisions: dict[str, dict[str, int]]


def _loads(section: str, key: str, raw: str) -> Any:
    """A stored value decoded as the in-house port did (json.loads, which also
    reads the NaN and Infinity Python's json.dumps writes). Raises ValueError
    naming the record for a value json.loads cannot read."""
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ValueError(f"fenced.port: record {section}/{key} is not JSON: {e}") from e


def _canon(obj: Any) -> str:
    """A value's text for telling whether a change changed it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


# The checks of a write.


def _record_checks(section: str, expected: Mapping[str, int]) -> list[Write]:
    """The writes that check every (key, revision) of ``expected`` in one
    section (revision 0: must be absent): the in-house rule for a section
    read whole, and for every record read.

    One WRITE_KIND_CHECK_RECORDS write carries them all (docs/design/03-fenced-batch.md
    §3.2): it counts as one of the server's --max-writes, so a whole read of a
    section bigger than that (the fixture's executions has 1,352 records)
    still fits one batch; its pairs are bounded by --max-checks."""
    if not expected:
        return []
    return [CheckRecords(section, dict(sorted(expected.items())))]


# What a value decoded as read is kept as, to tell whether a change mutated
# it in place: marshal's encoding of json.loads's result (marshal is several
# times faster than json both ways, and tells 1, 1.0 and True apart as JSON
# text does). Equal encodings are equal values; a value whose encoding
# differs (mutated; or holding an object also referenced elsewhere, which
# marshal marks as such; or an object marshal does not encode) is compared
# by its JSON text.
#
# A value handed out and found unchanged goes back to its view's pool
# (Taken.free) when nothing but the attempt's entry holds it or anything in
# it, so the next attempt hands out the same object rather than decoding a
# copy. Nothing else holding it is sound to tell on CPython: the entry's
# reference is the object's only one (sys.getrefcount, against _SOLE), and
# the encoding is the one taken when every list and dict in it was fresh
# from json.loads or marshal.loads (each held by its parent alone), while
# marshal marks a list or dict held by more than one reference (version >= 3:
# Py_REFCNT(v) > 1): any other holder makes the encodings differ. A pooled
# value can then be reached, and so changed, by nobody until an attempt takes
# it out (dict.pop, atomic under the GIL); a value the change returned, kept
# or reached into stays the caller's and the next attempt decodes its own.
_MARSHAL_VERSION = marshal.version
_Cache = dict[_Ref, tuple[int, str, bytes]]
_Free = dict[_Ref, tuple[bytes, Any]]


class _Entry:
    """One record as an attempt read it: its revision (0: absent), its stored
    text (None: absent) and, once handed to the change, its decoded value and
    that value's marshal encoding as read."""

    __slots__ = ("revision", "raw", "obj", "m")

    def __init__(self, revision: int, raw: Optional[str]) -> None:
        self.revision = revision
        self.raw = raw
        self.obj: Any = _UNSET
        self.m = b""

    def value(self, ref: _Ref, cache: Optional[_Cache], free: Optional[_Free]) -> Any:
        """The value, decoded once per attempt: the view's pooled object when
        it holds one of the record as cached, else from the view's cache of
        its encoding (marshal.loads) when the record is the one cached, else
        by json.loads (and then cached)."""
        obj = self.obj
        if obj is not _UNSET:
            return obj
        assert self.raw is not None
        c = cache.get(ref) if cache is not None else None
        if c is not None and c[0] == self.revision and (c[1] is self.raw or c[1] == self.raw):
            m = self.m = c[2]
            f = free.pop(ref, None) if free is not None else None
            obj = f[1] if f is not None and f[0] is m else marshal.loads(m)
        else:
            obj = _loads(ref[0], ref[1], self.raw)
            self.m = marshal.dumps(obj, _MARSHAL_VERSION)  # json.loads answers only what marshal encodes
            if cache is not None:
                cache[ref] = (self.revision, self.raw, self.m)
            if free is not None:
                free.pop(ref, None)  # an earlier revision's
        self.obj = obj
        return obj

    def unchanged(self, v: Any) -> bool:
        """Whether v is the value as read: the same JSON text."""
        try:
            if marshal.dumps(v, _MARSHAL_VERSION) == self.m:
                return True
        except ValueError:
            pass  # an object marshal does not encode: compare JSON texts
        return _canon(v) == _canon(marshal.loads(self.m))

    def settle(self, ref: _Ref, free: Optional[_Free]) -> bool:
        """Whether the value handed out is still the value as read (the
        same JSON text); when its encoding is the one taken as read and the
        entry alone holds it, it goes back to the view's pool ``free``."""
        try:
            same = marshal.dumps(self.obj, _MARSHAL_VERSION) == self.m
        except ValueError:
            same = False  # an object marshal does not encode: compare JSON texts
        if not same:
            return _canon(self.obj) == _canon(marshal.loads(self.m))
        if free is not None and _POOL and sys.getrefcount(self.obj) == _SOLE:  # as _held counts
            free[ref] = (self.m, self.obj)
        return True


def _held(e: _Entry) -> int:
    """How many references hold e's value (sys.getrefcount's count, its own included)."""
    return sys.getrefcount(e.obj)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()
_DELETED: Any = _Unset()


def _sole() -> int:
    e = _Entry(0, None)
    e.obj = {}  # held by the entry alone
    return _held(e)


_SOLE = _sole()
"""_held's answer for a value its entry alone holds."""

_POOL = sys.implementation.name == "cpython" and bool(getattr(sys, "_is_gil_enabled", lambda: True)())
"""Whether values go back to the pool: CPython with its GIL (_Entry's note)."""


class Document(Mapping[str, Any]):
    """The document-shaped view ``write`` hands a change, for one attempt:
    ``doc["revision"]`` (the highest swarm revision read so far; a read of the
    lease's revision when nothing was read yet), ``doc["meta"]`` (a
    :class:`Section` of the meta records) and ``doc["sections"]`` (a
    :class:`DocumentSections`: name -> :class:`Section`). Also as attributes
    (``doc.meta``, ``doc.sections``, ``doc.revision``). Records are read on
    demand and what was read is recorded; the view is valid only inside the
    change."""

    def __init__(self, client: Client, slug: str, taken: Optional[Taken] = None) -> None:
        self._c = client
        self.slug = slug
        # The view's sections at the attempt's start, when it reads from a
        # view (fenced.View): no call for what it holds.
        self._taken = taken
        self._cache: Optional[_Cache] = taken.cache if taken is not None else None
        self._free: Optional[_Free] = taken.free if taken is not None else None
        # Every record read, by section then key, first read wins: by key
        # (_lookup; also in _own) or in a whole read of the section's snapshot.
        self._entries: dict[str, dict[str, _Entry]] = {}
        # The keys of each section read by key (get, in, put, del...): the
        # entries that may be absent, or (read from fenced before the section
        # was) stand otherwise than in the section's snapshot.
        self._own: dict[str, set[str]] = {}
        self._loaded: dict[str, Mapping[str, Record]] = {}  # sections read at one instant (never changed)
        self._snap_revs: dict[str, int] = {}  # the swarm revision each was read at (a view's: all it applied)
        self._whole: set[str] = set()  # sections the change read whole
        self._changed: dict[_Ref, Any] = {}  # assigned values and _DELETED, in first-write order
        self._keycache: dict[str, list[str]] = {}  # a section's keys as the change sees them
        self._seen = taken.revision if taken is not None else 0
        self._open = True
        self.meta = Section(self, META)
        self.sections = DocumentSections(self)

    # The mapping of the document's top level.

    def __getitem__(self, name: str) -> Any:
        if name == "revision":
            return self.revision
        if name == "meta":
            return self.meta
        if name == "sections":
            return self.sections
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(("revision", "meta", "sections"))

    def __len__(self) -> int:
        return 3

    @property
    def revision(self) -> int:
        """The highest swarm revision this attempt read at."""
        self._live()
        if self._seen == 0:
            self._see(self._c.current(self.slug).revision)
        return self._seen

    def __repr__(self) -> str:
        return f"<fenced.port.Document {self.slug!r}>"

    # Reads.

    def _close(self) -> None:
        """End the view: what it read goes at once (the document and its
        sections refer to each other, which only the garbage collector
        would otherwise undo, values and all)."""
        self._open = False
        self._entries, self._own, self._loaded, self._changed, self._keycache = {}, {}, {}, {}, {}
        self._taken = self._cache = self._free = None

    def _live(self) -> None:
        if not self._open:
            raise RuntimeError("fenced.port: the document view is valid only inside the change that got it")

    def _see(self, rev: int) -> None:
        self._seen = later_revision(self._seen, rev)

    def _load(self, name: str) -> Mapping[str, Record]:
        """The section's records at one instant (from the view, or one
        Sections read, once)."""
        self._live()
        if name not in self._loaded:
            t = self._taken
            if t is not None and t.covers(name):
                self._loaded[name] = t.section(name)
                self._snap_revs[name] = t.revision
                return self._loaded[name]
            snap = self._c.sections(self.slug, name)
            self._see(snap.revision)
            self._loaded[name] = dict(snap.sections.get(name, {}))
            self._snap_revs[name] = snap.revision
        return self._loaded[name]

    def _prefetch(self) -> list[str]:
        """Every section but archive and meta, at one instant: the names of
        those holding records. Nothing is marked read."""
        self._live()
        t = self._taken
        if t is not None and not t.names:
            names = []
            for name, recs in t.secs.items():
                if name in (META, ARCHIVE):
                    continue
                if name not in self._loaded:
                    self._loaded[name] = recs
                    self._snap_revs[name] = t.revision
                if recs:
                    names.append(name)
            return sorted(names)
        snap = self._c.sections(self.slug)
        self._see(snap.revision)
        names = []
        for name, recs in snap.sections.items():
            if name in (META, ARCHIVE):
                continue
            if name not in self._loaded:
                self._loaded[name] = dict(recs)
                self._snap_revs[name] = snap.revision
            if recs:
                names.append(name)
        return sorted(names)

    def _lookup(self, ref: _Ref) -> _Entry:
        self._live()
        section, key = ref
        ents = self._entries.get(section)
        if ents is None:
            ents = self._entries[section] = {}
        else:
            e = ents.get(key)
            if e is not None:
                return e
        sec = self._loaded.get(section)
        if sec is None and self._taken is not None and self._taken.covers(section):
            sec = self._taken.section(section)
        if sec is not None:
            rec = sec.get(key)
        else:
            rec, rev = self._c.record_at(self.slug, section, key)
            self._see(rev)
        e = _Entry(rec.revision, rec.value) if rec is not None else _Entry(0, None)
        ents[key] = e
        own = self._own.get(section)
        if own is None:
            self._own[section] = {key}
        else:
            own.add(key)
        return e

    def _get(self, ref: _Ref) -> Any:
        if ref in self._changed:
            self._live()
            v = self._changed[ref]
            if v is _DELETED:
                raise KeyError(ref[1])
            return v
        e = self._lookup(ref)
        if e.raw is None:
            raise KeyError(ref[1])
        return e.value(ref, self._cache, self._free)

    def _pairs(self, name: str) -> Iterator[tuple[str, Any]]:
        """The section's (key, value) pairs as the change sees them, in key
        order; reads it whole. What iterating keys and then looking each up
        answers, without a lookup per key."""
        keys = self._keys(name)
        loaded = self._loaded[name]
        ents = self._entries.get(name)
        if ents is None:
            ents = self._entries[name] = {}
        changed, cache, free = self._changed, self._cache, self._free
        for key in keys:
            if not self._open:
                self._live()
            ref = (name, key)
            if ref in changed:
                v = changed[ref]
                if v is _DELETED:
                    raise KeyError(key)
                yield key, v
                continue
            e = ents.get(key)
            if e is None:
                rec = loaded[key]  # neither written nor read by key: in the snapshot
                e = ents[key] = _Entry(rec.revision, rec.value)
            elif e.raw is None:
                raise KeyError(key)
            yield key, e.value(ref, cache, free)

    def _keys(self, name: str) -> list[str]:
        """The section's keys as the change sees it (computed once, again
        after the change writes it); marks it read whole."""
        keys = self._keycache.get(name)
        if keys is not None:
            self._live()
            return keys
        loaded = self._load(name)
        self._whole.add(name)
        own = self._own.get(name)
        mine = [k for (s, k) in self._changed if s == name] if self._changed else []
        if not own and not mine:
            t = self._taken
            c = t.sorted_keys.get(name) if t is not None else None
            if c is not None and c[0] is loaded:
                keys = c[1]  # the view's, for this very section dict (never changed; nor is the list)
            else:
                keys = sorted(loaded)
                if t is not None and loaded is t.section(name):
                    t.sorted_keys[name] = (loaded, keys)
            self._keycache[name] = keys
            return keys
        keyset = set(loaded)
        if own:
            ents = self._entries[name]
            for k in own:  # a key read before the whole read: what the change saw
                present = ents[k].raw is not None
                if (k in loaded) != present:
                    (keyset.add if present else keyset.discard)(k)
        for k in mine:
            (keyset.discard if self._changed[(name, k)] is _DELETED else keyset.add)(k)
        keys = self._keycache[name] = sorted(keyset)
        return keys

    # Writes.

    def _owned(self, ref: _Ref) -> None:
        if ref[0] == META and ref[1] in FENCE_OWNED_META:
            raise ValueError(
                f"fenced.port: the change wrote meta/{ref[1]}: fenced owns it (the lease record is the fence's: "
                "fenced checks the fence's owner, epoch and expiry at the write); leave it out"
            )

    def _set(self, ref: _Ref, value: Any) -> None:
        self._live()
        if not isinstance(ref[1], str):
            raise TypeError(f"fenced.port: section {ref[0]}: a key is a str, not {type(ref[1]).__name__}")
        self._owned(ref)
        if ref[0] != ARCHIVE:
            self._lookup(ref)  # the revision a put expects
        self._changed[ref] = value
        self._keycache.pop(ref[0], None)

    def _delete(self, ref: _Ref) -> None:
        self._get(ref)  # KeyError when absent
        self._owned(ref)
        self._changed[ref] = _DELETED
        self._keycache.pop(ref[0], None)

    def _entry(self, ref: _Ref) -> Optional[_Entry]:
        ents = self._entries.get(ref[0])
        return ents.get(ref[1]) if ents is not None else None

    def _batch(self) -> Optional[list[Write]]:
        """The attempt as one batch: puts and deletes of what changed
        (assigned, deleted, or mutated in place) expecting the revisions read
        (archive: BLIND), then the checks of every other record read and of
        every record a section read whole held (none of archive, none of the
        meta records fenced owns). None when nothing changed. Values handed
        out and left as read go back to the view's pool (_Entry.settle)."""
        writes: list[Write] = []
        written: set[_Ref] = set()
        changed, free = self._changed, self._free
        for ref, v in changed.items():
            section, key = ref
            e = self._entry(ref)  # None only for an archive put that read nothing
            blind = section == ARCHIVE
            if v is _DELETED:
                if e is not None and e.raw is None:
                    continue  # deleting what is absent: checked below as read
                writes.append(Delete(section, key, BLIND if blind or e is None else e.revision))
            else:
                if e is not None and e.raw is not None:
                    e.value(ref, self._cache, None)  # the value as read (not the pool's: v may be it)
                    if e.unchanged(v):
                        continue  # what was there: checked below as read
                self._owned(ref)
                # NaN and Infinity written as the in-house json.dumps wrote them.
                writes.append(Put(section, key, BLIND if blind or e is None else e.revision, dumps(v, allow_nan=True)))
            written.add(ref)
        for section, ents in self._entries.items():  # read, maybe mutated in place
            for key, e in ents.items():
                if e.obj is _UNSET:
                    continue
                ref = (section, key)
                if ref in changed or e.settle(ref, free):
                    continue
                self._owned(ref)
                writes.append(Put(section, key, BLIND if section == ARCHIVE else e.revision, dumps(e.obj, allow_nan=True)))
                written.add(ref)
        if not writes:
            return None
        for name in sorted(set(self._entries) | self._whole):
            if name == ARCHIVE:
                continue  # never checked
            if name in self._whole:
                counted = self._count_checks(name, written)
                if counted is not None:
                    writes.extend(counted)
                    continue
                expected = {k: rec.revision for k, rec in self._loaded[name].items()}
            else:
                expected = {}
            ents = self._entries.get(name, {})
            for k in self._own.get(name, ()):
                expected[k] = ents[k].revision  # what the change saw wins
            keys = {
                k: rev for k, rev in expected.items()
                if (name, k) not in written and not (name == META and k in FENCE_OWNED_META)
            }
            if keys:
                writes.extend(_record_checks(name, keys))
        return writes

    def _count_checks(self, name: str, written: set[_Ref]) -> Optional[list[Write]]:
        """The checks of section ``name`` read whole as one CheckCount of its
        snapshot (count_check), and a Check of each key the change read as
        absent; None when that is not the records check's rule: meta (whose
        fenced-owned records are not checked), a record stored after the
        snapshot's revision, a section read empty, or a key the change saw
        otherwise than the snapshot holds it (read on its own before)."""
        if name == META:
            return None
        snap = self._loaded[name]
        absent: list[Write] = []
        ents = self._entries.get(name, {})
        for k in self._own.get(name, ()):
            e = ents[k]
            rec = snap.get(k)
            if (rec.revision if rec is not None else 0) != e.revision:
                return None
            if rec is None and (name, k) not in written:
                absent.append(Check(name, k, 0))
        t = self._taken
        if t is not None and snap is t.section(name):
            cc = count_check_of(name, self._snap_revs[name], t.stats.get(name, _NO_STATS))  # the view's sums: O(1)
        else:
            cc = count_check(name, self._snap_revs[name], snap)
        if cc is None:
            return None
        absent.sort(key=lambda w: w.key)  # type: ignore[attr-defined]
        if len(written) >= len(snap) and all((name, k) in written for k in snap):
            return absent  # each record is checked by its own write
        return [cc, *absent]


class Section(MutableMapping[str, Any]):
    """One section of a :class:`Document`: key -> decoded JSON value, with the
    change's own writes applied. ``s[key]``, ``get``, ``in``, ``setdefault``,
    ``pop`` read one key (checked at the write); ``s[key] = value`` puts,
    ``del s[key]`` deletes; iterating, ``len``, ``keys``/``items``/``values``,
    ``==``, ``copy`` and ``clear`` read it whole (every record it held checked
    at the write). A value mutated in place (``s[key]["state"] = "done"``) is
    put too. Iteration is in key order."""

    def __init__(self, doc: Document, name: str) -> None:
        self._doc = doc
        self.name = name

    def __getitem__(self, key: str) -> Any:
        return self._doc._get((self.name, key))

    def __setitem__(self, key: str, value: Any) -> None:
        self._doc._set((self.name, key), value)

    def __delitem__(self, key: str) -> None:
        self._doc._delete((self.name, key))

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc._keys(self.name))

    def __len__(self) -> int:
        return len(self._doc._keys(self.name))

    def items(self) -> "_Items":  # type: ignore[override]
        """The (key, value) pairs, in key order (reads it whole)."""
        return _Items(self)

    def values(self) -> "_Values":  # type: ignore[override]
        """The values, in key order (reads it whole)."""
        return _Values(self)

    def copy(self) -> dict[str, Any]:
        """The section as a dict (reads it whole; the values are the view's own)."""
        return dict(self.items())

    def clear(self) -> None:
        """Delete every record (reads it whole)."""
        for key in self._doc._keys(self.name):
            del self[key]

    def __repr__(self) -> str:
        return f"<fenced.port.Section {self.name!r}>"


class _Items(ItemsView):  # type: ignore[type-arg]
    """A Section's items: iterated in one pass over the section (Document._pairs)."""

    _mapping: Section

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._mapping._doc._pairs(self._mapping.name)


class _Values(ValuesView):  # type: ignore[type-arg]
    """A Section's values: iterated in one pass over the section (Document._pairs)."""

    _mapping: Section

    def __iter__(self) -> Iterator[Any]:
        for _, v in self._mapping._doc._pairs(self._mapping.name):
            yield v


class DocumentSections(MutableMapping[str, Section]):
    """``doc["sections"]``: section name -> :class:`Section`. Any name answers a
    view (a section without records reads empty, so ``setdefault`` and
    ``get`` answer it too); ``in`` is whether it holds records (a whole read);
    iterating lists the sections holding records but archive (one read of them
    all, marking none read); assigning a mapping replaces the section's records
    (a whole read), ``del`` deletes them. The meta records are ``doc["meta"]``."""

    def __init__(self, doc: Document) -> None:
        self._doc = doc
        self._views: dict[str, Section] = {}

    def __getitem__(self, name: str) -> Section:
        if name == META:
            raise KeyError("meta: the meta records are doc['meta'], not a section")
        if name not in self._views:
            self._views[name] = Section(self._doc, name)
        return self._views[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name != META and len(self[name]) > 0

    def __setitem__(self, name: str, records: Mapping[str, Any]) -> None:
        view = self[name]
        items = dict(records)  # before clearing: records may be the view itself
        view.clear()
        view.update(items)

    def __delitem__(self, name: str) -> None:
        self[name].clear()

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc._prefetch())

    def __len__(self) -> int:
        return len(self._doc._prefetch())

    def setdefault(self, name: str, default: Optional[Mapping[str, Any]] = None) -> Section:  # type: ignore[override]
        """The section's view; ``default``'s records are put into it when it is empty."""
        view = self[name]
        if default and len(view) == 0:
            view.update(default)
        return view

    def __repr__(self) -> str:
        return f"<fenced.port.DocumentSections of {self._doc.slug!r}>"


# The fence.

FenceLike = Union[LeaseFence, Lease, LeaseKeeper, Mapping[str, Any], tuple, None]  # type: ignore[type-arg]
"""What ``write`` and ``fenced_batch`` take as ``fence``: a fenced.LeaseFence, a
fenced.Lease or LeaseKeeper (its fence()), a mapping with ``owner`` and
``epoch`` (the in-house lease record's shape), an ``(owner, epoch)`` tuple, or
None (unfenced)."""


def _fence(f: FenceLike) -> Union[LeaseFence, Unfenced]:
    """A port's fence as the client's: None is UNFENCED (the in-house
    port's unfenced write, kept; fenced's own calls make it explicit)."""
    if f is None:
        return UNFENCED
    if isinstance(f, LeaseFence):
        return f
    if isinstance(f, (Lease, LeaseKeeper)):
        return f.fence()
    if isinstance(f, Mapping):
        return LeaseFence(str(f.get("owner", "")), int(f["epoch"]), int(f.get("now_ms", 0)))
    if isinstance(f, tuple) and len(f) in (2, 3):
        return LeaseFence(str(f[0]), int(f[1]), int(f[2]) if len(f) == 3 else 0)
    raise TypeError(f"fenced.port: not a fence: {f!r} (a fenced.LeaseFence, Lease, LeaseKeeper, "
                    "{'owner', 'epoch'} mapping, (owner, epoch) or None)")


# The port.


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class Port:
    """The port's calls over one :class:`fenced.Client` (the module functions
    use the one :func:`configure` set, or one made from ``FENCED_ADDR``).

    ``write`` reads from the Client's view of the swarm (:meth:`fenced.Client.view`:
    every section but archive, kept by the swarm's Watch stream) unless
    ``views`` is False, or the swarm cannot have one (the document layout,
    no state yet): then every attempt reads what its change touches from
    fenced, as the in-house port read Redis."""

    def __init__(self, client: Client, *, views: bool = True) -> None:
        self.client = client
        self.views = views

    def _view(self, slug: str) -> Optional[View]:
        """The swarm's view, listed; None without one."""
        if not self.views or self.client._closed:
            return None
        v = self.client.view(slug)
        return v if v._usable(self.client._timeout) else None

    def layout(self, slug: str) -> str:
        """How the swarm is stored, as the in-house port answers it:
        "records", "document", or "" (no state yet). Raises FencedError."""
        return {Layout.RECORDS: "records", Layout.DOCUMENT: "document"}.get(self.client.layout(slug), "")

    def sections(self, slug: str, *names: str) -> SectionValues:
        """Whole sections at one instant, as {name: {key: decoded value}}
        (:class:`SectionValues`, with ``revision`` and per-record
        ``revisions``); no names: every section but archive and meta (the
        document's "sections"). A named section without records answers {}.
        Raises ResourceExhausted (over the server's snapshot limits),
        InvalidArgument (an unknown section), FencedError."""
        snap = self.client.sections(slug, *names)
        out = SectionValues()
        out.revision = snap.revision
        out.revisions = {}
        for name in names or sorted(n for n in snap.sections if n != META):
            recs = snap.sections.get(name, {})
            out[name] = {k: _loads(name, k, r.value) for k, r in sorted(recs.items())}
            out.revisions[name] = {k: r.revision for k, r in recs.items()}
        return out

    def record(self, slug: str, section: str, key: str) -> Optional[RecordValue]:
        """One record as (revision, decoded value), or None when absent. Raises FencedError."""
        rec = self.client.record(slug, section, key)
        return None if rec is None else RecordValue(rec.revision, _loads(section, key, rec.value))

    def fenced_batch(
        self, slug: str, writes: Sequence[Write], fence: FenceLike = None, *, request_id: Optional[str] = None
    ) -> int:
        """Commit ``writes`` (fenced.Put, Delete, Check, CheckSection; values
        are JSON text: fenced.dumps) all or none under ``fence``; answers the
        revision. Not resent: give a ``request_id`` to resend safely yourself.
        Raises StaleLease, RevisionConflict (this module's), InvalidArgument,
        Unavailable, FencedError."""
        try:
            return self.client.fenced_batch(slug, writes, fence=_fence(fence), request_id=request_id).revision
        except errors.FencedError as e:
            raise _port_error(e) from e

    def write(self, slug: str, change: Callable[[Document], T], fence: FenceLike = None) -> T:
        """Run ``change`` on a :class:`Document` view and commit what it
        changed as one fenced batch under ``fence``; answers what ``change``
        returned. A change that changes nothing sends nothing.

        On a revision conflict it sleeps 1-32 ms (doubling from 1 ms,
        jittered) and reruns ``change`` on a fresh view, up to
        :data:`MAX_WRITE_ATTEMPTS` (16) attempts in all, then raises
        :class:`KeptChanging`. ``change`` may run several times: no side
        effects outside the view. On StaleLease (this module's), any other
        error, or an exception of ``change`` itself, it stops at once and
        raises it. A batch whose outcome is unknown is resent under the same
        request id as :func:`fenced.update.commit` resends it (UNAVAILABLE but
        REPLICATION_TIMEOUT, DEADLINE_EXCEEDED, CANCELLED unless the Client
        was closed; up to 3 times), so it is applied at most once.

        Raises: StaleLease, KeptChanging, ValueError (the change wrote a meta
        record fenced owns; nothing sent), InvalidArgument (e.g. more writes
        than the server's --max-writes), FencedError."""
        last: Optional[errors.RevisionConflict] = None
        ceiling = _WAIT_FIRST_S
        view = self._view(slug)
        taken: Optional[Taken] = None
        caught_up = False  # the view caught up for this attempt (confirmed, below)
        for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
            if attempt > 1 and not caught_up:
                _sleep(random.uniform(max(_WAIT_FIRST_S, ceiling / 2), ceiling))
                ceiling = min(ceiling * 2, _WAIT_MAX_S)
                if view is not None and taken is not None:
                    # The rerun reads what the swarm holds now: the view
                    # catches up first (and lists again when that explains
                    # nothing); failing that, this write reads from fenced.
                    try:
                        view._after_conflict(taken, self.client._timeout, last)
                    except errors.FencedError as e:
                        _log.warning("write %s: its view could not catch up (%s); reading from fenced", slug, e)
                        view = None
            taken = view.take() if view is not None else None
            doc = Document(self.client, slug, taken)

            def confirmed() -> bool:
                # An attempt that sends nothing (change raised, or changed
                # nothing) is not checked: the first, which read the view as
                # it stood, must have read the swarm as of now; else change
                # runs again on the view caught up.
                nonlocal view, caught_up
                if attempt > 1 or view is None or taken is None:
                    return True
                try:
                    caught_up = not view._confirm(taken, self.client._timeout)
                except errors.FencedError as e:
                    _log.warning("write %s: its view could not catch up (%s); reading from fenced", slug, e)
                    view, caught_up = None, True
                return not caught_up
            try:
                result = change(doc)
                writes = doc._batch()
            except Exception:
                if not confirmed():
                    continue
                raise
            finally:
                doc._close()
            if writes is None:
                if not confirmed():
                    continue
                return result
            caught_up = False
            try:
                self._commit(slug, writes, _fence(fence))
                return result
            except errors.RevisionConflict as e:
                last = e
            except errors.FencedError as e:
                raise _port_error(e) from e
        assert last is not None
        conflict = _port_error(last)
        raise KeptChanging(slug, MAX_WRITE_ATTEMPTS, conflict) from conflict  # type: ignore[arg-type]

    def _commit(self, slug: str, writes: list[Write], fence: Union[LeaseFence, Unfenced]) -> int:
        """One batch under a fresh request id, resent under the same id while
        its outcome is unknown (fenced answers a batch that did commit with
        its original revision): update's own resends (fenced.update.commit),
        with no overall deadline, as the in-house write has none."""
        return _update.commit(self.client, slug, writes, fence=fence, timeout=math.inf, sleep=lambda s: _sleep(s))


# The module's client.

_lock = threading.Lock()
_configured: Optional[Client] = None
_from_env: Optional[tuple[int, Client]] = None  # (pid, client) made from FENCED_ADDR


def configure(client: Union[Client, str, None], **options: Any) -> None:
    """Set the Client the module functions use: a :class:`fenced.Client`, or a
    target to make one (``options`` as Client's: token, tls, timeout, ...);
    None: go back to ``FENCED_ADDR``. The caller closes a Client it passed."""
    global _configured
    with _lock:
        _configured = Client(client, **options) if isinstance(client, str) else client


def client() -> Client:
    """The Client the module functions use: the configured one, else one made
    (once per process: a child after fork() makes its own) from the
    ``FENCED_ADDR`` environment variable (plaintext; configure a Client for
    TLS or a token). Raises RuntimeError when there is neither."""
    global _from_env
    with _lock:
        if _configured is not None:
            return _configured
        pid = os.getpid()
        if _from_env is None or _from_env[0] != pid:
            addr = os.environ.get("FENCED_ADDR")
            if not addr:
                raise RuntimeError("fenced.port: no client: call fenced.port.configure(client) or set FENCED_ADDR")
            _from_env = (pid, Client(addr))  # a parent's channel is never used across fork()
        return _from_env[1]


def layout(slug: str) -> str:
    """See :meth:`Port.layout`: "records", "document" or ""."""
    return Port(client()).layout(slug)


def sections(slug: str, *names: str) -> SectionValues:
    """See :meth:`Port.sections`: {name: {key: decoded value}}."""
    return Port(client()).sections(slug, *names)


def record(slug: str, section: str, key: str) -> Optional[RecordValue]:
    """See :meth:`Port.record`: (revision, decoded value) or None."""
    return Port(client()).record(slug, section, key)


def fenced_batch(slug: str, writes: Sequence[Write], fence: FenceLike = None, *, request_id: Optional[str] = None) -> int:
    """See :meth:`Port.fenced_batch`: the revision committed at."""
    return Port(client()).fenced_batch(slug, writes, fence, request_id=request_id)


def write(slug: str, change: Callable[[Document], T], fence: FenceLike = None) -> T:
    """See :meth:`Port.write`: change's own result."""
    return Port(client()).write(slug, change, fence)
