"""fenced.CheckCount (docs/design/03-fenced-batch.md §3.4): a section read whole
checked by the snapshot's revision, its record count and their revisions' sum,
against a live fenced: the rule of a CheckRecords of every record read."""

from __future__ import annotations

import asyncio
import json

import pytest

import fenced
import fenced.aio
from conftest import Fenced, Redis, swarm_key
from test_update import BatchRecorder, kinds, recorded  # noqa: F401 (recorded: a fixture)
from test_update_section import bypass_put, seed_tasks


def test_count_check_answers_the_snapshot_or_none() -> None:
    r = 17960000000000
    recs = {"a": fenced.Record(r, "1"), "b": fenced.Record(7, "2"), "c": fenced.Record(1796079180861096, "3")}
    assert fenced.count_check("claims", r, recs) == fenced.CheckCount("claims", r, 3, (r + 7 + 1796079180861096) % 10**14)
    assert fenced.count_check("claims", r, {}) is None  # read empty: no check
    assert fenced.count_check("claims", r, {"a": fenced.Record(r + 1, "1")}) is None  # after the snapshot
    assert fenced.count_check("claims", 1796079180861096, {"a": fenced.Record(r, "1")}) is None  # era 2 after era 1
    assert fenced.count_check("claims", 0, {"a": fenced.Record(1, "1")}) is None


def test_check_count_batch_commits_and_conflicts(client: fenced.Client, redis: Redis, slug: str) -> None:
    """Sent with fenced_batch: unchanged (and after an insert of another key) it
    commits; after a bypassing writer changed T-1 it is RevisionConflict whose
    conflicts name the section (expected: the revision, actual: the count
    found), then T-1 at its new revision; nothing written."""
    r0 = seed_tasks(client, slug)
    snap = client.sections(slug, "claims")
    w = fenced.count_check("claims", snap.revision, snap.sections["claims"])
    assert w == fenced.CheckCount("claims", r0, 2, 2 * r0 % 10**14)
    client.fenced_batch(slug, [fenced.Put("intents", "a", 0, "1"), w], fence=fenced.UNFENCED)
    inserted = bypass_put(redis, slug, "claims", "T-9", '"inserted"')
    client.fenced_batch(slug, [fenced.Put("intents", "b", 0, "1"), w], fence=fenced.UNFENCED)
    later = bypass_put(redis, slug, "claims", "T-1", '{"status":"done"}')
    with pytest.raises(fenced.RevisionConflict) as ei:
        client.fenced_batch(slug, [fenced.Put("intents", "c", 0, "1"), w], fence=fenced.UNFENCED)
    # The count found (T-2 alone), then every record stored after r0: the
    # inserted T-9 and the changed T-1.
    head, *after = ei.value.conflicts
    assert head == fenced.Conflict("claims", "", 1, r0, 1) and ei.value.total == 1
    assert sorted(after, key=lambda c: c.key) == [fenced.Conflict("claims", "T-1", 1, r0, later), fenced.Conflict("claims", "T-9", 1, r0, inserted)]
    assert client.record(slug, "intents", "c") is None


def test_check_count_bad_input_names_the_field(client: fenced.Client, slug: str) -> None:
    for w, field in [
        (fenced.CheckCount("claims", 0, 1, 0), "writes[0].expected"),
        (fenced.CheckCount("claims", 5, 0, 0), "writes[0].count"),
        (fenced.CheckCount("claims", 5, 1, 10**14), "writes[0].revision_sum"),
    ]:
        with pytest.raises(fenced.InvalidArgument) as e:
            client.fenced_batch(slug, [w], fence=fenced.UNFENCED)
        assert [v.field for v in e.value.violations] == [field]


def test_update_falls_back_to_the_records_check(client: fenced.Client, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """A record stored after the snapshot's revision (a counter behind its
    records) is not counted: the update sends a CheckRecords of every record
    read, and commits."""
    r0 = seed_tasks(client, slug)
    ahead = r0 + 10_000
    redis.cli("HSET", swarm_key(slug, "claims"), "T-3", '{"r":%d,"v":"ahead"}' % ahead)
    rec = BatchRecorder()
    c = recorded(rec)
    c.update(slug, lambda tx: tx.put_json("operations", "n", len(tx.section("claims"))), fence=fenced.UNFENCED)
    assert kinds(rec.sent[0]) == [("WRITE_KIND_PUT", "operations", "n", 0), ("WRITE_KIND_CHECK_RECORDS", "claims", "", 0)]
    assert [(p.key, p.expected) for p in rec.sent[0].writes[1].checks] == [("T-1", r0), ("T-2", r0), ("T-3", ahead)]


def test_aio_update_of_a_section_read_whole(server: Fenced, client: fenced.Client, redis: Redis, slug: str) -> None:
    """fenced.aio's update fences a section read whole as the sync one: an
    insert of another key lets it commit at once; a bypassing writer's change
    to a record read makes it rerun and see the change."""
    seed_tasks(client, slug)

    async def main() -> list[int]:
        runs: list[int] = []
        async with fenced.aio.Client(server.addr) as c:
            for change_record in (False, True):
                n = 0

                def change(tx: fenced.Txn) -> None:
                    nonlocal n
                    n += 1
                    claims = tx.section("claims")
                    running = sorted(k for k, v in claims.items() if json.loads(v).get("status") == "running")
                    if n == 1:
                        if change_record:
                            bypass_put(redis, slug, "claims", "T-1", '{"status":"done"}')
                        else:
                            bypass_put(redis, slug, "claims", "T-8", '{"status":"queued"}')
                    tx.put_json("operations", "running", {"round": int(change_record), "running": running})

                await c.update(slug, change, fence=fenced.UNFENCED)
                runs.append(n)
        return runs

    assert asyncio.run(main()) == [1, 2]
    assert client.record(slug, "operations", "running").json() == {"round": 1, "running": ["T-2"]}  # type: ignore[union-attr]


def test_port_counts_a_section_read_whole_and_checks_keys_read_absent(client: fenced.Client, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """fenced.port: a section iterated whole and a key of it read as absent
    send one CheckCount and a Check of that key at 0; the key inserted by a
    bypassing writer between the read and the commit conflicts (the count lets
    inserts through: the key's own check does not), and the rerun sees it."""
    from fenced import port

    r0 = seed_tasks(client, slug)
    rec = BatchRecorder()
    q = port.Port(recorded(rec))
    runs = 0

    def change(doc: port.Document) -> bool:
        nonlocal runs
        runs += 1
        claims = doc["sections"]["claims"]
        n = len(list(claims))
        seen = "T-9" in claims
        if runs == 1:
            bypass_put(redis, slug, "claims", "T-9", '{"status":"new"}')
        doc["sections"]["operations"]["summary"] = {"n": n, "t9": seen}
        return seen

    assert q.write(slug, change) is True and runs == 2
    first = rec.sent[0]
    assert kinds(first) == [
        ("WRITE_KIND_PUT", "operations", "summary", 0),
        ("WRITE_KIND_CHECK_COUNT", "claims", "", r0),
        ("WRITE_KIND_CHECK", "claims", "T-9", 0),
    ]
    assert (first.writes[1].count, first.writes[1].revision_sum) == (2, 2 * r0 % 10**14)
