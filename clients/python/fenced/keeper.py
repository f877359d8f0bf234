"""LeaseKeeper: hold a swarm's lease from a background thread, as the Go
client's ``client.Keeper`` (client/keeper.go)."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from typing import TYPE_CHECKING, Optional

import grpc

from . import _fork, errors
from ._fork import gate as _gate
from .model import ClaimFence, Event, Lease, LeaseFence

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ClaimKeeper", "LeaseKeeper"]

_log = logging.getLogger("fenced.keeper")


class _Acquiring:
    """How a keeper waits for its lease (shared by LeaseKeeper and
    fenced.aio.LeaseKeeper): how long to pause after each refusal, within
    the keeper's ``wait``."""

    def __init__(self, slug: str, owner: str, ttl_s: float, wait: float) -> None:
        self.slug, self.owner, self.ttl_s, self.wait = slug, owner, ttl_s, wait
        self.start = time.monotonic()
        self.give_up = self.start + wait if math.isfinite(wait) else math.inf
        self.backoff = 0.5
        self.logged_holder = ""

    def call_timeout(self, per_call: float) -> float:
        """The next acquire's timeout: the per-call one or what is left of wait."""
        return max(min(per_call, self.give_up - time.monotonic()), 0.001)

    def pause(self, err: errors.FencedError) -> float:
        """The pause before asking again after err, or raise (err, or a
        LeaseHeld saying how long it waited) when the wait would pass."""
        if isinstance(err, errors.LeaseHeld):
            # Wait out the holder's lease; never longer than one TTL, so a
            # released lease is noticed soon.
            pause = min(max(err.retry_after, 0.001), self.ttl_s)
            holder = err.holder.owner if err.holder is not None else ""
            if holder != self.logged_holder:
                self.logged_holder = holder
                _log.info("keep %s: the lease is held by %r; %s waiting for it", self.slug, holder, self.owner)
        elif isinstance(err, errors.ReplicationTimeout):
            # Too few replicas acknowledged the grant: it is not ours to
            # use. Asking again keeps the epoch the primary recorded.
            pause = self.backoff * random.uniform(0.5, 1.5)
            self.backoff *= 1.5
            _log.warning("keep %s: the grant to %s was not acknowledged by enough replicas; asking again", self.slug, self.owner)
        elif isinstance(err, errors.Unavailable):
            # fenced or Redis away, or the call's deadline passed: acquiring
            # again as the same owner is safe (a live holder keeps its epoch).
            pause = self.backoff * random.uniform(0.5, 1.5)
            self.backoff = min(self.backoff * 1.5, 5.0)
            _log.warning("keep %s: acquire failed (%s); asking again in %.2fs", self.slug, err, pause)
        else:
            raise err
        now = time.monotonic()
        if now + pause > self.give_up:
            if isinstance(err, errors.LeaseHeld):
                # The time it waited, not its budget: it gives up as soon as
                # the next wait would pass the budget.
                out = errors.LeaseHeld(
                    f"keep {self.slug}: the lease is still held by {self.logged_holder!r} after waiting {now - self.start:.1f}s "
                    f"(of at most {self.wait:g}s; its next try, in {pause:.1f}s, would come past that)",
                    code=err.code, reason=err.reason, metadata=err.metadata,
                )
                out.holder, out.retry_after = err.holder, err.retry_after
                raise out from err
            raise err
        return pause


class _Held:
    """What a keeper knows of its lease (shared by LeaseKeeper and
    fenced.aio.LeaseKeeper): the local deadline, why it was lost, and the
    logging of both."""

    def __init__(self, slug: str, owner: str, ttl_ms: int, name: str = "") -> None:
        self.slug = slug
        self.name = name
        """The claim's name (ClaimKeeper); "" for the swarm's lease."""
        self.owner = owner
        self._label = slug if not name else f"{slug} claim {name}"
        self.ttl_ms = ttl_ms
        self._ttl = ttl_ms / 1000.0
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._pid = os.getpid()
        self._deadline = 0.0
        self.epoch = 0

    def _granted(self, sent: float, lease: Lease) -> None:
        self.lease: Lease = lease
        """The lease as granted."""
        self.epoch = lease.epoch
        self._deadline = sent + self._ttl  # monotonic: when the lease surely ends
        _log.info("keep %s: lease held by %s at epoch %d (ttl %d ms)", self._label, self.owner, self.epoch, self.ttl_ms)

    def _renewed(self, sent: float) -> None:
        with self._lock:
            self._deadline = sent + self._ttl

    def fence(self, now_ms: int = 0) -> LeaseFence:
        """The fence for batches under this lease (owner and epoch). A
        ClaimKeeper has none (TypeError): its fence is :meth:`claim`."""
        if self.name:
            raise TypeError(f"claim {self.name!r} is not the swarm's lease: fence batches with claim=keeper.claim()")
        return LeaseFence(self.owner, self.epoch, now_ms)

    def claim(self, now_ms: int = 0) -> ClaimFence:
        """A ClaimKeeper's fence for batches under its claim (name, owner and
        epoch), passed as ``claim=``. The swarm's LeaseKeeper has none
        (TypeError): its fence is :meth:`fence`."""
        if not self.name:
            raise TypeError("the swarm's lease is not a claim: fence batches with fence=keeper.fence()")
        return ClaimFence(self.name, self.owner, self.epoch, now_ms)

    def held(self) -> bool:
        """Whether the lease is still held as far as this process can tell: not
        lost, and its local deadline (measured from when the last successful
        renewal was sent, on the monotonic clock) not passed. No network call.
        False in a process forked from the keeper's (which holds it)."""
        if os.getpid() != self._pid:
            return False
        with self._lock:
            return self._error is None and time.monotonic() < self._deadline

    @property
    def error(self) -> Optional[BaseException]:
        """Why the lease was lost (StaleLease, or the last renewal error when none
        succeeded in time); None while held."""
        with self._lock:
            return self._error

    def _signal_lost(self) -> None:
        raise NotImplementedError

    def _taken_over(self, ev: Event) -> Optional[errors.StaleLease]:
        """The StaleLease a take-over heard on the swarm's Watch stream makes
        of this lease (None when ev is none): for the swarm's lease a batch
        putting meta/lease fenced by another owner, or by this owner at a
        later epoch (it lapsed and was granted again); for a claim its grant
        to another owner or at another epoch, or the end (release, lapse) of
        this grant. As the Go client's Keeper (client/keeper.go takenOver)."""
        why, holder = "", None
        if self.name:
            c = ev.claim
            if c is None or c.name != self.name:
                return None
            if c.kind == "granted" and (c.owner != self.owner or c.epoch != self.epoch):
                why, holder = f"granted to {c.owner!r} at epoch {c.epoch}", Lease(c.owner, c.epoch, c.expires_at_ms)
            elif c.kind in ("lapsed", "released") and c.epoch == self.epoch:
                why = c.kind
            else:
                return None
        else:
            for ch in ev.changes:
                if ch.section != "meta" or ch.key != "lease" or ch.delete:
                    continue
                # The record read with the event is the one it wrote when it
                # is at the event's revision (else a later event follows).
                r = ch.record
                holder = None
                if r is not None and r.revision == ev.revision:
                    try:
                        v = json.loads(r.value)
                        holder = Lease(str(v["owner"]), int(v["epoch"]), int(v.get("expires_at", 0)))
                    except (ValueError, KeyError, TypeError):
                        holder = None
                if ev.owner != self.owner:
                    why = f"granted to {ev.owner!r}"
                    break
                if holder is not None and holder.epoch > self.epoch:
                    why = f"granted again to {ev.owner!r} at epoch {holder.epoch}"
                    break
            if not why:
                return None
        err = errors.StaleLease(
            f"{self._label}: taken over (heard on its Watch stream at revision {ev.revision}): {why}",
            code=grpc.StatusCode.FAILED_PRECONDITION, reason="LEASE_STALE",
        )
        err.holder = holder
        return err

    def _mark_lost(self, err: BaseException, *, released: bool = False) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = err
        if released:
            _log.info("keep %s: lease of %s at epoch %d released", self._label, self.owner, self.epoch)
        else:
            _log.error("keep %s: lease of %s at epoch %d lost: %s", self._label, self.owner, self.epoch, err)
        self._signal_lost()

    def _renewal_failed(self, err: errors.FencedError) -> bool:
        """A renewal failed: whether the lease is lost (StaleLease, or the
        local deadline passed); logs either way."""
        if isinstance(err, errors.StaleLease):
            self._mark_lost(err)
            return True
        if not self.held():
            self._mark_lost(err)
            return True
        _log.warning("keep %s: renewal of %s at epoch %d failed (retrying at the next tick): %s",
                     self._label, self.owner, self.epoch, err)
        return False


class LeaseKeeper(_Held):
    """Holds a swarm's lease for one owner.

    Creating it acquires the lease (waiting while another owner holds it, as
    long as the server's RetryInfo says, and asking again while too few
    replicas acknowledge the grant or fenced is unavailable, at most ``wait``
    seconds in all), then a daemon thread renews it every third
    of its TTL. Once the lease is lost (a renewal refused with StaleLease,
    none succeeding before the lease would end, or a take-over heard on the
    swarm's Watch stream by another daemon thread: a grant to another owner
    or at a later epoch) it stops renewing and sets :attr:`lost`;
    :attr:`error` says why (a take-over: a StaleLease naming the ``holder``). :meth:`held` is cheap and never calls
    the network. Whatever the keeper believes, the server is the authority: a
    batch fenced with a lost lease is refused with StaleLease.

    Use it as a context manager (or call :meth:`close`): it stops renewing and
    releases the lease if it is still held.

    It logs (logger ``fenced.keeper``): the grant and the release at INFO, a
    wait for another holder at INFO, a failed renewal at WARNING, the loss of
    the lease at ERROR.

    Args:
        client: the fenced Client.
        slug: the swarm.
        owner: this process's unique owner name (1-1024 bytes of UTF-8).
        ttl_ms: the lease's length in ms, within the server's bounds.
        wait: how long to keep asking, in seconds; None: the Client's
            timeout; ``math.inf``: as long as it takes.

    Raises:
        LeaseHeld: still held by another owner after ``wait`` seconds (its
            message says so; ``holder`` names it).
        Unavailable: fenced still unavailable after ``wait`` seconds.
        FencedError: any other error of acquire (InvalidArgument, ...).

    fork(): the keeper's thread and the lease stay the parent's. In a child,
    :meth:`held` is False and :meth:`close` does nothing (the child never
    releases the parent's lease); :meth:`fence` still names the lease.
    """

    def __init__(self, client: "Client", slug: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> None:
        self._keep(client, slug, "", owner, ttl_ms, wait)

    def _keep(self, client: "Client", slug: str, name: str, owner: str, ttl_ms: int, wait: Optional[float]) -> None:
        super().__init__(slug, owner, ttl_ms, name)
        self._c = client
        self.lost = threading.Event()
        """Set when the lease is lost (or released by close)."""
        self._stopping = False
        sent, lease = self._acquire(client._timeout if wait is None else wait)
        self._granted(sent, lease)
        self._thread = threading.Thread(target=self._renew, name=f"fenced-keeper-{slug}", daemon=True)
        self._thread.start()
        self._stream = _fork.Stream()
        self._follower = threading.Thread(target=self._follow, args=(lease.revision,),
                                          name=f"fenced-keeper-follow-{slug}", daemon=True)
        self._follower.start()

    def _signal_lost(self) -> None:
        self.lost.set()
        _gate.wake()
        call = self._stream.call if hasattr(self, "_stream") else None
        if call is not None:
            call.cancel()  # the follower ends

    def _acquire(self, wait: float) -> tuple[float, Lease]:
        a = _Acquiring(self._label, self.owner, self._ttl, wait)
        while True:
            sent = time.monotonic()
            try:
                return sent, self._c.acquire(self.slug, self.owner, ttl_ms=self.ttl_ms, name=self.name,
                                             timeout=a.call_timeout(self._c._timeout))
            except errors.FencedError as e:
                pause = a.pause(e)
            _gate.sleep(pause, lambda: False)

    def _renew(self) -> None:
        """Extend the lease every ttl/3 until stopped or lost. A renewal that
        fails for any reason but StaleLease is retried at the next tick until
        the local deadline passes."""
        period = self._ttl / 3
        # A sleep fork() can park (fenced/_fork.py).
        while not _gate.sleep(period, lambda: self._stopping or self.lost.is_set()):
            sent = time.monotonic()
            try:
                self._c.renew(self.slug, self.owner, self.epoch, ttl_ms=self.ttl_ms, name=self.name, timeout=period)
            except errors.FencedError as e:
                if self._renewal_failed(e):
                    return
                continue
            self._renewed(sent)

    def _follow(self, start: int) -> None:
        """Watch the swarm's meta records (claim events come whatever the
        sections) from the grant's revision; a take-over marks the lease
        lost at once, not at the next renewal a third of the TTL later. A
        stream that ends (compacted, refused, fenced away) is opened again
        from the last revision it yielded (compacted: from now), with
        backoff, until the keeper stops or the lease is lost; the renewals
        stay the keeper's own account of its lease meanwhile."""
        def done() -> bool:
            return self._stopping or self.lost.is_set()

        wait = 0.05
        while not done():
            try:
                for ev in self._c._watch_events(self.slug, start, self._stream, done, ("meta",), False):
                    start = ev.revision
                    wait = 0.05
                    err = self._taken_over(ev)
                    if err is not None:
                        self._mark_lost(err)
                        return
            except errors.RevisionCompacted:
                start = 0  # what was missed cannot be read: from now on
            except Exception as e:  # noqa: BLE001 - the renewals still keep the lease
                _log.debug("keep %s: its watch ended (%s); opening it again", self._label, e)
            if _gate.sleep(wait * random.uniform(0.5, 1.5), done):
                return
            wait = min(wait * 2, 5.0)

    def _stop_following(self) -> None:
        call, self._stream.call = self._stream.call, None
        if call is not None:
            call.cancel()
        if self._follower is not threading.current_thread():
            self._follower.join()

    def close(self) -> None:
        """Stop renewing and release the lease if it is still held. Idempotent.
        A lease already lost is not released (:attr:`error` says why). Raises
        FencedError when the release fails for another reason than StaleLease.
        In a process forked from the keeper's, it does nothing."""
        if os.getpid() != self._pid:
            return
        self._stopping = True
        _gate.wake()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._stop_following()
        if self.error is not None:
            return
        try:
            self._c.release(self.slug, self.owner, self.epoch, name=self.name)
        except errors.StaleLease as e:
            self._mark_lost(e)
            return
        self._mark_lost(errors.FencedError(f"lease of {self._label} released"), released=True)

    def __enter__(self) -> "LeaseKeeper":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except errors.FencedError:
            if exc_type is None:
                raise


class ClaimKeeper(LeaseKeeper):
    """Holds one claim of a swarm (a named lease, docs/design/12-claims.md)
    for one owner: :class:`LeaseKeeper`'s rules (acquire within ``wait``,
    renew every third of the TTL from a daemon thread, :attr:`lost` set and
    :attr:`error` saying why once a renewal is refused or none succeeded in
    time, release on :meth:`close` or when leaving ``with``) for the claim
    ``name``. A worker keeps its claim on a task with it while it works on
    the task, and fences its batches with ``claim=keeper.claim()``; it has
    no :meth:`fence` (a claim is not the swarm's lease). Made by
    :meth:`fenced.Client.keep_claim`.
    """

    def __init__(
        self, client: "Client", slug: str, name: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None
    ) -> None:
        self._keep(client, slug, name, owner, ttl_ms, wait)

    def __enter__(self) -> "ClaimKeeper":
        return self
