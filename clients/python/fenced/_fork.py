"""fork() with the client in use: what grpcio 1.51 needs, done around every fork.

What goes wrong without it (a tick holding a LeaseKeeper and a Watch forks 20
workers, each making its own Client; grpcio 1.51.1, measured):

- Without grpcio's fork support (``GRPC_ENABLE_FORK_SUPPORT``, off by default
  in grpcio 1.51) the child inherits gRPC's core as it was: its threads are
  gone and its epoll set is the parent's (one kernel object for the process's
  life, kept even across grpc_shutdown), so the child's and the parent's
  connections see each other's events: 16 of 20 workers hung, the rest failed
  "Bad file descriptor", and the parent's next batch failed INTERNAL
  RST_STREAM.
- With it, gRPC's core (its own C fork handler) makes the child a new epoll
  set and threads, and grpcio's Python handler closes there every channel the
  parent had open, from inside ``fork()``, before Python has re-made its GIL
  for the child. If another thread of the parent was waiting for the GIL at
  that instant (the keeper's renewal thread waking from its sleep, a thread
  reading a Watch, which grpcio wakes every 0.1 s, any busy thread), the
  child blocks for ever on the GIL: 8 of 20 workers did. And right after the
  closes it checks that gRPC's core is down and exits the child (64, "Failed
  to shutdown gRPC Core after fork()") when a closed channel's teardown has
  not finished yet: 1 fork in ~1,000.
- A channel opened again after being closed around every fork is worse: core
  shut down in the parent between forks skips its own fork handler (no new
  epoll set in the child), and closing a channel whose connection is being
  made leaves its teardown (and a core reference) running into the next fork.

So the package turns fork support on (``fenced/__init__.py``, when it is
imported before grpc and the variable is unset) and, before every ``fork()``
(``os.register_at_fork``: os.fork, multiprocessing's "fork" start method,
ProcessPoolExecutor):

1. holds back new calls of every Client of this process and waits for the
   unary calls in flight (at most :data:`DRAIN_S`): no thread of the package
   is inside gRPC's core when its fork handler runs (it skips the child's
   reset when one is);
2. cancels every Watch stream (each watch reopens from the last revision it
   yielded, after the fork) and waits until grpcio's channel spin threads are
   done with them, so they have ended too;
3. parks the package's own threads (keepers' renewals, watches) in untimed
   waits; a keeper due to renew renews first, so back-to-back forks do not
   starve a lease;
4. lets grpcio's handler pause its threads as ever, then has it take the fork
   as failed, which makes its child handler return at once, running no
   Python; the package does the child's part itself, in Python's own
   after-fork hook, with the GIL Python's again: it closes the parent's
   channels there as grpcio would, and checks nothing;
5. after gRPC's core has stopped its threads (its own ``pthread_atfork``
   handler) and right before the fork itself, waits until those threads have
   exited (``/proc/self/task``): core counts a thread stopped before it has
   run its thread-exit code, which takes abseil's allocator and free-list
   spinlocks; forked in that window, a child inherits the lock held and
   every thread gRPC starts there spins on it for ever (1 hung worker in ~10
   runs of 20 forks did, before this step). The wait is a ``pthread_atfork``
   handler the package registers before grpc is first imported, so that it
   runs after core's; imported after grpc, the package has none.

The parent keeps its channels and connections; the whole takes milliseconds
when nothing is in flight. In the child the parent's Clients and keepers are
inert (a call raises :class:`~fenced.FencedError`: the Client belongs to the
parent); a Client made in the child works as in any process.

With fork support off (grpc imported before fenced, or the variable set to
false), each fork logs a WARNING, and a child forked from a process with an
open Client is refused a new one (:meth:`_Gate.check_new_client`) rather than
left to hang.

What it cannot do: make the caller's own gRPC calls or streams in flight wait
for the fork (grpcio's core then skips its fork handler and the child's
channels fail), nor anything for a grpcio whose internals differ (it then
leaves grpcio's handlers as they are). The start methods "forkserver" and
"spawn" have none of this: their children inherit no gRPC state at all.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

__all__ = ["DRAIN_S", "QUIESCE_S", "fork_support_enabled", "gate"]

_log = logging.getLogger("fenced.fork")

DRAIN_S = 5.0
"""How long a ``fork()`` waits for the unary calls in flight to end (seconds);
past it, it logs a WARNING and forks with them in flight (as grpcio does
past its own wait for its threads)."""

QUIESCE_S = 5.0
"""How long a ``fork()`` then waits for the package's threads to park and its
streams to end (seconds); past it, it logs a WARNING and forks."""

def fork_support_enabled() -> bool:
    """Whether grpcio's fork support is on in this process (it is read once,
    when grpc is first imported)."""
    try:
        from grpc._cython import cygrpc

        return bool(cygrpc.is_fork_support_enabled())
    except (ImportError, AttributeError):  # pragma: no cover - another grpcio
        return False


class Stream:
    """One open Watch call, held where a fork can drop it: a generator
    suspended at ``yield`` keeps no reference of its own to the call."""

    __slots__ = ("call", "__weakref__")

    def __init__(self) -> None:
        self.call: Any = None


class _Gate:
    """The package's threads and calls as a fork sees them: counts the unary
    calls in flight, holds new ones back while a fork is prepared, parks the
    package's waiting threads."""

    def __init__(self) -> None:
        self._reset()
        self.generation = 0
        """Incremented by every fork: a Watch whose stream ended while it
        changed was cut by the fork, not by the server."""

    def _reset(self) -> None:
        self._cond = threading.Condition()  # the parked threads wait on it
        self._hook = threading.Condition(self._cond)  # the forking thread on this one (the same lock)
        self._forking = False
        self._unsafe_fork = False  # this fork, fork support off, with a Client open (before())
        self._with_clients = False  # this fork, with a Client open (before())
        self.unsafe_child = False
        """This process was forked unsafely: check_new_client refuses Clients."""
        self._in_flight = 0  # unary calls and stream openings under way
        self._in_next = 0  # threads inside a Watch's next(), or handling its end
        self._sleepers = 0  # threads in sleep()
        self._due: set[int] = set()  # threads whose sleep() ended on time, until their next enter()
        self._parked_at: dict[int, tuple[int, bool]] = {}  # parked thread -> (generation, in sleep())
        self._clients: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()

    def register(self, client: Any) -> None:
        """Track a Client (a fork waits for its streams to end, and closes its channel)."""
        with self._cond:
            self._clients.add(client)

    def track(self, stream: Stream) -> None:
        """Track a Watch's stream holder (its call is cancelled before every fork)."""
        with self._cond:
            self._streams.add(stream)

    def enter(self, busy: bool = False) -> None:
        """Before a unary call or a stream's opening: wait (parked) while a
        fork is being prepared. busy: the caller's stream ended
        (next_response), which this wait ends."""
        with self._cond:
            if busy:
                self._in_next -= 1
            self._due.discard(threading.get_ident())
            self._hook.notify_all()
            self._park(sleeper=False)
            self._in_flight += 1

    def leave(self) -> None:
        """After a unary call or a stream's opening (whatever its outcome)."""
        with self._cond:
            self._in_flight -= 1
            self._hook.notify_all()

    def _park(self, sleeper: bool) -> None:
        """Wait, untimed, while a fork is prepared (the lock held). The wait
        is registered anew for every fork it lasts through: a thread woken
        by one fork's end but not yet run when the next begins is not parked
        yet (it waits for the GIL), and that fork waits for it."""
        me = threading.get_ident()
        while self._forking:
            self._parked_at[me] = (self.generation, sleeper)
            self._hook.notify_all()
            self._cond.wait()
        self._parked_at.pop(me, None)

    def next_response(self, stream: Stream) -> Any:
        """The next answer of a stream's call: its message, or None when the
        stream ended cleanly or a fork dropped it. Raises grpc.RpcError. No
        reference to the call is left behind. Unless it answers a message,
        the calling thread stays busy with the stream (a fork waits for it)
        until it calls enter(busy=True) or end_busy()."""
        with self._cond:
            self._in_next += 1
        call = stream.call
        if call is None:
            return None
        try:
            resp = next(call)
        except StopIteration:
            return None
        finally:
            del call
        with self._cond:
            self._in_next -= 1
            self._hook.notify_all()
        return resp

    def end_busy(self) -> None:
        """The calling thread is done with its ended stream (next_response)."""
        with self._cond:
            self._in_next -= 1
            self._hook.notify_all()

    def sleep(self, seconds: float, stop: Callable[[], bool]) -> bool:
        """Wait ``seconds`` or until ``stop()`` (after wake()), parked
        (untimed) while a fork is prepared; True when stopped. For the
        package's own threads."""
        end = time.monotonic() + seconds
        with self._cond:
            self._sleepers += 1
            try:
                while not stop():
                    if self._forking:
                        self._park(sleeper=True)
                        continue
                    left = end - time.monotonic()
                    if left <= 0:
                        # Its work (a renewal) goes before the next fork.
                        self._due.add(threading.get_ident())
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._sleepers -= 1

    def wake(self) -> None:
        """Wake the sleepers (a stop() of theirs turned true)."""
        with self._cond:
            self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether every thread and stream of the package is at rest for this
        fork (the lock held)."""
        parked_sleepers = 0
        for gen, sleeper in self._parked_at.values():
            if gen != self.generation:
                return False
            parked_sleepers += sleeper
        if self._in_next or parked_sleepers != self._sleepers:
            return False
        return not any(c._streams_open() for c in self._clients)

    def before(self) -> None:
        _log.debug("fork(): preparing")
        with self._cond:
            # A thread whose sleep ended (a keeper about to renew) gets its
            # call in first: back-to-back forks must not starve a lease.
            if not self._hook.wait_for(lambda: not self._due, timeout=DRAIN_S):
                _log.warning("fork(): %d fenced threads due to call still not calling after %.1fs; forking anyway",
                             len(self._due), DRAIN_S)
            self._due.clear()
            self._forking = True
            if not self._hook.wait_for(lambda: self._in_flight == 0, timeout=DRAIN_S):
                _log.warning("fork(): %d fenced calls still in flight after %.1fs; forking anyway",
                             self._in_flight, DRAIN_S)
            self.generation += 1
            streams, any_client = list(self._streams), any(not c._closed for c in self._clients)
            self._with_clients = any_client
            self._unsafe_fork = any_client and not fork_support_enabled()
            self._cond.notify_all()  # the sleepers park
        for s in streams:
            call, s.call = s.call, None
            if call is not None:
                call.cancel()
            del call
        if not any_client:
            return
        if not fork_support_enabled():
            _log.warning(
                "fork(): grpcio's fork support is off (GRPC_ENABLE_FORK_SUPPORT false, or unset when grpc was "
                "first imported, e.g. grpc imported before fenced): a Client made in the child may hang; "
                "import fenced first, set GRPC_ENABLE_FORK_SUPPORT=true, or use the 'forkserver' or 'spawn' "
                "start method"
            )
        # grpcio's spin threads say nothing when they are done with a
        # cancelled stream: poll (2 ms) for that.
        end = time.monotonic() + QUIESCE_S
        with self._cond:
            while not self._ready():
                if time.monotonic() > end:
                    _log.warning("fork(): fenced's threads or streams still busy after %.1fs; forking anyway", QUIESCE_S)
                    break
                self._hook.wait(0.002)

    def forking_with_clients(self) -> bool:
        """Whether a fork is being prepared in a process with an open Client."""
        return self._forking and self._with_clients

    def after_in_parent(self) -> None:
        _log.debug("fork(): done in the parent")
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def after_in_child(self) -> None:
        _grpc_child_part()
        unsafe = self._unsafe_fork
        # Threads that held or waited on these locks did not follow the fork.
        self._reset()
        self.generation += 1
        self.unsafe_child = unsafe

    def check_new_client(self) -> None:
        """Refuse a Client in a child forked, fork support off, from a process
        with an open Client: its gRPC would share the parent's epoll set and
        hang or fail "Bad file descriptor" (see the module's doc)."""
        if self.unsafe_child:
            from . import errors
            import grpc

            raise errors.FencedError(
                "this process was forked from one with an open fenced Client while grpcio's fork support was off "
                "(grpc imported before fenced, or GRPC_ENABLE_FORK_SUPPORT not true): a Client made here would "
                "hang or fail 'Bad file descriptor'. Import fenced before grpc (or set "
                "GRPC_ENABLE_FORK_SUPPORT=true before grpc is imported), or start workers with the 'spawn' or "
                "'forkserver' start method",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )


gate = _Gate()


# grpcio's own fork handlers (grpcio 1.51, grpc/_cython/_cygrpc/fork_posix.pyx.pxi):
# its before-fork handler waits for grpcio's threads to pause and, when they
# do not in time, marks the fork failed; its child handler then returns at
# once. The package has every fork marked so (after grpcio's own wait) and
# does the child's part in after_in_child (see the module's doc). Where
# grpcio differs (no _fork_state), its handlers run unchanged.


class _Pausing:
    """grpcio's count of its active threads, wrapped: the wait for them before
    a fork is grpcio's own, its outcome always "failed" (see above)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def increment(self) -> None:
        self._real.increment()

    def decrement(self) -> None:
        self._real.decrement()

    def await_zero_threads(self, timeout_secs: float) -> bool:
        if not self._real.await_zero_threads(min(timeout_secs, QUIESCE_S)):
            _log.warning("fork(): grpcio's threads still running after %.1fs; forking anyway", QUIESCE_S)
        return False


class _QuietFailure(logging.Filter):
    """Drops grpcio's error for the fork it was made to call failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to shutdown gRPC Python threads prior to fork")


def _grpc_fork_state() -> Any:
    try:
        from grpc._cython import cygrpc

        state = cygrpc._fork_state
        if not cygrpc.is_fork_support_enabled() or not hasattr(state, "active_thread_count"):
            return None
        return state
    except (ImportError, AttributeError):  # pragma: no cover - another grpcio
        return None


def _wrap_grpc_fork_state() -> None:
    state = _grpc_fork_state()
    if state is not None and not isinstance(state.active_thread_count, _Pausing):
        state.active_thread_count = _Pausing(state.active_thread_count)


def _grpc_child_part() -> None:
    """In the child: what grpcio's child handler does, but close the channels."""
    state = _grpc_fork_state()
    if state is None:
        return
    from grpc._cython import cygrpc

    state.fork_in_progress_condition = threading.Condition()
    state.active_thread_count = _Pausing(cygrpc._ActiveThreadCount())
    for s in state.postfork_states_to_reset:
        s.reset_postfork_child()
    state.postfork_states_to_reset = []
    state.fork_epoch += 1
    for channel in list(state.channels):
        # The parent's channels: never used here; closed as grpcio's own
        # handler closes them (their sockets are gone; left alone, their
        # timers would close sockets this process opened since, reusing the
        # descriptors). Here the GIL is Python's again, and nobody checks
        # that gRPC's core is down at once.
        try:
            channel._close_on_fork()
        except Exception:  # noqa: BLE001 - a channel that will not close is left as it is
            _log.warning("fork(): closing the parent's channel in the child failed", exc_info=True)
    state.channels.clear()
    state.fork_in_progress = False


# Step 5 (see the module's doc): gRPC core's threads, by the names core gives
# them (Linux truncates a thread's name to 15 bytes).
_GRPC_THREAD_NAMES = frozenset(
    {"event_engine", "timer_manager", "grpc_global_tim", "default-executo", "resolver-execut"}
)


def _grpc_threads_alive() -> int:
    """How many of gRPC core's threads this process still has (0 where
    /proc/self/task cannot be read)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    n = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", "rb") as f:
                n += f.read().strip().decode("ascii", "replace") in _GRPC_THREAD_NAMES
        except OSError:
            pass  # exited meanwhile
    return n


def _after_grpc_prefork() -> None:
    """A pthread_atfork prepare handler, run after gRPC core's (registered
    before it): wait until core's stopped threads have exited."""
    try:
        if not gate.forking_with_clients():
            return
        end = time.monotonic() + QUIESCE_S
        while _grpc_threads_alive():
            if time.monotonic() > end:
                _log.warning("fork(): gRPC's threads still exiting after %.1fs; forking anyway", QUIESCE_S)
                return
            time.sleep(0.0005)
    except BaseException:  # noqa: BLE001 - nothing may escape into fork()
        pass


_late_prepare: Any = None  # the ctypes callback, kept alive for the process's life


def _register_after_grpc_prefork() -> None:
    """Register _after_grpc_prefork with pthread_atfork before gRPC core
    registers its handler (at grpc's first initialisation): prepare handlers
    run in the reverse order of their registration, so it runs after core's.
    Only when grpc is not imported yet and its fork support will be on."""
    global _late_prepare
    import sys

    if "grpc" in sys.modules or os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() not in ("true", "1"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        register = libc.__register_atfork  # glibc's pthread_atfork (that one is not exported)
        hook = ctypes.CFUNCTYPE(None)(_after_grpc_prefork)
        if register(hook, None, None, None) == 0:
            _late_prepare = hook
    except (OSError, AttributeError):  # not glibc: no step 5
        return


_register_after_grpc_prefork()
_wrap_grpc_fork_state()
logging.getLogger("grpc._cython.cygrpc").addFilter(_QuietFailure())


def _hook(name: str) -> Callable[[], None]:
    def run() -> None:
        getattr(gate, name)()

    return run


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hook("before"), after_in_parent=_hook("after_in_parent"), after_in_child=_hook("after_in_child")
    )
