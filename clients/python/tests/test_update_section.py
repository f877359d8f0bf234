"""Issue 24 §1: a section read whole is fenced by the records it held when
read (one CheckCount, or CheckRecords), the in-house ``fencing.write`` rule, against a live
fenced; ``phantom_proof=True`` keeps the section check, with its caveat."""

from __future__ import annotations

import json

import pytest

import fenced
from conftest import Redis, swarm_key
from test_update import BatchRecorder, kinds, recorded  # noqa: F401 (recorded: a fixture)


def bypass_put(redis: Redis, slug: str, section: str, key: str, value: str) -> int:
    """Write a record as the in-house Lua batch does, bypassing fenced: the
    swarm counter INCRed, the record's text HSET with it, no section revision
    raised, no log entry."""
    rev = int(redis.cli("INCR", swarm_key(slug, "revision")))
    redis.cli("HSET", swarm_key(slug, section), key, '{"r":%d,"v":%s}' % (rev, value))
    return rev


def seed_tasks(client: fenced.Client, slug: str) -> int:
    return client.fenced_batch(slug, [
        fenced.Put("claims", "T-1", 0, '{"status":"running"}'),
        fenced.Put("claims", "T-2", 0, '{"status":"running"}'),
    ], fence=fenced.UNFENCED).revision


@pytest.mark.parametrize("phantom_proof", [False, True])
def test_a_writer_that_bypasses_fenced_is_not_overwritten(client: fenced.Client, redis: Redis, slug: str, phantom_proof: bool) -> None:
    """Example (a): a change iterates claims; meanwhile a writer that bypasses
    fenced marks T-1 done. By default the update conflicts and its rerun sees
    T-1 done (before: [Put, CheckSection] committed, recording T-1 running).
    With phantom_proof the documented caveat holds: the section check misses it."""
    seed_tasks(client, slug)
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        claims = tx.section("claims", phantom_proof=phantom_proof)
        running = [k for k, v in claims.items() if json.loads(v)["status"] == "running"]
        if runs == 1:
            bypass_put(redis, slug, "claims", "T-1", '{"status":"done"}')
        tx.put_json("operations", "running", running)

    client.update(slug, change, fence=fenced.UNFENCED)
    got = client.record(slug, "operations", "running")
    assert got is not None
    if phantom_proof:
        assert runs == 1 and got.json() == ["T-1", "T-2"]  # the caveat: no section revision raised
    else:
        assert runs == 2 and got.json() == ["T-2"]


@pytest.mark.parametrize("phantom_proof", [False, True])
def test_an_insert_of_another_key_lets_the_update_commit(client: fenced.Client, slug: str, recorded, phantom_proof: bool) -> None:  # type: ignore[no-untyped-def]
    """Example (b): a writer inserts a new key into claims between the read
    and the commit. The default update commits at the first attempt, its batch
    one CheckCount of the records read; with phantom_proof it conflicts."""
    seeded = seed_tasks(client, slug)
    rec = BatchRecorder()
    c = recorded(rec)
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        n = len(tx.section("claims", phantom_proof=phantom_proof))
        if runs == 1:
            client.fenced_batch(slug, [fenced.Put("claims", "new-1", 0, '{"status":"running"}')], fence=fenced.UNFENCED)
        tx.put_json("operations", "count", n)

    c.update(slug, change, fence=fenced.UNFENCED)
    if phantom_proof:
        assert runs == 2
        assert kinds(rec.sent[0])[1] == ("WRITE_KIND_CHECK_SECTION", "claims", "", seeded)
        return
    assert runs == 1 and len(rec.sent) == 1
    assert kinds(rec.sent[0]) == [("WRITE_KIND_PUT", "operations", "count", 0), ("WRITE_KIND_CHECK_COUNT", "claims", "", seeded)]
    w = rec.sent[0].writes[1]
    assert (w.count, w.revision_sum, list(w.checks)) == (2, 2 * seeded % 10**14, [])
    assert client.record(slug, "operations", "count").json() == 2  # type: ignore[union-attr]


def test_every_record_of_a_section_read_whole_is_named_once(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """With a record read on its own at another revision than the snapshot's,
    the CheckRecords holds every record of the snapshot and every key read as
    absent, except those the batch writes and that record (checked by itself);
    the rerun that conflict forces reads all at one revision: one CheckCount,
    the key read as absent checked on its own."""
    r0 = client.fenced_batch(slug, [fenced.Put("claims", k, 0, '"%s"' % k) for k in ("a", "b", "c")], fence=fenced.UNFENCED).revision
    rec = BatchRecorder()
    c = recorded(rec)
    runs = 0
    r1 = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs, r1
        runs += 1
        tx.get("claims", "a")
        if runs == 1:
            r1 = client.fenced_batch(slug, [fenced.Put("claims", "a", r0, '"A2"')], fence=fenced.UNFENCED).revision
        claims = tx.section("claims")
        sorted(claims)
        assert "zz" not in claims
        claims["b"] = '"B2"'

    # Read from fenced (no view), so that the key and the section are two reads at two revisions.
    c.update(slug, change, fence=fenced.UNFENCED, view=False)
    assert runs == 2 and len(rec.sent) == 2

    def shape(i: int) -> list[tuple[str, str, int, list[tuple[str, int]]]]:
        return [
            (k, key, exp, [(p.key, p.expected) for p in w.checks] or ([("count", w.count), ("sum", w.revision_sum)] if w.count else []))
            for (k, _, key, exp), w in zip(kinds(rec.sent[i]), rec.sent[i].writes)
        ]

    assert shape(0) == [
        ("WRITE_KIND_PUT", "b", r0, []),
        ("WRITE_KIND_CHECK_RECORDS", "", 0, [("c", r0), ("zz", 0)]),
        ("WRITE_KIND_CHECK", "a", r0, []),
    ]
    assert shape(1) == [
        ("WRITE_KIND_PUT", "b", r0, []),
        ("WRITE_KIND_CHECK_COUNT", "", r1, [("count", 3), ("sum", (r1 + 2 * r0) % 10**14)]),
        ("WRITE_KIND_CHECK", "zz", 0, []),
    ]


def test_check_records_batch_conflict_and_refusals(client: fenced.Client, slug: str) -> None:
    """fenced.CheckRecords sent with fenced_batch: a mismatch is RevisionConflict
    naming the record and the write; a BLIND pair is InvalidArgument naming the
    field; the mapping is copied and read-only."""
    r0 = seed_tasks(client, slug)
    w = fenced.CheckRecords("claims", {"T-1": r0, "T-2": r0 - 1, "T-9": 0})
    with pytest.raises(TypeError):
        w.checks["T-1"] = 5  # type: ignore[index]
    with pytest.raises(fenced.RevisionConflict) as ei:
        client.fenced_batch(slug, [fenced.Put("intents", "i", 0, "1"), w], fence=fenced.UNFENCED)
    assert ei.value.conflicts == [fenced.Conflict("claims", "T-2", 1, r0 - 1, r0)] and ei.value.total == 1
    assert client.record(slug, "intents", "i") is None
    with pytest.raises(fenced.InvalidArgument) as bad:
        client.fenced_batch(slug, [fenced.CheckRecords("claims", {"T-1": r0, "T-2": fenced.BLIND})], fence=fenced.UNFENCED)
    assert [v.field for v in bad.value.violations] == ["writes[0].checks[1].expected"]
    assert client.fenced_batch(slug, [fenced.CheckRecords("claims", {"T-1": r0, "T-2": r0})], fence=fenced.UNFENCED).revision == r0
