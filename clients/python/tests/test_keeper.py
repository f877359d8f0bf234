"""LeaseKeeper against a live fenced: renewals, loss, waiting, and a paused controller."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import fenced
from conftest import WAIT_S, Fenced, Redis, swarm_key, wait_until


def test_keeper_renews_and_releases(client: fenced.Client, slug: str) -> None:
    # Renewals come every second, a third of the TTL, each given 1 s: a slow
    # machine has 2 s of slack. (With a 1.5 s TTL, 1 s of slack, the lease
    # was lost once in 160 runs beside the Go suite on 2 cores.)
    with client.keep(slug, "keeper", ttl_ms=3000) as k:
        first = client.current(slug).lease
        assert first is not None and first.epoch == k.epoch and k.held()
        # Renewed past several of its TTLs: the lease's end keeps moving on.
        wait_until(lambda: client.current(slug).lease.expires_at_ms > first.expires_at_ms + 1900, "two renewals")  # type: ignore[union-attr]
        assert k.held() and not k.lost.is_set() and k.error is None
        rev = client.fenced_batch(slug, [fenced.Put("claims", "k", 0, "1")], fence=k.fence()).revision
        assert rev > 0
    assert not client.current(slug).live and k.lost.is_set() and not k.held()
    k.close()  # idempotent


def test_keeper_loses_a_taken_over_lease(client: fenced.Client, slug: str) -> None:
    # 3 s: a renewal has 1 s to be refused StaleLease before the keeper
    # would give the lease up on timeouts instead (200 ms with 600).
    k = client.keep(slug, "keeper", ttl_ms=3000)
    try:
        client.release(slug, "keeper", k.epoch)  # someone ends it behind the keeper's back
        client.acquire(slug, "usurper", ttl_ms=60_000)
        assert k.lost.wait(WAIT_S), "lost not set"
        assert isinstance(k.error, fenced.StaleLease) and not k.held()
        with pytest.raises(fenced.StaleLease):
            client.fenced_batch(slug, [fenced.Put("claims", "k", 0, "1")], fence=k.fence())
    finally:
        k.close()  # a lost lease is not released
    assert client.current(slug).lease.owner == "usurper"  # type: ignore[union-attr]


def test_keep_waits_while_another_owner_holds_the_lease(client: fenced.Client, slug: str) -> None:
    other = client.acquire(slug, "other", ttl_ms=300)
    with client.keep(slug, "waiter", ttl_ms=10_000) as k:
        assert k.epoch > other.epoch and k.held()
    client.acquire(slug, "holder", ttl_ms=60_000)
    with pytest.raises(fenced.LeaseHeld) as e:
        client.keep(slug, "impatient", ttl_ms=1000, wait=0.2)
    assert e.value.holder is not None and e.value.holder.owner == "holder"


def test_paused_controller_is_refused_and_learns_it_lost_the_lease(server: Fenced, client: fenced.Client, slug: str) -> None:
    """SIGSTOP the process holding the lease past its TTL, let another take
    over, SIGCONT: its next write is refused and its keeper's lost is set."""
    script = pathlib.Path(__file__).with_name("paused_controller.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), server.addr, slug, "paused", "1000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        epoch = json.loads(proc.stdout.readline())["epoch"]
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: not client.current(slug).live, "the paused controller's lease to expire")
        usurper = client.acquire(slug, "usurper", ttl_ms=60_000)
        assert usurper.epoch > epoch
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("write\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        assert got == {"held": False, "write": "StaleLease", "lost": True, "error": "StaleLease"}
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert client.record(slug, "claims", "paused") is None
    assert client.current(slug).lease.owner == "usurper"  # type: ignore[union-attr]


def test_keep_waits_at_most_the_client_s_timeout_by_default(server: Fenced, client: fenced.Client, slug: str) -> None:
    """keep() without wait gives up within the Client's timeout, raising
    LeaseHeld that says who holds the lease and how long it actually waited:
    it gives up as soon as its next try would come past the timeout (here
    after one pause of a TTL, ~5 s of the 10), and said "after waiting 10s"
    before. (Before that: wait=None waited for ever; the hang bound below
    caught it.)"""
    client.acquire(slug, "holder", ttl_ms=120_000)
    got: list[BaseException] = []
    took: list[float] = []

    def keep() -> None:
        with fenced.Client(server.addr, timeout=10.0) as c:  # a hang bound, so a busy box cannot make the acquire itself time out
            start = time.monotonic()
            try:
                c.keep(slug, "waiter", ttl_ms=5000).close()
            except BaseException as e:  # noqa: BLE001
                got.append(e)
            took.append(time.monotonic() - start)

    t = threading.Thread(target=keep, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive(), "keep() still waiting"
    assert len(got) == 1 and isinstance(got[0], fenced.LeaseHeld), got
    m = re.search(r"still held by 'holder' after waiting ([0-9.]+)s \(of at most 10s", str(got[0]))
    assert m, str(got[0])
    assert float(m.group(1)) <= took[0] + 0.05 and float(m.group(1)) < 10, (m.group(1), took)
    assert got[0].holder is not None and got[0].holder.owner == "holder"


def test_keeper_logs_a_lost_lease_and_failing_renewals(server: Fenced, client: fenced.Client, slug: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The keeper logs through logging ("fenced.keeper"): the grant at INFO,
    a lost lease at ERROR naming the swarm, owner and epoch. (Before: nothing
    was logged; only keeper.lost said so.)"""
    caplog.set_level(logging.INFO, logger="fenced")
    k = client.keep(slug, "logged", ttl_ms=3000)
    try:
        client.release(slug, "logged", k.epoch)
        client.acquire(slug, "usurper", ttl_ms=60_000)
        assert k.lost.wait(WAIT_S)
    finally:
        k.close()
    by = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("fenced")]
    assert ("fenced.keeper", "INFO", f"keep {slug}: lease held by logged at epoch {k.epoch} (ttl 3000 ms)") in by
    lost = [m for n, lvl, m in by if lvl == "ERROR"]
    assert len(lost) == 1 and lost[0].startswith(f"keep {slug}: lease of logged at epoch {k.epoch} lost: "), by


def _redis_now_ms(redis: Redis) -> int:
    secs, micros = redis.cli("TIME").split()
    return int(secs) * 1000 + int(micros) // 1000


def _lapse_lease(redis: Redis, client: fenced.Client, slug: str, owner: str, epoch: int) -> None:
    """The lease lapses as if its keeper had stalled past it: its record's
    expiry moved into the past behind the keeper's back."""
    rev = client.current(slug).revision
    redis.cli_last("HSET", swarm_key(slug, "meta"), "lease",
                   last='{"r":%d,"v":{"owner":"%s","epoch":%d,"expires_at":%d}}' % (rev, owner, epoch, _redis_now_ms(redis) - 1))


def test_keeper_hears_a_take_over_on_its_watch_stream(client: fenced.Client, redis: Redis, slug: str) -> None:
    """A lease that lapsed while its keeper stalled, then granted to another
    owner: lost is set at once, not at the next renewal a third of its
    10-minute TTL later, and error names the new holder. (Before: only the
    renewal, 200 s away, would have found out.)"""
    with client.keep(slug, "ctl-a", ttl_ms=600_000) as k:
        _lapse_lease(redis, client, slug, "ctl-a", k.epoch)
        usurper = client.acquire(slug, "ctl-b", ttl_ms=60_000)
        assert k.lost.wait(WAIT_S), "lost not set after the take-over"
        assert isinstance(k.error, fenced.StaleLease) and not k.held()
        assert k.error.holder == fenced.Lease("ctl-b", usurper.epoch, usurper.expires_at_ms)
        assert client.current(slug).lease.owner == "ctl-b"  # type: ignore[union-attr]  # not released by close


def test_keeper_hears_its_own_name_granted_again(client: fenced.Client, redis: Redis, slug: str) -> None:
    """The same owner's name at a later epoch (another process of it took
    the lease after this one lapsed) is a take-over too."""
    with client.keep(slug, "ctl-a", ttl_ms=600_000) as k:
        _lapse_lease(redis, client, slug, "ctl-a", k.epoch)
        again = client.acquire(slug, "ctl-a", ttl_ms=60_000)
        assert again.epoch > k.epoch
        assert k.lost.wait(WAIT_S), "lost not set"
        assert k.error.holder.epoch == again.epoch  # type: ignore[union-attr]


def test_claim_keeper_hears_a_take_over_on_its_watch_stream(client: fenced.Client, redis: Redis, slug: str) -> None:
    with client.keep_claim(slug, "task-7", "worker-a", ttl_ms=600_000) as k:
        past = _redis_now_ms(redis) - 1
        rev = client.current(slug).revision
        redis.cli_last("HSET", swarm_key(slug, "claim-grants"), "task-7",
                       last='{"r":%d,"v":{"owner":"worker-a","epoch":%d,"expires_at":%d}}' % (rev, k.epoch, past))
        redis.cli("ZADD", swarm_key(slug, "claim-expiry"), str(past), "task-7")
        client.acquire(slug, "worker-b", ttl_ms=60_000, name="task-7")
        assert k.lost.wait(WAIT_S), "lost not set after the claim was granted to another worker"
        assert isinstance(k.error, fenced.StaleLease) and k.error.holder.owner == "worker-b"  # type: ignore[union-attr]


def test_aio_keeper_hears_a_take_over_on_its_watch_stream(server: Fenced, client: fenced.Client, redis: Redis, slug: str) -> None:
    import asyncio

    import fenced.aio

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c, c.keep(slug, "ctl-a", ttl_ms=600_000) as k:
            _lapse_lease(redis, client, slug, "ctl-a", k.epoch)
            usurper = await c.acquire(slug, "ctl-b", ttl_ms=60_000)
            await asyncio.wait_for(k.lost.wait(), WAIT_S)
            assert isinstance(k.error, fenced.StaleLease) and k.error.holder.owner == "ctl-b"  # type: ignore[union-attr]
            assert k.error.holder.epoch == usurper.epoch  # type: ignore[union-attr]

    asyncio.run(main())
