"""LeaseKeeper: hold a swarm's lease from a background thread, as the Go
client's ``client.Keeper`` (client/keeper.go)."""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING, Optional

from . import errors
from .model import Lease, LeaseFence

if TYPE_CHECKING:
    from .client import Client

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Holds a swarm's lease for one owner.

    Creating it acquires the lease (waiting while another owner holds it, as
    long as the server's RetryInfo says, and asking again while too few
    replicas acknowledge the grant), then a daemon thread renews it every third
    of its TTL. Once the lease is lost (a renewal refused with StaleLease, or
    none succeeding before the lease would end) it stops renewing and sets
    :attr:`lost`; :attr:`error` says why. :meth:`held` is cheap and never calls
    the network. Whatever the keeper believes, the server is the authority: a
    batch fenced with a lost lease is refused with StaleLease.

    Use it as a context manager (or call :meth:`close`): it stops renewing and
    releases the lease if it is still held.

    Args:
        client: the fenced Client.
        slug: the swarm.
        owner: this process's unique owner name (1-1024 bytes of UTF-8).
        ttl_ms: the lease's length in ms, within the server's bounds.
        wait: how long to keep asking while another owner holds the lease, in
            seconds; None: as long as it takes.

    Raises:
        LeaseHeld: still held by another owner after ``wait`` seconds.
        FencedError: any other error of acquire (InvalidArgument, ...).

    Fork safety: the keeper's thread and its Client's channel live in the
    process that created them; a child made by ``fork()`` has neither. Create
    the Client and the LeaseKeeper after forking.
    """

    def __init__(self, client: "Client", slug: str, owner: str, *, ttl_ms: int, wait: Optional[float] = None) -> None:
        self._c = client
        self.slug = slug
        self.owner = owner
        self.ttl_ms = ttl_ms
        self._ttl = ttl_ms / 1000.0
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self.lost = threading.Event()
        """Set when the lease is lost (or released by close)."""
        self._stop = threading.Event()
        sent, lease = self._acquire(wait)
        self.lease: Lease = lease
        """The lease as granted."""
        self.epoch = lease.epoch
        self._deadline = sent + self._ttl  # monotonic: when the lease surely ends
        self._thread = threading.Thread(target=self._renew, name=f"fenced-keeper-{slug}", daemon=True)
        self._thread.start()

    def _acquire(self, wait: Optional[float]) -> tuple[float, Lease]:
        give_up = None if wait is None else time.monotonic() + wait
        backoff = 0.5
        while True:
            sent = time.monotonic()
            try:
                return sent, self._c.acquire(self.slug, self.owner, ttl_ms=self.ttl_ms)
            except errors.LeaseHeld as e:
                # Wait out the holder's lease; never longer than one TTL, so a
                # released lease is noticed soon.
                pause = min(max(e.retry_after, 0.001), self._ttl)
                err: errors.FencedError = e
            except errors.ReplicationTimeout as e:
                # Too few replicas acknowledged the grant: it is not ours to
                # use. Asking again keeps the epoch the primary recorded.
                pause = backoff * random.uniform(0.5, 1.5)
                backoff *= 1.5
                err = e
            if give_up is not None and time.monotonic() + pause > give_up:
                raise err
            time.sleep(pause)

    def fence(self, now_ms: int = 0) -> LeaseFence:
        """The fence for batches under this lease (owner and epoch)."""
        return LeaseFence(self.owner, self.epoch, now_ms)

    def held(self) -> bool:
        """Whether the lease is still held as far as this process can tell: not
        lost, and its local deadline (measured from when the last successful
        renewal was sent, on the monotonic clock) not passed. No network call."""
        with self._lock:
            return self._error is None and time.monotonic() < self._deadline

    @property
    def error(self) -> Optional[BaseException]:
        """Why the lease was lost (StaleLease, or the last renewal error when none
        succeeded in time); None while held."""
        with self._lock:
            return self._error

    def _mark_lost(self, err: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = err
                self.lost.set()

    def _renew(self) -> None:
        """Extend the lease every ttl/3 until stopped or lost. A renewal that
        fails for any reason but StaleLease is retried at the next tick until
        the local deadline passes."""
        period = self._ttl / 3
        while not self._stop.wait(period):
            sent = time.monotonic()
            try:
                self._c.renew(self.slug, self.owner, self.epoch, ttl_ms=self.ttl_ms, timeout=period)
            except errors.StaleLease as e:
                self._mark_lost(e)
                return
            except errors.FencedError as e:
                if not self.held():
                    self._mark_lost(e)
                    return
                continue
            with self._lock:
                self._deadline = sent + self._ttl

    def close(self) -> None:
        """Stop renewing and release the lease if it is still held. Idempotent.
        A lease already lost is not released (:attr:`error` says why). Raises
        FencedError when the release fails for another reason than StaleLease."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self.error is not None:
            return
        try:
            self._c.release(self.slug, self.owner, self.epoch)
        except errors.StaleLease as e:
            self._mark_lost(e)
            return
        self._mark_lost(errors.FencedError(f"lease of {self.slug} released"))

    def __enter__(self) -> "LeaseKeeper":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except errors.FencedError:
            if exc_type is None:
                raise
