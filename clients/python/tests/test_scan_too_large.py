"""A foreign record over fenced's receive limit: named, and stepped past by
scan_section (the sync and the asyncio client)."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Iterable

import grpc
import pytest

import fenced
import fenced.aio
from conftest import WAIT_S, Fenced, Redis, swarm_key

BIG_KEY = "c-15-big"
# A 5 MiB record, as a writer outside fenced may store (fenced refuses values
# over --max-value-bytes; its answers hold at most --max-snapshot-bytes, 4 MiB).
HUGE = '{"r":1,"v":"' + "x" * (5 << 20) + '"}'


def _seed(client: fenced.Client, redis: Redis, slug: str) -> set[str]:
    """30 of fenced's records in claims, and the 5 MiB one HSET beside them.
    The hash is rewritten in one table (redistest's SettleHash) so that HSCAN
    answers each field once."""
    keys = {f"c-{i:02d}" for i in range(30)}
    client.fenced_batch(slug, [fenced.Put("claims", k, 0, '{"by":"x"}') for k in sorted(keys)], fence=fenced.UNFENCED)
    # The value is too long for one argv string: redis-cli -x reads it from stdin.
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(redis.port), "-x", "HSET", swarm_key(slug, "claims"), BIG_KEY],
                   input=HUGE.encode(), check=True, capture_output=True, timeout=30)
    redis.cli("EVAL", "local d = redis.call('DUMP', KEYS[1]) if d then redis.call('RESTORE', KEYS[1], 0, d, 'REPLACE') end return 1",
              "1", swarm_key(slug, "claims"))
    return keys


def _names_it(e: fenced.SnapshotTooLarge) -> bool:
    return (e.section, e.key, e.bytes) == ("claims", BIG_KEY, len(HUGE)) and 0 < e.max_bytes < e.bytes


def _once_each(pages: Iterable[fenced.Page], want: set[str]) -> None:
    seen: dict[str, int] = {}
    for p in pages:
        for k in p.records:
            seen[k] = seen.get(k, 0) + 1
    assert set(seen) == want and set(seen.values()) == {1}, seen


@pytest.mark.parametrize("page_size", [1, 1000])
def test_scan_section_steps_past_a_foreign_record_over_the_limit(
    client: fenced.Client, redis: Redis, slug: str, page_size: int
) -> None:
    """record() of it and a plain scan meeting it raise SnapshotTooLarge
    naming claims, the key and its stored size, the scan's with the page token
    past it: page_token= scans on from there; skip_too_large=True steps past
    it by itself, naming it once in the next page's ``skipped``. Every other
    record is read once. (Before: a bare ResourceExhausted naming nothing,
    and no way to start a scan past it.)"""
    want = _seed(client, redis, slug)
    with pytest.raises(fenced.SnapshotTooLarge) as r:
        client.record(slug, "claims", BIG_KEY)
    assert _names_it(r.value) and r.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert isinstance(r.value, fenced.ResourceExhausted)

    pages: list[fenced.Page] = []
    with pytest.raises(fenced.SnapshotTooLarge) as e:
        for p in client.scan_section(slug, "claims", page_size=page_size):
            pages.append(p)
    assert _names_it(e.value) and e.value.next_page_token
    pages += list(client.scan_section(slug, "claims", page_size=page_size, page_token=e.value.next_page_token))
    _once_each(pages, want)

    skipping = list(client.scan_section(slug, "claims", page_size=page_size, skip_too_large=True))
    _once_each(skipping, want)
    skipped = [s for p in skipping for s in p.skipped]
    assert len(skipped) == 1 and _names_it(skipped[0]), skipped
    assert skipping[0].section_revision == skipping[-1].section_revision > 0


def test_aio_scan_section_steps_past_a_foreign_record_over_the_limit(
    server: Fenced, client: fenced.Client, redis: Redis, slug: str
) -> None:
    want = _seed(client, redis, slug)

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            with pytest.raises(fenced.SnapshotTooLarge) as e:
                async for _ in c.scan_section(slug, "claims", page_size=7):
                    pass
            assert _names_it(e.value) and e.value.next_page_token
            pages = [p async for p in c.scan_section(slug, "claims", page_size=7, skip_too_large=True)]
            _once_each(pages, want)
            skipped = [s for p in pages for s in p.skipped]
            assert len(skipped) == 1 and _names_it(skipped[0]), skipped

    asyncio.run(asyncio.wait_for(main(), WAIT_S))
