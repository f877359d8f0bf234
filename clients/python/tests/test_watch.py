"""watch: a swarm's committed batches as a stream, resumed across restarts, as the Go client's Watch."""

from __future__ import annotations

import pathlib
import queue
import threading

import pytest

import fenced
from conftest import WAIT_S, Fenced, Redis, free_port, swarm_key

# LOG_CAP is the number of batches a swarm's log keeps at least (docs/design.md §6.1).
LOG_CAP = 1000


def test_list_then_watch_yields_every_later_batch_with_its_changes(client: fenced.Client, slug: str) -> None:
    first = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, '"a"'), fenced.Put("intents", "x", 0, "1")]).revision
    snap = client.sections(slug)
    lease = client.acquire(slug, "tick-w", ttl_ms=60_000)
    r1 = client.fenced_batch(slug, [fenced.Put("claims", "b", 0, '{"by":"w"}')], fence=lease.fence(), request_id="req-1").revision
    r2 = client.fenced_batch(slug, [fenced.Delete("claims", "a", first)]).revision
    r3 = client.fenced_batch(slug, [fenced.Put("intents", "x", first, "2")]).revision

    stream = client.watch(slug, snap.revision)
    events = [next(stream) for _ in range(4)]  # the grant, then the three batches
    stream.close()
    assert [e.revision for e in events] == sorted(e.revision for e in events) and events[-3].revision == r1
    grant, put_b, del_a, put_x = events
    assert grant.revision == lease.revision and grant.owner == "tick-w"
    assert (put_b.owner, put_b.request_id) == ("tick-w", "req-1")
    assert put_b.changes == (fenced.Change("claims", "b", False, fenced.Record(r1, '{"by":"w"}')),)
    assert del_a.revision == r2 and del_a.changes == (fenced.Change("claims", "a", True, None),)
    assert put_x.revision == r3 and put_x.changes == (fenced.Change("intents", "x", False, fenced.Record(r3, "2")),)

    only_claims = client.watch(slug, snap.revision, sections=["claims"])
    got = [next(only_claims) for _ in range(2)]
    only_claims.close()
    assert [e.revision for e in got] == [r1, r2]  # the intents batch (and the grant, in meta) left out


def test_watch_from_now_with_progress(client: fenced.Client, slug: str) -> None:
    rev = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")]).revision
    stream = client.watch(slug, progress=True)
    first = next(stream)
    assert first.progress and first.revision >= rev
    nxt = client.fenced_batch(slug, [fenced.Put("claims", "a", rev, "2")]).revision
    ev = next(e for e in stream if not e.progress)
    stream.close()
    assert ev.revision == nxt


def test_watch_reports_compaction_as_a_typed_error(client: fenced.Client, redis: Redis, slug: str) -> None:
    # The log keeps at least the last LOG_CAP batches and drops whole stream
    # nodes (XADD MAXLEN ~): commit until it has dropped some, as the Go
    # tests' fencedtest.FillLogPastItsCap does.
    log, revs, kept = swarm_key(slug, "log"), [], 0
    for i in range(LOG_CAP + 10_000):
        revs.append(client.fenced_batch(slug, [fenced.Put("journals", "j", fenced.BLIND, str(i))]).revision)
        if len(revs) > LOG_CAP and len(revs) % 10 == 0:
            kept = int(redis.cli("XLEN", log))
            if kept < len(revs):
                break
    else:
        pytest.fail(f"the log kept all of {len(revs)} entries")
    with pytest.raises(fenced.RevisionCompacted) as e:
        next(client.watch(slug, revs[0]))
    assert (e.value.from_revision, e.value.oldest) == (revs[0], revs[len(revs) - kept])


def test_watch_resumes_across_a_fenced_restart(fenced_bin: pathlib.Path, workdir: pathlib.Path, slug: str) -> None:
    r = Redis(workdir / "redis-watch")
    addr = f"127.0.0.1:{free_port()}"
    f = Fenced(fenced_bin, r, workdir, listen=addr)
    got: "queue.Queue[object]" = queue.Queue()
    try:
        with fenced.Client(addr) as writer, fenced.Client(addr) as watcher:
            def put(i: int) -> int:
                return writer.fenced_batch(slug, [fenced.Put("journals", "j", fenced.BLIND, str(i))]).revision

            committed = [put(0)]
            stream = watcher.watch(slug, committed[0])

            def follow() -> None:
                try:
                    for ev in stream:
                        got.put(ev.revision)
                except BaseException as e:  # noqa: BLE001
                    got.put(e)

            threading.Thread(target=follow, daemon=True).start()
            seen: list[object] = []

            def expect(n: int) -> None:
                while len(seen) < n:
                    seen.append(got.get(timeout=WAIT_S))
                    assert isinstance(seen[-1], int), seen[-1]

            committed += [put(i) for i in range(1, 4)]
            expect(3)
            f.stop()  # the stream breaks; the watcher reopens from the last revision seen
            f = Fenced(fenced_bin, r, workdir, listen=addr)
            committed += [put(i) for i in range(4, 7)]
            expect(6)
            assert seen == committed[1:]  # every later batch, in order, none twice
            assert got.empty()
    finally:
        f.stop()
        r.stop()
