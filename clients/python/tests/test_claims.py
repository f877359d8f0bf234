"""Claims (named leases within a swarm, docs/design/12-claims.md): the Python
client's acquire/renew/release/current with ``name=``, ClaimKeeper, and batches
fenced by a claim (``claim=``), against a live fenced."""

from __future__ import annotations

import asyncio

import pytest

import fenced
import fenced.aio
from conftest import WAIT_S, Fenced


def test_claim_keeper_holds_is_refused_to_another_and_releases(client: fenced.Client, slug: str) -> None:
    with client.keep_claim(slug, "wake/1", "worker-a", ttl_ms=60_000) as k:
        assert (k.name, k.owner, k.held()) == ("wake/1", "worker-a", True)
        cur = client.current(slug, name="wake/1")
        assert cur.live and cur.lease is not None and (cur.lease.owner, cur.lease.epoch) == ("worker-a", k.epoch)
        assert client.current(slug).lease is None  # a claim is not the swarm's lease
        with pytest.raises(fenced.LeaseHeld) as held:
            client.acquire(slug, "worker-b", ttl_ms=60_000, name="wake/1")
        assert held.value.holder is not None and (held.value.holder.owner, held.value.holder.epoch) == ("worker-a", k.epoch)
        assert k.claim() == fenced.ClaimFence("wake/1", "worker-a", k.epoch)
        with pytest.raises(TypeError):
            k.fence()  # a claim keeper has no lease fence: an unfenced batch by mistake is impossible
    assert k.lost.is_set() and not k.held() and not client.current(slug, name="wake/1").live
    later = client.acquire(slug, "worker-b", ttl_ms=60_000, name="wake/1")
    assert later.epoch > k.epoch


def test_claim_keeper_loses_a_taken_over_claim(client: fenced.Client, slug: str) -> None:
    k = client.keep_claim(slug, "task-3", "worker-a", ttl_ms=3000)
    try:
        client.release(slug, "worker-a", k.epoch, name="task-3")  # ended behind the keeper's back
        client.acquire(slug, "worker-b", ttl_ms=60_000, name="task-3")
        assert k.lost.wait(WAIT_S), "lost not set"
        assert isinstance(k.error, fenced.StaleLease) and not k.held()
    finally:
        k.close()  # a lost claim is not released
    assert client.current(slug, name="task-3").lease.owner == "worker-b"  # type: ignore[union-attr]


def test_a_batch_fenced_by_a_claim_commits_while_it_is_held_and_is_refused_after(client: fenced.Client, slug: str) -> None:
    grant = client.acquire(slug, "worker-a", ttl_ms=60_000, name="wake/7")
    fence = fenced.ClaimFence("wake/7", "worker-a", grant.epoch)
    rev = client.fenced_batch(slug, [fenced.Put("claims", "wake-7", 0, '"a"')], claim=fence).revision
    assert client.record(slug, "claims", "wake-7").revision == rev  # type: ignore[union-attr]

    def change(tx: fenced.Txn) -> None:
        tx.put("claims", "wake-7", '"a2"')

    client.update(slug, change, claim=fence)
    client.release(slug, "worker-a", grant.epoch, name="wake/7")
    client.acquire(slug, "worker-b", ttl_ms=60_000, name="wake/7")
    before = client.record(slug, "claims", "wake-7")
    with pytest.raises(fenced.StaleLease) as stale:
        client.fenced_batch(slug, [fenced.Put("claims", "wake-7", fenced.BLIND, '"late"')], claim=fence)
    assert stale.value.metadata.get("fence") == "claim" and stale.value.metadata.get("claim") == "wake/7"
    with pytest.raises(fenced.StaleLease):
        client.update(slug, lambda tx: tx.put("claims", "wake-7", '"a3"'), claim=fence)
    assert client.record(slug, "claims", "wake-7") == before  # nothing written
    with pytest.raises(TypeError):
        client.fenced_batch(slug, [], fence=fence)  # type: ignore[arg-type]


def test_aio_claim_keeper(server: Fenced, slug: str) -> None:
    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            async with c.keep_claim(slug, "wake/a", "worker-a", ttl_ms=60_000) as k:
                assert k.held() and k.claim() == fenced.ClaimFence("wake/a", "worker-a", k.epoch)
                cur = await c.current(slug, name="wake/a")
                assert cur.live and cur.lease is not None and cur.lease.owner == "worker-a"
            assert not (await c.current(slug, name="wake/a")).live

    asyncio.run(main())


def test_a_put_bound_to_a_claim_is_gone_with_it(client: fenced.Client, redis, slug: str) -> None:  # type: ignore[no-untyped-def]
    """bind_to_claim=True (docs/design/12-claims.md §12.4): the record is stored in
    the bound form, read back with its claim and epoch while the claim is live,
    and absent to reads and writes after its release; without claim= the batch is
    InvalidArgument naming writes[0].bind_to_claim."""
    from conftest import swarm_key

    grant = client.acquire(slug, "worker-a", ttl_ms=60_000, name="wake/9")
    fence = fenced.ClaimFence("wake/9", "worker-a", grant.epoch)
    rev = client.fenced_batch(slug, [fenced.Put("claims", "T-9", 0, '{"step":1}', bind_to_claim=True)], claim=fence).revision
    assert redis.cli("HGET", swarm_key(slug, "claims"), "T-9") == (
        f'{{"r":{rev},"claim":"wake/9","claim_epoch":{grant.epoch},"v":{{"step":1}}}}'
    )
    assert client.record(slug, "claims", "T-9") == fenced.Record(rev, '{"step":1}', "wake/9", grant.epoch)

    def change(tx: fenced.Txn) -> None:
        tx.put("claims", "T-10", '"b"', bind_to_claim=True)
        tx.put_json("claims", "T-12", {"b": 2}, bind_to_claim=True)

    rev2 = client.update(slug, change, claim=fence)
    snap = client.sections(slug, "claims")
    assert snap.sections["claims"]["T-10"] == fenced.Record(rev2, '"b"', "wake/9", grant.epoch)
    assert snap.sections["claims"]["T-12"] == fenced.Record(rev2, fenced.dumps({"b": 2}), "wake/9", grant.epoch)

    client.release(slug, "worker-a", grant.epoch, name="wake/9")
    assert client.record(slug, "claims", "T-9") is None
    assert client.sections(slug, "claims").sections["claims"] == {}
    assert [p.records for p in client.scan_section(slug, "claims")] == [{}]
    client.fenced_batch(slug, [fenced.Put("claims", "T-9", 0, '"next"')], fence=fenced.UNFENCED)  # absent: a put expecting 0 commits
    assert client.record(slug, "claims", "T-9").claim == ""  # type: ignore[union-attr]

    with pytest.raises(fenced.InvalidArgument) as bad:
        client.fenced_batch(slug, [fenced.Put("claims", "T-11", 0, "1", bind_to_claim=True)], fence=fenced.UNFENCED)
    assert [v.field for v in bad.value.violations] == ["writes[0].bind_to_claim"]
