"""fenced.port, the drop-in for the in-house port and fencing.write: the
in-house suite's list, run against a live fenced and redis-server."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from typing import Any, Optional

import grpc
import pytest

import fenced
import fenced.aio
from conftest import KEY_PREFIX, Fenced, Redis, swarm_key, wait_until
from fenced import port
from fenced.v1 import records_pb2
from test_update import BatchRecorder, kinds, log_entries, recorded  # noqa: F401 (recorded: a fixture)

BUCKET = f"{KEY_PREFIX}:swarm:state:fencing:current"


@pytest.fixture
def p(client: fenced.Client) -> port.Port:
    return port.Port(client)


def inhouse_put(redis: Redis, slug: str, section: str, key: str, value: Any) -> int:
    """The in-house writer that bypasses fenced, on the records layout: the
    swarm counter INCRed, the record stored as its text (spaces after ':' and
    ','), no section revision, no log entry. Answers the record's revision."""
    rev = int(redis.cli("INCR", swarm_key(slug, "revision")))
    redis.cli_last("HSET", swarm_key(slug, section), key, last='{"r": %d, "v": %s}' % (rev, json.dumps(value)))
    return rev


def seed_document(redis: Redis, slug: str, doc: dict[str, Any]) -> str:
    """A swarm stored the way the in-house writer stores it: one JSON document
    (json.dumps' default spacing) in field <slug> of the bucket. Answers its text."""
    text = json.dumps(doc)
    redis.cli("HSET", BUCKET, slug, text)
    return text


def document(redis: Redis, slug: str) -> dict[str, Any]:
    return json.loads(redis.cli("HGET", BUCKET, slug))


def swarm_keys(redis: Redis, slug: str) -> list[str]:
    return sorted(k for k in redis.cli("--scan", "--pattern", f"*{slug}*").splitlines() if k)


def nonempty(sections: dict[str, Any]) -> dict[str, Any]:
    """The sections holding records (a read answers every configured section)."""
    return {n: recs for n, recs in sections.items() if recs}


def sent_kinds(rec: BatchRecorder) -> list[list[tuple[str, str, str, int]]]:
    return [kinds(r) for r in rec.sent]


# layout, sections, record, fenced_batch and the errors.


def test_layout_answers_the_in_house_names(p: port.Port, redis: Redis, slug: str) -> None:
    assert p.layout(slug) == ""
    p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")])
    assert p.layout(slug) == "records"
    seed_document(redis, slug + "-doc", {"revision": 3, "sections": {"claims": {"T-1": {"by": "hive-b"}}}})
    assert p.layout(slug + "-doc") == "document"


def test_sections_and_record_answer_decoded_values(p: port.Port, slug: str) -> None:
    values = {"a": {"by": "hive-a", "ids": []}, "b": [1, 2.5, None], "c": "text", "d": 12345678901234567890}
    rev = p.fenced_batch(
        slug,
        [fenced.Put("claims", k, 0, fenced.dumps(v)) for k, v in values.items()]
        + [fenced.Put("archive", "old", 0, '{"done": true}'), fenced.Put("meta", "legacy_owner", 0, '"hive-a"')],
    )
    assert isinstance(rev, int) and rev > 0
    every = p.sections(slug)
    # No names: every configured section but archive and meta (the document's "sections").
    assert every["claims"] == values and "archive" not in every and "meta" not in every
    assert "intents" in every and all(v == {} for n, v in every.items() if n != "claims")
    assert every.revision == rev and every.revisions["claims"] == {k: rev for k in values}
    named = p.sections(slug, "archive", "intents", "meta")
    assert named["archive"] == {"old": {"done": True}} and named["intents"] == {}
    assert named["meta"]["legacy_owner"] == "hive-a"
    got = p.record(slug, "claims", "a")
    assert got == port.RecordValue(rev, values["a"]) and got is not None
    revision, value = got
    assert (revision, value) == (rev, values["a"])
    assert p.record(slug, "claims", "absent") is None


def test_python_json_with_nan_and_infinity_reads_and_writes_as_json_loads_does(
    client: fenced.Client, p: port.Port, redis: Redis, slug: str
) -> None:
    """Python's json.dumps writes NaN, Infinity and -Infinity by default: an
    in-house writer's record holding them is read (record, sections, a write
    reading its section whole, iterating the document) as json.loads reads
    it, its bytes served as stored, on both layouts; a change to it writes
    them back as json.dumps does; fenced.dumps refuses them unless asked."""
    value = {"score": float("nan"), "best": float("inf"), "worst": float("-inf")}
    text = json.dumps(value)  # {"score": NaN, "best": Infinity, "worst": -Infinity}

    def same(got: Any) -> bool:
        return math.isnan(got["score"]) and got["best"] == math.inf and got["worst"] == -math.inf

    seed_document(redis, slug + "-doc", {"revision": 3, "sections": {"claims": {"T-1": value, "T-2": {"by": "hive-a"}}}})
    rev = inhouse_put(redis, slug, "claims", "T-1", value)
    inhouse_put(redis, slug, "claims", "T-2", {"by": "hive-a"})
    for s in (slug, slug + "-doc"):
        assert client.record(s, "claims", "T-1").value == text  # type: ignore[union-attr]
        got = p.record(s, "claims", "T-1")
        assert got is not None and same(got.value)
        assert same(p.sections(s, "claims")["claims"]["T-1"])
        assert same(p.sections(s)["claims"]["T-1"])

        def whole(doc: port.Document) -> list[str]:
            names = list(doc["sections"])  # every section, at one instant
            claims = doc["sections"]["claims"]
            assert same(claims["T-1"]) and sorted(claims) == ["T-1", "T-2"]
            claims["T-2"] = {"by": "hive-b", "n": len(names)}
            return names

        assert port.Port(client).write(s, whole) == ["claims"]
        assert p.record(s, "claims", "T-2").value == {"by": "hive-b", "n": 1}  # type: ignore[union-attr]

        def touch(doc: port.Document) -> None:
            doc["sections"]["claims"]["T-1"]["n"] = 1

        p.write(s, touch)
        assert client.record(s, "claims", "T-1").value == '{"score":NaN,"best":Infinity,"worst":-Infinity,"n":1}'  # type: ignore[union-attr]
    assert p.record(slug, "claims", "T-1").revision > rev  # type: ignore[union-attr]

    with pytest.raises(ValueError):
        fenced.dumps(value)
    assert fenced.dumps([float("nan")], allow_nan=True) == "[NaN]"
    client.fenced_batch(slug, [fenced.Put("claims", "T-3", 0, "[NaN, -Infinity]")], fence=fenced.UNFENCED)
    assert client.record(slug, "claims", "T-3").value == "[NaN, -Infinity]"  # type: ignore[union-attr]
    with pytest.raises(fenced.InvalidArgument) as bad:
        client.fenced_batch(slug, [fenced.Put("claims", "T-4", 0, "[nan]")], fence=fenced.UNFENCED)
    assert 'byte 1 starts "nan"' in bad.value.violations[0].description


def test_five_megabytes_of_executions_read_whole_through_every_path(
    server: Fenced, client: fenced.Client, p: port.Port, redis: Redis, slug: str
) -> None:
    """Five 1 MB executions records written by an in-house writer (over the
    server's 4 MiB for one answer): port.sections of the section and of
    every section, a port.write reading it whole, iterating the document, and
    both clients' sections read all five byte for byte, as one snapshot."""
    values = {f"exe-{i}": {"name": f"agent-{i}", "generation": i, "log": "x" * (1 << 20)} for i in range(5)}
    for k, v in values.items():
        inhouse_put(redis, slug, "executions", k, v)
    rev = inhouse_put(redis, slug, "claims", "T-1", {"by": "hive-a"})
    with pytest.raises(fenced.SnapshotTooLarge):  # one answer cannot hold it: what the clients read past
        client._call("records", "Sections", records_pb2.SectionsRequest(slug=slug, names=["executions"]), None)

    assert p.sections(slug, "executions")["executions"] == values
    every = p.sections(slug)
    assert every["executions"] == values and every["claims"] == {"T-1": {"by": "hive-a"}} and every.revision == rev
    snap = client.sections(slug, "executions", "claims")
    assert {k: r.value for k, r in snap.sections["executions"].items()} == {k: json.dumps(v) for k, v in values.items()}
    assert snap.revision == rev and set(snap.section_revisions) == {"executions", "claims"}

    def tally(doc: port.Document) -> list[str]:
        names = list(doc["sections"])  # iterating the document: every section at one instant
        execs = doc["sections"]["executions"]
        doc["sections"]["claims"]["count"] = {"n": len(execs), "gens": sorted(v["generation"] for v in execs.values())}
        return names

    assert p.write(slug, tally) == ["claims", "executions"]
    assert p.record(slug, "claims", "count").value == {"n": 5, "gens": [0, 1, 2, 3, 4]}  # type: ignore[union-attr]

    async def aio_read() -> fenced.Snapshot:
        async with fenced.aio.Client(server.addr) as c:
            return await c.sections(slug, "executions")

    assert {k: r.value for k, r in asyncio.run(aio_read()).sections["executions"].items()} == {k: json.dumps(v) for k, v in values.items()}


def test_errors_carry_the_in_house_texts_and_types(client: fenced.Client, p: port.Port, slug: str) -> None:
    lease = client.acquire(slug, "tick-a", ttl_ms=10_000)
    client.release(slug, "tick-a", lease.epoch)
    with pytest.raises(port.StaleLease) as stale:
        p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=lease)
    e: Any = stale.value
    assert str(e) == "the controller lease is stale" == port.STALE_LEASE_TEXT
    assert isinstance(e, fenced.StaleLease) and e.reason == "LEASE_STALE" and isinstance(e.__cause__, fenced.StaleLease)
    assert e.code.name == "FAILED_PRECONDITION"
    with pytest.raises(fenced.StaleLease):  # code catching fenced's class catches the port's
        p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=("tick-a", lease.epoch))

    rev = p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")])
    with pytest.raises(port.RevisionConflict) as conflict:
        p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "2")])
    c: Any = conflict.value
    assert str(c) == "the swarm fencing state kept changing; nothing was committed" == port.KEPT_CHANGING_TEXT
    assert isinstance(c, fenced.RevisionConflict) and c.total == 1
    assert [(x.section, x.key, x.expected, x.actual) for x in c.conflicts] == [("claims", "a", 0, rev)]
    # Built by the caller, as the in-house code raised them.
    assert str(port.StaleLease()) == port.STALE_LEASE_TEXT and str(port.RevisionConflict()) == port.KEPT_CHANGING_TEXT
    assert issubclass(port.KeptChanging, (port.RevisionConflict, fenced.KeptChanging))


# The in-house suite's list.


def test_a_stale_controller_racing_a_takeover_is_refused_at_the_write(
    client: fenced.Client, p: port.Port, slug: str
) -> None:
    a = client.acquire(slug, "tick-a", ttl_ms=100)  # the shortest TTL the server grants
    runs = 0
    b: Optional[fenced.Lease] = None

    def change_a(doc: port.Document) -> str:
        nonlocal runs, b
        runs += 1
        doc["sections"]["claims"]["T-1"] = {"by": "tick-a"}
        # While A decides, its lease ends and B takes over.
        wait_until(lambda: not client.current(slug).live, "tick-a's lease to end")
        b = client.acquire(slug, "tick-b", ttl_ms=60_000)
        return "a"

    with pytest.raises(port.StaleLease) as e:
        p.write(slug, change_a, a)
    assert str(e.value) == "the controller lease is stale" and runs == 1  # no rerun on a stale lease
    assert e.value.holder is not None and e.value.holder.owner == "tick-b"
    assert p.record(slug, "claims", "T-1") is None  # A wrote nothing
    assert b is not None and b.epoch > a.epoch

    def change_b(doc: port.Document) -> str:
        doc["sections"]["claims"]["T-1"] = {"by": "tick-b"}
        return "b"

    assert p.write(slug, change_b, b) == "b"
    assert p.record(slug, "claims", "T-1").value == {"by": "tick-b"}  # type: ignore[union-attr]


def test_all_or_nothing(client: fenced.Client, p: port.Port, redis: Redis, slug: str) -> None:
    rev = p.fenced_batch(slug, [fenced.Put("claims", "c", 0, '"c"')])
    log = len(log_entries(redis, slug))
    with pytest.raises(port.RevisionConflict) as e:
        p.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1"), fenced.Put("intents", "b", 0, "2"),
                              fenced.Check("claims", "c", rev + 1)])
    assert [(x.write, x.key) for x in e.value.conflicts] == [(2, "c")]
    assert p.record(slug, "claims", "a") is None and p.record(slug, "intents", "b") is None
    assert len(log_entries(redis, slug)) == log  # nothing committed

    # write(): the attempt whose read changed writes nothing; its rerun writes all.
    runs = 0

    def change(doc: port.Document) -> None:
        nonlocal runs
        runs += 1
        seen = doc["sections"]["claims"]["c"]
        doc["sections"]["claims"]["a"] = {"saw": seen}
        doc["sections"]["intents"]["b"] = {"saw": seen}
        if runs == 1:
            client.fenced_batch(slug, [fenced.Put("claims", "c", fenced.BLIND, '"c2"')], fence=fenced.UNFENCED)

    p.write(slug, change)
    assert runs == 2
    assert p.record(slug, "claims", "a").value == p.record(slug, "intents", "b").value == {"saw": "c2"}  # type: ignore[union-attr]
    assert len(log_entries(redis, slug)) == log + 2  # the meddler's commit, then the rerun's


def test_the_swarm_log_stays_capped(p: port.Port, redis: Redis, slug: str) -> None:
    """docs/design/02-redis-layout.md §2.1: the log keeps at least the last 1000
    entries (XADD MAXLEN ~ 1000: at most one stream node, 100 entries, more)."""
    last = 0
    for i in range(1150):
        def change(doc: port.Document, i: int = i) -> int:
            doc["sections"]["archive"][f"k{i:04d}"] = {"n": i}  # a BLIND put: no read
            return i

        assert p.write(slug, change) == i
    last = p.sections(slug, "archive").revisions["archive"]["k1149"]
    n = int(redis.cli("XLEN", swarm_key(slug, "log")))
    assert 1000 <= n <= 1100, n
    entries = log_entries(redis, slug)
    assert int(entries[-1]["revision"]) == last


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _slot(key: str) -> int:
    """The Redis Cluster slot of a key: of its hash tag when it has one."""
    s = key.find("{")
    if s >= 0:
        e = key.find("}", s + 1)
        if e > s + 1:
            key = key[s + 1 : e]
    return _crc16(key.encode()) % 16384


def test_every_key_of_a_swarm_is_in_one_slot(client: fenced.Client, p: port.Port, redis: Redis, slug: str) -> None:
    assert _slot("{user1000}.following") == _slot("{user1000}.followers") == _crc16(b"user1000") % 16384
    lease = client.acquire(slug, "tick-a", ttl_ms=60_000)

    def change(doc: port.Document) -> None:
        doc["sections"]["claims"]["T-1"] = {"by": "tick-a"}
        doc["sections"]["archive"]["old"] = {"done": True}
        doc["sections"]["executions"]["exe-1"] = {"name": "engineer-1", "generation": 1}
        doc["meta"]["legacy_owner"] = "tick-a"
        len(doc["sections"]["intents"])

    p.write(slug, change, lease)  # with a request id
    keys = swarm_keys(redis, slug)
    for name in ("meta", "claims", "archive", "executions", "by-name", "revision", "log"):
        assert swarm_key(slug, name) in keys, (name, keys)
    assert swarm_key(slug, "request-ids") in keys, keys
    for k in keys:
        m = re.search(r"\{([^}]*)\}", k)
        assert m and m.group(1) == slug, k  # the hash tag is the slug
        assert _slot(k) == _slot("{" + slug + "}"), k


def _fixture_doc(now_ms: int) -> dict[str, Any]:
    return {
        "revision": 41,
        "meta": {"lease": {"owner": "hive-a", "epoch": 7, "expires_at": now_ms + 600_000}, "legacy_owner": "hive-a",
                 "epoch": 7, "leader_changes": 3, "grants_disabled": False},
        "sections": {
            "claims": {"T-1": {"by": "hive-a", "state": "running"}, "T-2": {"by": "hive-b", "state": "done"}},
            "executions": {"exe-1": {"name": "engineer-1", "generation": 2, "ids": []},
                           "exe-2": {"name": "engineer-1", "generation": 3, "ids": [1, 2]}},
            "intents": {"i-1": {"what": "ünïcödé 🐝", "n": 12345678901234567890, "f": 0.1, "m": {}}},
            "archive": {"old-1": {"done": "2025"}},
        },
    }


def test_migration_preserves_what_a_read_returns(client: fenced.Client, p: port.Port, redis: Redis, slug: str) -> None:
    doc = _fixture_doc(client.current("any").now_ms)
    seed_document(redis, slug, doc)
    assert p.layout(slug) == "document"

    def reads() -> tuple[Any, ...]:
        every = p.sections(slug)
        named = p.sections(slug, "claims", "archive", "executions", "intents")
        records = {(s, k): p.record(slug, s, k) for s, recs in doc["sections"].items() for k in recs}
        meta = {k: p.record(slug, "meta", k) for k in doc["meta"]}
        raw = {(s, k): client.record(slug, s, k).value for s, k in records}  # type: ignore[union-attr]
        return dict(every), dict(named), {r: v.value for r, v in records.items()}, {k: v.value for k, v in meta.items()}, raw  # type: ignore[union-attr]

    before = reads()
    assert nonempty(before[0]) == {n: s for n, s in doc["sections"].items() if n != "archive"}
    assert before[1] == doc["sections"] and before[3] == doc["meta"]

    plan = client.migrate(slug, writers_upgraded=True, dry_run=True)
    assert plan.records == 6 + 5 + 1 and plan.revision == 0 and p.layout(slug) == "document"  # 6 records, 5 meta, layout
    assert {s.name: s.records for s in plan.sections} == {"claims": 2, "executions": 2, "intents": 1, "archive": 1, "meta": 6}
    moved = client.migrate(slug, writers_upgraded=True)
    assert moved.records == plan.records and moved.revision > 0 and not moved.already_moved
    assert p.layout(slug) == "records"
    after = reads()
    assert after == before
    # The move adds fenced's own bookkeeping to meta, nothing else (the
    # section revisions live in a hash of their own, not in meta).
    assert set(p.sections(slug, "meta")["meta"]) - set(doc["meta"]) == {"layout"}
    again = client.migrate(slug, writers_upgraded=True)
    assert again.already_moved and again.records == 0 and again.revision == 0


def test_a_write_in_flight_across_the_move_lands_on_the_records(
    client: fenced.Client, p: port.Port, redis: Redis, slug: str
) -> None:
    seed_document(redis, slug, _fixture_doc(client.current("any").now_ms))
    runs = 0
    moved: Optional[fenced.MigrateResult] = None

    def change(doc: port.Document) -> int:
        nonlocal runs, moved
        runs += 1
        t1 = doc["sections"]["claims"]["T-1"]
        if runs == 1:  # the operator moves the swarm while this change decides
            moved = client.migrate(slug, writers_upgraded=True)
        t1["state"] = "done"
        doc["sections"]["archive"]["T-1"] = {"archived": runs}
        return runs

    assert p.write(slug, change) == 2  # the first attempt read the document: it reran on the records
    assert moved is not None and moved.revision > 0 and p.layout(slug) == "records"
    t1 = p.record(slug, "claims", "T-1")
    assert t1 is not None and t1.value == {"by": "hive-a", "state": "done"} and t1.revision > moved.revision
    assert p.record(slug, "archive", "T-1").value == {"archived": 2}  # type: ignore[union-attr]
    left = document(redis, slug)  # the document was not written after the move
    assert left["moved_to"] == "records" and left["sections"]["claims"]["T-1"]["state"] == "running"
    assert "T-1" not in left["sections"]["archive"]


def test_the_migration_needs_the_rollout_flag(client: fenced.Client, p: port.Port, redis: Redis, slug: str) -> None:
    text = seed_document(redis, slug, _fixture_doc(client.current("any").now_ms))
    with pytest.raises(fenced.InvalidArgument) as e:
        client.migrate(slug)
    assert [v.field for v in e.value.violations] == ["writers_upgraded"]
    assert "upgrade every live fencing reader and writer" in e.value.violations[0].description
    with pytest.raises(fenced.InvalidArgument):
        client.migrate(slug, writers_upgraded=False, dry_run=True)
    assert p.layout(slug) == "document" and redis.cli("HGET", BUCKET, slug) == text  # nothing moved
    assert swarm_keys(redis, slug) == []


def test_the_whole_document_port(client: fenced.Client, p: port.Port, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    seed_document(redis, slug, {"revision": 5, "sections": {
        "claims": {"T-1": {"state": "done"}, "T-2": {"state": "running"}, "T-3": {"state": "done"}},
        "archive": {"old-1": {"done": "2025"}}}})
    lease = client.acquire(slug, "tick-a", ttl_ms=60_000)  # its record lives in the document's meta
    rec = BatchRecorder()
    q = port.Port(recorded(rec))

    def tick(doc: port.Document) -> list[str]:
        assert doc["meta"]["lease"]["owner"] == "tick-a"
        claims = doc["sections"]["claims"]
        done = [k for k, v in claims.items() if v["state"] == "done"]
        for k in done:
            doc["sections"]["archive"][k] = claims.pop(k)
        claims["T-2"]["seen"] = len(done)  # in place
        return done

    assert q.write(slug, tick, lease) == ["T-1", "T-3"]
    assert p.layout(slug) == "document"
    stored = document(redis, slug)
    assert stored["sections"]["claims"] == {"T-2": {"state": "running", "seen": 2}}
    assert stored["sections"]["archive"] == {"old-1": {"done": "2025"}, "T-1": {"state": "done"}, "T-3": {"state": "done"}}
    assert stored["meta"]["lease"]["owner"] == "tick-a" and stored["meta"]["lease"]["epoch"] == lease.epoch
    assert int(redis.cli("LLEN", f"{KEY_PREFIX}:swarm:state:fencing:history:{slug}")) >= 1
    [batch] = sent_kinds(rec)
    assert [(k, s, key) for k, s, key, _ in batch] == [
        ("WRITE_KIND_DELETE", "claims", "T-1"), ("WRITE_KIND_PUT", "archive", "T-1"),
        ("WRITE_KIND_DELETE", "claims", "T-3"), ("WRITE_KIND_PUT", "archive", "T-3"),
        ("WRITE_KIND_PUT", "claims", "T-2"),
    ]  # the lease read is the fence's: not checked


def test_a_scanned_section_is_checked_whole(client: fenced.Client, p: port.Port, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """Issue 24 §1 (a), through the port: a writer that bypasses fenced marks
    T-1 done while a change counts the running claims; the change's batch is
    refused and reruns, so T-1 is not recorded as still running. Inserts of
    other keys meanwhile do not refuse it."""
    rev = p.fenced_batch(slug, [fenced.Put("claims", f"T-{i}", 0, '{"state":"running"}') for i in (1, 2)])
    rec = BatchRecorder()
    q = port.Port(recorded(rec))
    runs = 0

    def count(doc: port.Document) -> int:
        nonlocal runs
        runs += 1
        running = sum(1 for v in doc["sections"]["claims"].values() if v["state"] == "running")
        if runs == 1:
            inhouse_put(redis, slug, "claims", "T-1", {"state": "done"})
        doc["sections"]["operations"]["summary"] = {"running": running}
        return running

    assert q.write(slug, count) == 1
    assert runs == 2 and p.record(slug, "operations", "summary").value == {"running": 1}  # type: ignore[union-attr]
    assert sent_kinds(rec)[0] == [
        ("WRITE_KIND_PUT", "operations", "summary", 0),
        ("WRITE_KIND_CHECK_COUNT", "claims", "", rev),
    ]  # one check of every record held, no section check
    w = rec.sent[0].writes[1]
    assert (w.count, w.revision_sum) == (2, 2 * rev % 10**14)

    # Inserts of other keys, by the in-house writer and through fenced: the
    # first attempt's batch commits. (It must send one: a summary equal to
    # the stored one sends nothing, and an attempt that sends nothing reads
    # again once its view caught up with the inserts.)
    runs = 0

    def count_and_insert(doc: port.Document) -> int:
        nonlocal runs
        runs += 1
        running = sum(1 for v in doc["sections"]["claims"].values() if v["state"] == "running")
        if runs == 1:
            inhouse_put(redis, slug, "claims", "T-3", {"state": "running"})
            client.fenced_batch(slug, [fenced.Put("claims", "T-4", 0, '{"state":"running"}')], fence=fenced.UNFENCED)
        doc["sections"]["operations"]["summary"] = {"running": running, "pass": 2}
        return running

    assert q.write(slug, count_and_insert) == 1 and runs == 1

    # A record it held deleted by the bypassing writer: refused, rerun.
    runs = 0

    def count_and_delete(doc: port.Document) -> int:
        nonlocal runs
        runs += 1
        n = len(doc["sections"]["claims"])
        if runs == 1:
            redis.cli("HDEL", swarm_key(slug, "claims"), "T-2")
        doc["sections"]["operations"]["summary"] = {"claims": n}
        return n

    assert q.write(slug, count_and_delete) == 3 and runs == 2


def test_archive_puts_are_blind_and_never_checked(client: fenced.Client, p: port.Port, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    rev = p.fenced_batch(slug, [fenced.Put("archive", "old", 0, '{"n":1}'), fenced.Put("claims", "c", 0, '"c"')])
    rec = BatchRecorder()
    q = port.Port(recorded(rec))
    runs = 0

    def change(doc: port.Document) -> None:
        nonlocal runs
        runs += 1
        archive = doc["sections"]["archive"]
        seen = dict(archive.items())  # read whole: still not checked
        assert archive["old"] == {"n": 1} or runs > 1
        if runs == 1:  # others write the archive meanwhile: no conflict for a blind put
            inhouse_put(redis, slug, "archive", "old", {"n": 2})
            client.fenced_batch(slug, [fenced.Put("archive", "new", 0, '"theirs"')], fence=fenced.UNFENCED)
        archive["new"] = {"ours": len(seen)}
        doc["sections"]["claims"]["c"]  # checked
        doc["sections"]["intents"]["i"] = 1

    q.write(slug, change)
    assert runs == 1
    assert sent_kinds(rec) == [[
        ("WRITE_KIND_PUT", "archive", "new", fenced.BLIND),
        ("WRITE_KIND_PUT", "intents", "i", 0),
        ("WRITE_KIND_CHECK_RECORDS", "claims", "", 0),
    ]]
    assert [(c.key, c.expected) for c in rec.sent[0].writes[2].checks] == [("c", rev)]
    assert p.record(slug, "archive", "new").value == {"ours": 1}  # type: ignore[union-attr]
    # A delete in the archive is BLIND too.
    q.write(slug, lambda doc: doc["sections"]["archive"].pop("old"))
    assert sent_kinds(rec)[-1] == [("WRITE_KIND_DELETE", "archive", "old", fenced.BLIND)]
    assert p.record(slug, "archive", "old") is None


def test_write_reruns_sixteen_times_after_1_to_32_ms_then_raises_kept_changing(
    client: fenced.Client, p: port.Port, slug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p.fenced_batch(slug, [fenced.Put("claims", "hot", 0, "0")])
    sleeps: list[float] = []
    monkeypatch.setattr(port, "_sleep", sleeps.append)  # records the schedule; sleeps nothing
    runs = 0

    def change(doc: port.Document) -> None:
        nonlocal runs
        runs += 1
        n = doc["sections"]["claims"]["hot"]
        client.fenced_batch(slug, [fenced.Put("claims", "hot", fenced.BLIND, str(n + 1000))], fence=fenced.UNFENCED)  # always meddles
        doc["sections"]["claims"]["hot"] = n + 1

    with pytest.raises(port.KeptChanging) as e:
        p.write(slug, change)
    err: Any = e.value
    assert runs == port.MAX_WRITE_ATTEMPTS == 16 and err.attempts == 16
    assert str(err) == "the swarm fencing state kept changing; nothing was committed"
    assert isinstance(err, port.RevisionConflict) and isinstance(err, fenced.KeptChanging)
    assert isinstance(err, fenced.RevisionConflict) and err.last is not None and err.conflicts == err.last.conflicts
    assert err.__cause__ is err.last and isinstance(err.last, port.RevisionConflict)
    assert p.record(slug, "claims", "hot").value == 16 * 1000  # type: ignore[union-attr]  # none of the change's puts
    assert len(sleeps) == 15
    for k, s in enumerate(sleeps, start=2):  # before attempt k: within [max(1, c/2), c], c = min(2^(k-2), 32) ms
        ceiling = min(2 ** (k - 2), 32) / 1000
        assert max(0.001, ceiling / 2) <= s <= ceiling, (k, s)
    assert sleeps[0] == 0.001 and all(0.016 <= s <= 0.032 for s in sleeps[5:])


def test_write_returns_the_change_result_and_sends_nothing_for_no_change(p: port.Port, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    p.fenced_batch(slug, [fenced.Put("claims", "a", 0, '{"x": [1, 2]}')])
    rec = BatchRecorder()
    q = port.Port(recorded(rec))

    def same(doc: port.Document) -> tuple[int, Any]:
        claims = doc["sections"]["claims"]
        v = claims["a"]
        claims["a"] = {"x": [1, 2]}  # what is there
        v["x"].append(3)
        v["x"].pop()  # mutated back
        claims.pop("absent", None)
        return len(claims), v

    assert q.write(slug, same) == (1, {"x": [1, 2]}) and rec.sent == []
    # The view is the change's only.
    kept: list[port.Document] = []
    q.write(slug, kept.append)
    with pytest.raises(RuntimeError, match="only inside the change"):
        kept[0]["sections"]["claims"]["a"]


def test_the_lease_record_is_left_to_the_fence(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    with client.keep(slug, "tick-a", ttl_ms=60_000) as keeper:
        rec = BatchRecorder()
        q = port.Port(recorded(rec))
        seen: list[Any] = []

        def change(doc: port.Document) -> None:
            seen.append(doc["meta"]["lease"])
            seen.append(doc["meta"]["epoch"])
            client.renew(slug, "tick-a", keeper.epoch, ttl_ms=60_000)  # rewrites the lease record meanwhile
            doc["sections"]["claims"]["T-1"] = {"by": "tick-a"}

        q.write(slug, change, keeper)
        assert len(rec.sent) == 1 and seen[0]["owner"] == "tick-a" and seen[1] == keeper.epoch
        assert kinds(rec.sent[0]) == [("WRITE_KIND_PUT", "claims", "T-1", 0)]  # no check of meta/lease or meta/epoch
        assert rec.sent[0].fence.owner == "tick-a" and rec.sent[0].fence.epoch == keeper.epoch

        for bad in (lambda doc: doc["meta"].__setitem__("lease", {"owner": "x", "epoch": 1, "expires_at": 1}),
                    lambda doc: doc["meta"]["lease"].__setitem__("expires_at", 1),
                    lambda doc: doc["meta"].pop("epoch")):
            with pytest.raises(ValueError, match="meta/(lease|epoch): fenced owns it"):
                q.write(slug, bad, keeper)
        assert len(rec.sent) == 1  # nothing sent
        # Meta records fenced does not own are written and checked as any other.
        q.write(slug, lambda doc: doc["meta"].__setitem__("legacy_owner", "tick-a"), keeper)
        assert kinds(rec.sent[-1]) == [("WRITE_KIND_PUT", "meta", "legacy_owner", 0)]


def test_a_lost_reply_is_resent_under_the_same_request_id(server: Fenced, redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    rec = BatchRecorder(lose_reply=lambda n: n == 0)
    q = port.Port(recorded(rec))
    monkey_sleeps: list[float] = []
    real = port._sleep
    port._sleep = monkey_sleeps.append  # type: ignore[assignment]
    try:
        q.write(slug, lambda doc: doc["sections"]["claims"].__setitem__("a", 1))
    finally:
        port._sleep = real  # type: ignore[assignment]
    assert len(rec.sent) == 2 and rec.sent[0] == rec.sent[1] and rec.sent[0].request_id
    assert len(log_entries(redis, slug)) == 1  # applied once
    assert len(monkey_sleeps) == 1 and 0.25 <= monkey_sleeps[0] <= 0.75


@pytest.mark.parametrize("lost", [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED])
def test_write_resends_as_update_does(redis: Redis, slug: str, recorded, lost: grpc.StatusCode,  # type: ignore[no-untyped-def]
                                      monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """write commits through update's resend logic (fenced.update.commit):
    the same outcomes resent under the same id, logged by fenced.update at
    WARNING; a CANCELLED after the caller closed the Client is not resent.
    (Before: a loop of its own, _outcome_unknown, resending silently and
    resending a CANCELLED of the caller's own close.)"""
    caplog.set_level(logging.INFO, logger="fenced")
    monkeypatch.setattr(port, "_sleep", lambda s: None)
    rec = BatchRecorder(lose_reply=lambda n: n == 0, lost=lost)
    q = port.Port(recorded(rec))
    q.write(slug, lambda doc: doc["sections"]["claims"].__setitem__("a", 1))
    assert len(rec.sent) == 2 and rec.sent[0] == rec.sent[1]
    assert len(log_entries(redis, slug)) == 1
    logged = [r for r in caplog.records if r.name == "fenced.update" and r.levelno == logging.WARNING]
    assert [getattr(r, "request_id") for r in logged] == [rec.sent[0].request_id]

    gone = BatchRecorder(lose_reply=lambda n: True, lost=grpc.StatusCode.CANCELLED)
    c = recorded(gone)
    c.close()
    with pytest.raises(fenced.Cancelled) as e:
        port.Port(c).write(slug, lambda doc: doc["sections"]["claims"].__setitem__("b", 1))
    assert len(gone.sent) == 1 and e.value.request_id == gone.sent[0].request_id


def test_module_functions_use_the_configured_client_or_fenced_addr(
    server: Fenced, client: fenced.Client, slug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(port, "_configured", None)
    monkeypatch.setattr(port, "_from_env", None)
    monkeypatch.delenv("FENCED_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="configure"):
        port.layout(slug)
    monkeypatch.setenv("FENCED_ADDR", server.addr)
    assert port.layout(slug) == ""
    made = port.client()
    assert port.client() is made  # once per process
    port.configure(client)
    try:
        assert port.client() is client
        assert port.write(slug, lambda doc: doc["sections"]["claims"].setdefault("a", {"n": 1})) == {"n": 1}
        rev = port.fenced_batch(slug, [fenced.Put("claims", "b", 0, "2")])
        assert port.record(slug, "claims", "b") == (rev, 2)
        assert port.sections(slug, "claims") == {"claims": {"a": {"n": 1}, "b": 2}}
    finally:
        port.configure(None)
        made.close()


def test_document_view_behaves_as_the_document(p: port.Port, slug: str) -> None:
    p.fenced_batch(slug, [fenced.Put("claims", "a", 0, '"a"'), fenced.Put("grants", "g", 0, "1"),
                          fenced.Put("archive", "x", 0, "0")])

    def change(doc: port.Document) -> dict[str, Any]:
        out = {
            "top": sorted(doc), "rev": doc["revision"] > 0,
            "names": list(doc["sections"]), "has_claims": "claims" in doc["sections"],
            "has_orphans": "orphans" in doc["sections"],
        }
        doc["sections"]["orphans"] = {"o1": 1, "o2": 2}  # a whole section assigned
        doc["sections"]["grants"] = {"g2": 2}  # replaces g
        del doc["sections"]["claims"]
        with pytest.raises(KeyError):
            doc["sections"]["meta"]
        out["orphans"] = doc["sections"]["orphans"].copy()
        return out

    got = p.write(slug, change)
    assert got == {"top": ["meta", "revision", "sections"], "rev": True, "names": ["claims", "grants"],
                   "has_claims": True, "has_orphans": False, "orphans": {"o1": 1, "o2": 2}}
    assert nonempty(p.sections(slug)) == {"grants": {"g2": 2}, "orphans": {"o1": 1, "o2": 2}}
    assert p.sections(slug, "archive") == {"archive": {"x": 0}}


def test_a_whole_read_of_a_section_over_max_writes_commits(p: port.Port, slug: str) -> None:
    for start in (0, 600):
        p.fenced_batch(slug, [fenced.Put("executions", f"exe-{i:04d}", 0, '{"generation":1}') for i in range(start, start + 600)])

    def change(doc: port.Document) -> int:
        n = len(doc["sections"]["executions"])
        doc["sections"]["operations"]["executions"] = n
        return n

    assert p.write(slug, change) == 1200


def test_the_docs_example_runs(server: Fenced, p: port.Port, slug: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/clients.md's fenced.port example, run as a tick would run it."""
    import os
    import subprocess
    import sys

    from conftest import PYCLIENT, ROOT

    text = (ROOT / "docs" / "clients.md").read_text(encoding="utf-8")
    m = re.search(r"### fenced\.port: drop-in for the in-house port\n.*?```python\n(.*?)```", text, re.S)
    assert m, "docs/clients.md has no fenced.port example"
    p.fenced_batch(slug, [fenced.Put("claims", "T-1", 0, '{"state":"done"}'), fenced.Put("claims", "T-2", 0, '{"state":"open"}')])
    env = dict(os.environ, FENCED_ADDR=server.addr, SWARM=slug, PYTHONPATH=str(PYCLIENT))
    out = subprocess.run([sys.executable, "-c", m.group(1)], env=env, cwd=tmp_path, check=True, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout == "archived ['T-1']\n", out
    assert p.sections(slug, "claims", "archive") == {"claims": {"T-2": {"state": "open"}}, "archive": {"T-1": {"state": "done"}}}
