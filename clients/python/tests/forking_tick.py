"""A tick that forks its workers, for the fork test (test_fork.py).

Usage: forking_tick.py ADDR SLUG HOW, HOW being "os.fork" or "multiprocessing"
(the "fork" start method). The parent holds the swarm's lease with a
LeaseKeeper (renewing every second), follows the swarm with a Watch from a
thread, keeps one more thread busy (a service's other work), and forks 20
workers; each makes its own Client and commits one batch under the parent's
fence. It prints one JSON line: how the workers ended, whether the parent's
keeper still holds the lease, whether its next batch committed, and which
worker commits its watch saw. Every wait is bounded (a hang bound, not a
speed claim); a worker still running after it is killed and counted as hung.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import fenced  # noqa: E402

WORKERS = 20
HANG_BOUND_S = 60.0


def worker(addr: str, slug: str, fence: fenced.LeaseFence, i: int) -> None:
    """A worker's body: its own Client, one fenced batch."""
    with fenced.Client(addr, timeout=HANG_BOUND_S) as c:
        c.fenced_batch(slug, [fenced.Put("claims", f"w{i}", 0, str(i))], fence=fence)


def _child(addr: str, slug: str, fence: fenced.LeaseFence, i: int) -> None:
    code = 0
    try:
        worker(addr, slug, fence, i)
    except BaseException as e:  # noqa: BLE001
        print(f"worker {i}: {e}", file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


def main() -> None:
    addr, slug, how = sys.argv[1], sys.argv[2], sys.argv[3]
    c = fenced.Client(addr, timeout=HANG_BOUND_S)
    k = c.keep(slug, "forking-tick", ttl_ms=3000)
    fence = k.fence()
    seen: list[str] = []
    watch_errors: list[str] = []
    stop = threading.Event()

    start = c.fenced_batch(slug, [fenced.Put("operations", "start", 0, "1")], fence=fence).revision

    def follow() -> None:
        try:
            for ev in c.watch(slug, start, sections=["claims"]):
                seen.extend(ch.key for ch in ev.changes)
        except BaseException as e:  # noqa: BLE001
            watch_errors.append(repr(e))

    def busy() -> None:
        n = 0
        while not stop.is_set():
            n += sum(range(100))

    threading.Thread(target=follow, daemon=True).start()
    threading.Thread(target=busy, daemon=True).start()
    first = c.fenced_batch(slug, [fenced.Put("operations", "tick", 0, "1")], fence=fence).revision

    outcomes: list[str] = []
    if how == "os.fork":
        pids = []
        for i in range(WORKERS):
            pid = os.fork()
            if pid == 0:
                _child(addr, slug, fence, i)
            pids.append(pid)
        deadline = time.monotonic() + HANG_BOUND_S
        left = set(pids)
        while left and time.monotonic() < deadline:
            for pid in list(left):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    left.discard(pid)
                    outcomes.append("ok" if os.waitstatus_to_exitcode(status) == 0 else "failed")
            time.sleep(0.01)
        for pid in left:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            outcomes.append("hung")
    else:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=worker, args=(addr, slug, fence, i)) for i in range(WORKERS)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + HANG_BOUND_S
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.001))
            if p.is_alive():
                p.kill()
                p.join()
                outcomes.append("hung")
            else:
                outcomes.append("ok" if p.exitcode == 0 else "failed")

    held = k.held() and not k.lost.is_set()
    try:
        after = c.fenced_batch(slug, [fenced.Put("operations", "tick", first, "2")], fence=k.fence()).revision
        batch = "committed" if after > first else "not after"
    except fenced.FencedError as e:
        batch = f"{type(e).__name__}: {e}"
    want = {f"w{i}" for i in range(WORKERS) if outcomes.count("ok") == WORKERS}
    deadline = time.monotonic() + HANG_BOUND_S
    while want and not want <= set(seen) and not watch_errors and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    print(json.dumps({
        "workers": sorted(outcomes), "held": held, "batch": batch, "watched": sorted(set(seen)),
        "watched_twice": len(seen) - len(set(seen)), "watch_errors": watch_errors,
        "keeper_error": repr(k.error) if k.error else None,
    }), flush=True)
    k.close()
    c.close()


if __name__ == "__main__":
    main()
