"""fenced.aio: the asyncio client against a live fenced, with the sync client's semantics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
from typing import Any, Awaitable, Callable, TypeVar

import grpc
import pytest

import fenced
import fenced.aio
from conftest import KEY_PREFIX, WAIT_S, Fenced, Redis, wait_until

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine on a fresh event loop, bounded by the hang bound."""
    return asyncio.run(asyncio.wait_for(main(), WAIT_S))


def test_aio_reads_writes_and_errors_are_the_sync_client_s(server: Fenced, client: fenced.Client, slug: str) -> None:
    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            assert await c.layout(slug) == fenced.Layout.UNSPECIFIED
            r1 = (await c.fenced_batch(slug, [fenced.Put("claims", "a", 0, '"a"'), fenced.Put("claims", "b", 0, "2")], fence=fenced.UNFENCED)).revision
            assert await c.record(slug, "claims", "a") == fenced.Record(r1, '"a"')
            assert await c.record_at(slug, "claims", "zz") == (None, r1)
            snap = await c.sections(slug, "claims")
            assert snap == client.sections(slug, "claims")  # the sync client reads the same snapshot
            pages = [p async for p in c.scan_section(slug, "claims", page_size=1)]
            assert sorted(k for p in pages for k in p.records) == ["a", "b"]
            with pytest.raises(fenced.RevisionConflict) as e:
                await c.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], request_id="aio-rid", fence=fenced.UNFENCED)
            assert e.value.conflicts[0] == fenced.Conflict("claims", "a", 0, 0, r1) and e.value.request_id == "aio-rid"
            with pytest.raises(fenced.InvalidArgument):
                await c.fenced_batch(slug, [], fence=fenced.UNFENCED)
            lease = await c.acquire(slug, "aio", ttl_ms=60_000)
            assert (await c.current(slug)).lease == fenced.Lease("aio", lease.epoch, lease.expires_at_ms)
            await c.renew(slug, "aio", lease.epoch, ttl_ms=60_000)
            assert await c.release(slug, "aio", lease.epoch) > r1
            with pytest.raises(fenced.StaleLease):
                await c.renew(slug, "aio", lease.epoch, ttl_ms=1000)

    run(main)


def test_aio_update_runs_a_plain_change_and_commits_each_once(server: Fenced, client: fenced.Client, slug: str) -> None:
    """Eight concurrent updates of one counter, each a plain function run in
    a worker thread whose reads are the aio client's: every change counted
    once (reruns on conflict, as the sync client's)."""
    client.fenced_batch(slug, [fenced.Put("operations", "counter", 0, fenced.dumps({"n": 0}))], fence=fenced.UNFENCED)

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            async def one(i: int) -> None:
                def change(tx: fenced.Txn) -> None:
                    v = tx.get_json("operations", "counter")
                    v["n"] += 1
                    claims = tx.section("claims")
                    claims[f"c{i}"] = fenced.dumps(len(claims))  # reads the section whole
                    tx.put_json("operations", "counter", v)

                while True:
                    try:
                        await c.update(slug, change, fence=fenced.UNFENCED)
                        return
                    except fenced.KeptChanging:
                        pass  # nothing committed: run it again

            await asyncio.gather(*(one(i) for i in range(8)))

    run(main)
    assert client.record(slug, "operations", "counter").json() == {"n": 8}  # type: ignore[union-attr]
    assert sorted(client.sections(slug, "claims").sections["claims"]) == [f"c{i}" for i in range(8)]


def test_aio_watch_is_an_async_iterator_of_every_later_batch(server: Fenced, client: fenced.Client, slug: str) -> None:
    start = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED).revision

    async def main() -> list[int]:
        async with fenced.aio.Client(server.addr) as c:
            revs = [(await c.fenced_batch(slug, [fenced.Put("claims", f"k{i}", 0, "1")], fence=fenced.UNFENCED)).revision for i in range(3)]
            got = []
            async for ev in c.watch(slug, start):
                got.append(ev.revision)
                assert ev.changes[0].section == "claims"
                if len(got) == 3:
                    break
            assert got == revs
            return got

    assert len(run(main)) == 3


def test_aio_keeper_holds_renews_and_logs_a_lost_lease(server: Fenced, client: fenced.Client, slug: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fenced")

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            async with c.keep(slug, "aio-keeper", ttl_ms=3000) as k:
                first = (await c.current(slug)).lease
                assert first is not None and first.epoch == k.epoch and k.held()
                while (await c.current(slug)).lease.expires_at_ms <= first.expires_at_ms + 1900:  # type: ignore[union-attr]
                    await asyncio.sleep(0.01)  # two renewals (bounded by run's hang bound)
                assert (await c.fenced_batch(slug, [fenced.Put("claims", "k", 0, "1")], fence=k.fence())).revision
            assert not (await c.current(slug)).live and k.lost.is_set()
            k2 = await c.keep(slug, "aio-keeper", ttl_ms=3000)
            await c.release(slug, "aio-keeper", k2.epoch)  # behind its back
            await c.acquire(slug, "usurper", ttl_ms=60_000)
            await k2.lost.wait()
            assert isinstance(k2.error, fenced.StaleLease) and not k2.held()
            await k2.close()  # a lost lease is not released
        with pytest.raises(fenced.LeaseHeld) as e:
            async with fenced.aio.Client(server.addr, timeout=10.0) as impatient:  # a hang bound: an acquire on loopback answers well within it
                await impatient.keep(slug, "impatient", ttl_ms=1000)
        waited = re.search(r"still held by 'usurper' after waiting ([0-9.]+)s \(of at most 10s", str(e.value))
        assert waited and float(waited.group(1)) < 10, str(e.value)  # the time waited, not the budget

    run(main)
    errors_logged = [r.getMessage() for r in caplog.records if r.name == "fenced.keeper" and r.levelno == logging.ERROR]
    assert len(errors_logged) == 1 and f"keep {slug}: lease of aio-keeper at epoch" in errors_logged[0]


def test_aio_migrate_moves_a_document_swarm(server: Fenced, redis: Redis, client: fenced.Client, slug: str) -> None:
    redis.cli("HSET", f"{KEY_PREFIX}:swarm:state:fencing:current", slug,
              '{"revision":2,"meta":{},"sections":{"claims":{"c":1}}}')

    async def main() -> tuple[fenced.MigrateResult, fenced.MigrateResult, fenced.MigrateResult]:
        async with fenced.aio.Client(server.addr) as c:
            assert await c.layout(slug) == fenced.Layout.DOCUMENT
            with pytest.raises(fenced.InvalidArgument) as e:
                await c.migrate(slug)
            assert [v.field for v in e.value.violations] == ["writers_upgraded"]
            plan = await c.migrate(slug, dry_run=True, writers_upgraded=True)
            assert await c.layout(slug) == fenced.Layout.DOCUMENT  # a dry run writes nothing
            moved = await c.migrate(slug, writers_upgraded=True)
            again = await c.migrate(slug, writers_upgraded=True)
            return plan, moved, again

    plan, moved, again = run(main)
    assert plan.records == moved.records > 0 and plan.revision == 0 and moved.revision > 0
    assert [s.name for s in moved.sections] == [s.name for s in plan.sections] and "claims" in [s.name for s in moved.sections]
    assert again.records == 0 and again.already_moved
    assert client.layout(slug) == fenced.Layout.RECORDS
    assert client.record(slug, "claims", "c") == fenced.Record(moved.revision, "1")


def test_aio_update_gives_up_at_its_timeout_naming_the_request_id(start_fenced, slug: str) -> None:  # type: ignore[no-untyped-def]
    """The sync client's policy, driven on the event loop: a Redis that stops
    answering under a batch makes update resend it under one id, then raise
    DeadlineExceeded with that id once its timeout passes."""
    f, r = start_fenced()
    stopped: list[bool] = []

    def change(tx: fenced.Txn) -> None:
        tx.put_json("operations", "counter", {"n": (tx.get_json("operations", "counter") or {"n": 0})["n"] + 1})
        if not stopped:
            stopped.append(True)
            os.kill(r.proc.pid, signal.SIGSTOP)

    class ShortBatches(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        """Each FencedBatch gets 2 s, whatever update gave it (the reads
        keep theirs: a busy box's slow read never times out this test)."""

        async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
            method = details.method.decode() if isinstance(details.method, bytes) else details.method
            if method.endswith("/FencedBatch"):
                details = details._replace(timeout=min(details.timeout or 2.0, 2.0))
            return await continuation(details, request)

    async def main() -> fenced.DeadlineExceeded:
        ch = grpc.aio.insecure_channel(f.addr, options=list(fenced.CHANNEL_OPTIONS), interceptors=[ShortBatches()])
        try:
            async with fenced.aio.Client.from_channel(ch, timeout=WAIT_S) as c:
                await c.update(slug, change, timeout=6.0, fence=fenced.UNFENCED)
        except fenced.DeadlineExceeded as e:
            return e
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
            await ch.close()
        raise AssertionError("update did not time out")

    err = run(main)
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED and len(err.request_id) == 32
    assert "timeout of 6s passed" in str(err)
    with fenced.Client(f.addr) as c:
        # Resent under that id, the batch commits once, whether a send
        # before reached Redis (replayed) or none did (fenced may not have
        # passed it on before its deadline).
        again = c.fenced_batch(slug, [fenced.Put("operations", "counter", 0, '{"n":1}')], request_id=err.request_id, fence=fenced.UNFENCED)
        rec = c.record(slug, "operations", "counter")
        assert rec is not None and rec.revision == again.revision and json.loads(rec.value) == {"n": 1}


def test_aio_update_cancelled_sends_nothing_more(server: Fenced, client: fenced.Client, slug: str) -> None:
    """Cancelling an update's task while its change runs: the change's next
    read raises, and no batch is sent."""
    import threading

    entered, release = threading.Event(), threading.Event()
    seen: list[Any] = []

    def change(tx: fenced.Txn) -> None:
        entered.set()
        release.wait(WAIT_S)
        try:
            tx.get("claims", "a")
        except fenced.FencedError as e:
            seen.append(e)
            raise
        tx.put("claims", "a", "1")

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            task = asyncio.ensure_future(c.update(slug, change, fence=fenced.UNFENCED))
            while not entered.is_set():
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            while not seen:
                await asyncio.sleep(0.005)

    run(main)
    assert seen and seen[0].code == grpc.StatusCode.CANCELLED
    assert client.record(slug, "claims", "a") is None
