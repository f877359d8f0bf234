"""Views (fenced/view.py): a swarm's records kept by its Watch stream, the
port's and update's reads from them (issue 40, items 1 and 2)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional

import grpc
import pytest

import fenced
from conftest import Fenced, Redis, swarm_key, wait_until
from fenced import port

# An in-house writer's batch (the seed's Lua, as ../shared/bench-tick runs it):
# the counter INCRed, the record stored as {"r":rev,"v":value}, one log entry
# naming the revision, the owner and how many records it wrote: no keys.
INHOUSE_BATCH = """
local rev = redis.call('INCR', KEYS[2])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1])
else redis.call('HSET', KEYS[1], ARGV[1], '{"r":' .. rev .. ',"v":' .. ARGV[3] .. '}') end
redis.call('XADD', KEYS[3], 'MAXLEN', '=', 1000, '*', 'revision', rev, 'owner', ARGV[2], 'records', 1)
return rev
"""


def inhouse(redis: Redis, slug: str, section: str, key: str, value: Any, owner: str = "inhouse") -> int:
    """One in-house batch putting (or, value None, deleting) one record; answers its revision."""
    text = "" if value is None else json.dumps(value)
    return int(redis.cli("EVAL", INHOUSE_BATCH, "3", swarm_key(slug, section), swarm_key(slug, "revision"),
                         swarm_key(slug, "log"), key, owner, text))


def stored(redis: Redis, slug: str, *sections: str) -> dict[str, dict[str, tuple[int, str]]]:
    """What Redis holds of the sections: key -> (revision, value text)."""
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for s in sections:
        raw = redis.cli("--raw", "HGETALL", swarm_key(slug, s)).split("\n")
        pairs = [x for x in raw if x != ""] if raw != [""] else []
        recs = {}
        for k, v in zip(pairs[::2], pairs[1::2]):
            d = json.loads(v)
            recs[k] = (int(d["r"]), json.dumps(d["v"], separators=(",", ":")))
        out[s] = recs
    return out


def held(view: fenced.View, *sections: str) -> dict[str, dict[str, tuple[int, str]]]:
    """What the view holds of the sections, in stored()'s shape (values re-encoded)."""
    snap = view.snapshot(*sections, fresh=False)
    return {s: {k: (r.revision, json.dumps(json.loads(r.value), separators=(",", ":"))) for k, r in snap.sections[s].items()}
            for s in sections}


class Hold(grpc.UnaryStreamClientInterceptor, grpc.UnaryUnaryClientInterceptor):
    """Holds back, while ``on`` is set, every Watch message and every
    Sections answer of the channel it intercepts (a view behind Redis that
    cannot catch up); counts the calls by method."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.calls: dict[str, int] = {}
        self._mu = threading.Lock()

    def _count(self, method: str) -> None:
        with self._mu:
            name = method.rsplit("/", 1)[-1]
            self.calls[name] = self.calls.get(name, 0) + 1

    def _wait(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        while self.on.is_set() and not cancelled():
            time.sleep(0.01)

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        self._count(details.method)
        if details.method.endswith("/Sections"):
            self._wait()
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        self._count(details.method)
        call = continuation(details, request)
        return _HeldStream(call, self) if details.method.endswith("/Watch") else call


class _HeldStream:
    def __init__(self, call: Any, hold: Hold) -> None:
        self._call, self._hold, self._cancelled = call, hold, False

    def __iter__(self) -> "_HeldStream":
        return self

    def __next__(self) -> Any:
        resp = next(self._call)
        self._hold._wait(lambda: self._cancelled)
        if self._cancelled:
            return next(self._call)  # raises CANCELLED: the held message is never handed on
        return resp

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


@pytest.fixture
def holding(server: Fenced) -> Iterator[Callable[[], tuple[fenced.Client, Hold]]]:
    """A factory of Clients whose channel goes through a Hold."""
    made: list[tuple[fenced.Client, grpc.Channel, Hold]] = []

    def make() -> tuple[fenced.Client, Hold]:
        h = Hold()
        ch = grpc.intercept_channel(grpc.insecure_channel(server.addr, options=list(fenced.CHANNEL_OPTIONS)), h)
        c = fenced.Client.from_channel(ch, timeout=30)
        made.append((c, ch, h))
        return c, h

    yield make
    for c, ch, h in made:
        h.on.clear()
        c.close()
        ch.close()


def test_one_view_per_swarm_follows_fenced_batches(client: fenced.Client, server: Fenced, slug: str) -> None:
    r0 = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, '{"n": 1}')], fence=fenced.UNFENCED).revision
    with fenced.Client(server.addr) as c:
        v = c.view(slug)
        assert c.view(slug) is v and c.view(slug, "claims") is v  # every section's view serves named ones
        assert v.record("claims", "a").value == '{"n": 1}' and v.revision >= r0  # type: ignore[union-attr]
        r1 = client.fenced_batch(slug, [fenced.Put("claims", "b", 0, '[1,  2]'), fenced.Delete("claims", "a", r0)],
                                 fence=fenced.UNFENCED).revision
        snap = v.snapshot("claims")  # as of now: waits for the batch
        assert snap.revision >= r1 and {k: (r.revision, r.value) for k, r in snap.sections["claims"].items()} == {"b": (r1, "[1,  2]")}
        assert "archive" not in v.snapshot().sections and "meta" in v.snapshot().sections
        assert v.memory_bytes() > len("[1,  2]")


def test_a_batch_whose_keys_the_log_does_not_name_lists_again(client: fenced.Client, redis: Redis, slug: str) -> None:
    """An in-house batch's log entry names no keys: the view cannot apply it
    and lists again, so it holds what Redis holds once it has passed it.
    (Before: a view that took the event's revision alone kept the old value.)"""
    client.fenced_batch(slug, [fenced.Put("claims", k, 0, '"x"') for k in "abc"], fence=fenced.UNFENCED)
    v = client.view(slug)
    v.sync()
    rev = inhouse(redis, slug, "claims", "b", {"by": "inhouse"})
    inhouse(redis, slug, "claims", "c", None)
    wait_until(lambda: v.revision >= rev + 1, "the view to pass the in-house batches")
    assert held(v, "claims") == stored(redis, slug, "claims")
    assert held(v, "claims")["claims"]["b"] == (rev, '{"by":"inhouse"}')


def test_a_filtered_watch_hands_on_a_batch_whose_sections_are_unknown(client: fenced.Client, redis: Redis, slug: str) -> None:
    """A batch whose log entry names neither keys nor sections may have
    changed any section: a watch of named sections gets it too (truncated,
    no sections named). (Before: only an unfiltered watch got it, so a
    watcher of claims missed an in-house writer's change of claims.)"""
    r0 = client.fenced_batch(slug, [fenced.Put("intents", "i", 0, "1")], fence=fenced.UNFENCED).revision
    got: list[fenced.Event] = []

    def watch() -> None:
        for ev in client.watch(slug, r0, sections=["claims"]):
            got.append(ev)
            return

    threading.Thread(target=watch, daemon=True).start()
    rev = inhouse(redis, slug, "claims", "k", 1)
    wait_until(lambda: bool(got), "the watch of claims to get the in-house batch", timeout=10)
    assert [(ev.revision, ev.truncated, ev.sections, ev.changes) for ev in got] == [(rev, True, (), ())]


def test_a_read_as_of_now_refuses_rather_than_answer_stale(client: fenced.Client, holding, slug: str) -> None:  # type: ignore[no-untyped-def]
    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)
    c, hold = holding()
    v = c.view(slug)
    v.sync()
    hold.on.set()  # the view hears nothing more, and cannot list
    r1 = client.fenced_batch(slug, [fenced.Put("claims", "a", fenced.BLIND, "2")], fence=fenced.UNFENCED).revision
    with pytest.raises(fenced.ViewBehind) as e:
        v.record("claims", "a", timeout=1.0)
    assert e.value.want == r1 and e.value.have < r1 and isinstance(e.value, fenced.DeadlineExceeded)
    assert v.record("claims", "a", fresh=False).value == "1"  # type: ignore[union-attr]  # as it stands, asked for
    hold.on.clear()
    assert v.record("claims", "a").value == "2"  # type: ignore[union-attr]


def test_a_view_behind_costs_a_rerun_never_a_lost_modification(client: fenced.Client, holding, slug: str) -> None:  # type: ignore[no-untyped-def]
    """The port reads from a view that has not heard another writer's
    increment: its batch is refused (the record's revision), and the rerun,
    once the view caught up, increments what that writer stored."""
    client.fenced_batch(slug, [fenced.Put("journals", "n", 0, '{"n": 0}')], fence=fenced.UNFENCED)
    c, hold = holding()
    p = port.Port(c)
    p.write(slug, lambda doc: doc["sections"]["journals"]["n"])
    hold.on.set()
    for _ in range(3):  # the other writer: three increments the view does not hear
        fenced.Client.update(client, slug, lambda tx: tx.put_json("journals", "n", {"n": tx.get_json("journals", "n")["n"] + 1}),
                             fence=fenced.UNFENCED, view=False)
    seen: list[int] = []

    def bump(doc: port.Document) -> None:
        v = doc["sections"]["journals"]["n"]
        seen.append(v["n"])
        if len(seen) == 1:
            hold.on.clear()  # the view may catch up now
        v["n"] += 1

    p.write(slug, bump)
    assert seen == [0, 3]  # the stale read was refused, the rerun read what was stored
    assert client.record(slug, "journals", "n").json() == {"n": 4}  # type: ignore[union-attr]


def test_the_port_reads_a_whole_swarm_with_no_call(client: fenced.Client, holding, slug: str) -> None:  # type: ignore[no-untyped-def]
    """Once the view is listed, a write that iterates every section, counts
    them and reads keys makes no read call: one FencedBatch. (Before: each
    len() and iter() of doc["sections"] was a Sections read, and each
    section iterated another.)"""
    client.fenced_batch(slug, [fenced.Put(s, k, 0, '{"v": 1}') for s in ("claims", "intents", "journals") for k in "ab"],
                        fence=fenced.UNFENCED)
    c, hold = holding()
    p = port.Port(c)
    p.write(slug, lambda doc: None)  # lists the view
    before = dict(hold.calls)

    def every(doc: port.Document) -> int:
        secs = doc["sections"]
        n = len(secs) + sum(len(secs[name]) for name in list(secs))
        n += sum(1 for name in secs for _ in secs[name].items())
        secs["intents"]["c"] = {"n": n}
        return n

    assert p.write(slug, every) == 3 + 6 + 6
    calls = {m: n - before.get(m, 0) for m, n in hold.calls.items() if n != before.get(m, 0)}
    assert calls == {"FencedBatch": 1}


@pytest.mark.parametrize("old,new,put", [
    ({"n": 1}, {"n": 1.0}, True),  # 1 and 1.0 are equal in Python, not as JSON text
    ({"n": 1}, {"n": True}, True),
    ({"n": 0.0}, {"n": -0.0}, True),
    ({"n": [1, 2]}, {"n": (1, 2)}, False),  # a tuple is written as the list it equals
    ({"n": float("nan")}, None, False),  # NaN as read is unchanged (NaN != NaN in Python)
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),  # key order is part of the text
])
def test_an_in_place_edit_is_a_put_exactly_when_the_text_changes(client: fenced.Client, slug: str, old: Any, new: Any, put: bool) -> None:
    text = fenced.dumps(old, allow_nan=True)
    r0 = client.fenced_batch(slug, [fenced.Put("claims", "k", 0, text)], fence=fenced.UNFENCED).revision
    p = port.Port(client)

    def edit(doc: port.Document) -> None:
        v = doc["sections"]["claims"]["k"]
        if new is not None:
            v.clear()
            v.update(new)
        doc["sections"]["intents"]["touch"] = 1

    for _ in range(2):  # the second from the view's cache of values
        p.write(slug, edit)
        rec = client.record(slug, "claims", "k")
        assert rec is not None
        if put:
            assert rec.revision > r0 and rec.value == fenced.dumps(new, allow_nan=True)
            client.fenced_batch(slug, [fenced.Put("claims", "k", fenced.BLIND, text)], fence=fenced.UNFENCED)
            r0 = client.record(slug, "claims", "k").revision  # type: ignore[union-attr]
        else:
            assert (rec.revision, rec.value) == (r0, text)


def test_a_value_kept_past_its_change_is_the_caller_s(client: fenced.Client, slug: str) -> None:
    """Each attempt hands out values of its own: one a change returned and
    the caller then mutated is not what the next write reads."""
    client.fenced_batch(slug, [fenced.Put("claims", "k", 0, '{"items": [1]}')], fence=fenced.UNFENCED)
    p = port.Port(client)
    kept = p.write(slug, lambda doc: doc["sections"]["claims"]["k"])
    kept["items"].append(2)
    assert p.write(slug, lambda doc: doc["sections"]["claims"]["k"]) == {"items": [1]}

    def touch(doc: port.Document) -> None:
        doc["sections"]["claims"]["k"]
        doc["sections"]["intents"]["x"] = 1

    p.write(slug, touch)
    assert client.record(slug, "claims", "k").value == '{"items": [1]}'  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["whole", "part", "by-items"])
def test_a_value_or_a_part_of_it_kept_past_its_change_is_never_handed_out_again(client: fenced.Client, slug: str, how: str) -> None:
    """A value a change left as read goes back to the view's pool and the
    next attempt hands out the same object, unless anything outside the
    attempt still holds it or a list or dict in it: a value, or a part of
    one, a change kept (not returned) and the caller mutated later is never
    what a later write reads, and is no put."""
    text = '{"items": [1], "m": {"a": 1}}'
    r0 = client.fenced_batch(slug, [fenced.Put("claims", "k", 0, text)], fence=fenced.UNFENCED).revision
    p = port.Port(client)
    kept: list[Any] = []

    def read(doc: port.Document) -> Any:
        if how == "by-items":
            return dict(doc["sections"]["claims"].items())["k"]
        return doc["sections"]["claims"]["k"]

    def keep(doc: port.Document) -> None:
        v = read(doc)
        kept.append(v if how != "part" else v["items"])

    def touch(doc: port.Document) -> None:
        assert read(doc) == {"items": [1], "m": {"a": 1}}
        doc["sections"]["intents"]["x"] = len(kept)

    p.write(slug, touch)
    p.write(slug, keep)
    (kept[0]["m"] if how != "part" else kept[0]).clear()  # the caller's own, after its write
    p.write(slug, touch)
    p.write(slug, touch)
    rec = client.record(slug, "claims", "k")
    assert rec is not None and (rec.revision, rec.value) == (r0, text)
    first: list[Any] = []
    p.write(slug, lambda doc: first.append(id(read(doc))))  # left as read (its id kept, not the value)
    p.write(slug, lambda doc: first.append(id(read(doc))))
    assert first[0] == first[1]  # the pool's: no decoding a second time
    assert id(client.view(slug)._s.free[("claims", "k")][1]) == first[1]  # alive in the pool: the ids are one object's


def test_two_attempts_at_once_never_hold_one_value(client: fenced.Client, slug: str) -> None:
    """A value in the view's pool goes to one attempt at a time: an attempt
    running while another holds the pooled value (another thread's; here a
    write nested in a change) decodes its own, so its in-place edit is not
    seen by the other, whose value stays as read."""
    client.fenced_batch(slug, [fenced.Put("claims", "k", 0, '{"n": 0}')], fence=fenced.UNFENCED)
    p = port.Port(client)

    def read(doc: port.Document) -> None:
        doc["sections"]["claims"]["k"]

    def bump(doc: port.Document) -> None:
        doc["sections"]["claims"]["k"]["n"] += 1

    seen: list[Any] = []

    def outer(doc: port.Document) -> None:
        v = doc["sections"]["claims"]["k"]
        if not seen:
            p.write(slug, bump)  # while this attempt holds its value
        seen.append(dict(v))
        doc["sections"]["intents"]["x"] = len(seen)

    p.write(slug, read)  # the value pooled
    p.write(slug, outer)
    assert seen == [{"n": 0}, {"n": 1}]  # as read; then the rerun after the conflict reads the bump
    assert json.loads(client.record(slug, "claims", "k").value) == {"n": 1}  # type: ignore[union-attr]


def test_records_of_a_released_claim_leave_the_view(client: fenced.Client, slug: str) -> None:
    client.fenced_batch(slug, [fenced.Put("claims", "free", 0, "0")], fence=fenced.UNFENCED)
    k = client.keep_claim(slug, "task-1", "worker", ttl_ms=30_000)
    client.fenced_batch(slug, [fenced.Put("claims", "bound", 0, "1", bind_to_claim=True)], claim=k.claim())
    v = client.view(slug)
    assert v.record("claims", "bound").claim == "task-1"  # type: ignore[union-attr]
    k.close()
    snap = v.snapshot("claims")
    assert sorted(snap.sections["claims"]) == ["free"]


def test_a_view_lists_again_after_batches_left_the_log_unread(client: fenced.Client, server: Fenced, redis: Redis, slug: str) -> None:
    """Issue 40's example with a view: fenced stopped while an in-house
    writer commits 3,000 batches (the log keeps 1,000), then one fenced put:
    the stream answers REVISION_COMPACTED and the view lists again: it holds
    what Redis holds."""
    client.fenced_batch(slug, [fenced.Put("journals", "j", 0, "0")], fence=fenced.UNFENCED)
    v = client.view(slug)
    v.sync()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        script = ("for i = 1, 3000 do local rev = redis.call('INCR', KEYS[2]) "
                  "redis.call('HSET', KEYS[1], 'k' .. (i % 7), '{\"r\":' .. rev .. ',\"v\":' .. i .. '}') "
                  "redis.call('XADD', KEYS[3], 'MAXLEN', '=', 1000, '*', 'revision', rev, 'owner', 'ih', 'records', 1) end return 1")
        redis.cli("EVAL", script, "3", swarm_key(slug, "journals"), swarm_key(slug, "revision"), swarm_key(slug, "log"))
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    last = client.fenced_batch(slug, [fenced.Put("journals", "j", fenced.BLIND, "1")], fence=fenced.UNFENCED).revision
    wait_until(lambda: v.revision >= last, "the view to pass the fenced put")
    assert held(v, "journals") == stored(redis, slug, "journals")


def test_aio_view_reads_and_update_reads_from_it(server: Fenced, client: fenced.Client, redis: Redis, slug: str) -> None:
    import asyncio

    import fenced.aio

    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            v = c.view(slug)
            assert c.view(slug) is v
            assert (await v.record("claims", "a")).value == "1"  # type: ignore[union-attr]
            client.fenced_batch(slug, [fenced.Put("claims", "a", fenced.BLIND, "2")], fence=fenced.UNFENCED)
            rev = inhouse(redis, slug, "claims", "ih", "x")
            snap = await v.snapshot("claims")  # as of now: the fenced put and the in-house batch
            assert snap.revision >= rev and {k: r.value for k, r in snap.sections["claims"].items()} == {"a": "2", "ih": '"x"'}
            seen: list[int] = []

            def count(tx: fenced.Txn) -> None:
                n = len(tx.section("claims"))
                seen.append(n)
                if len(seen) == 1:
                    inhouse(redis, slug, "claims", "a", 3)  # a record it read changes: refused, rerun from the view
                tx.put_json("intents", "n", n)

            await c.update(slug, count, fence=fenced.UNFENCED)
            assert seen == [2, 2] and client.record(slug, "intents", "n").value == "2"  # type: ignore[union-attr]
            assert (await v.record("claims", "a")).value == "3"  # type: ignore[union-attr]
            assert v.memory_bytes() > 0

    asyncio.run(main())


def test_an_attempt_that_sends_nothing_reads_as_of_now(client: fenced.Client, redis: Redis, slug: str) -> None:
    """update and the port read a first attempt from the view as it stands;
    one that sends no batch (its change raised, or changed nothing) is not
    checked, so it must have read the swarm as of now: a record a writer
    put bypassing the log (the counter INCRed, the record HSET, no entry:
    the view cannot hear it) is read on a rerun once the view caught up,
    never answered absent."""
    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)
    client.view(slug).sync()
    rev = int(redis.cli("INCR", swarm_key(slug, "revision")))
    redis.cli("HSET", swarm_key(slug, "claims"), "b", '{"r":%d,"v":2}' % rev)
    seen: list[Optional[str]] = []

    def needs_b(tx: fenced.Txn) -> None:
        seen.append(tx.get("claims", "b"))
        if seen[-1] is None:
            raise LookupError("claims/b is absent")

    client.update(slug, needs_b, fence=fenced.UNFENCED)
    assert seen == [None, "2"]
    rev = int(redis.cli("INCR", swarm_key(slug, "revision")))
    redis.cli("HSET", swarm_key(slug, "claims"), "c", '{"r":%d,"v":3}' % rev)
    assert port.Port(client).write(slug, lambda doc: doc["sections"]["claims"].get("c")) == 3


def test_a_view_of_every_section_does_not_serve_archive(client: fenced.Client, slug: str) -> None:
    """A view naming archive is a view of its own: the view of every section leaves archive out."""
    client.fenced_batch(slug, [fenced.Put("archive", "old", 0, "1")], fence=fenced.UNFENCED)
    every = client.view(slug)
    assert client.view(slug, "claims") is every
    assert client.view(slug, "archive").record("archive", "old").value == "1"  # type: ignore[union-attr]


def test_aio_view_lists_again_when_asked_while_it_lists(server: Fenced, client: fenced.Client, slug: str) -> None:
    """A list asked for (after a conflict) while the aio view is listing is
    run after it: the list under way may predate what the asker saw. Once
    the asker waited for a later list until its deadline, and an update of
    eight concurrent writers failed that way one run in four."""
    import asyncio

    import fenced.aio

    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)

    async def main() -> None:
        async with fenced.aio.Client(server.addr) as c:
            v = c.view(slug)
            await v.sync()
            sections = c.sections
            during: list[int] = []

            async def asking_while_listing(*args: Any, **kwargs: Any) -> Any:
                snap = await sections(*args, **kwargs)
                if not during:
                    during.append(v._s.lists_started)
                    v._ask_relist()  # as an update's conflict asks it, from another thread
                    await asyncio.sleep(0)  # the ask is seen before this list ends
                return snap

            c.sections = asking_while_listing  # type: ignore[method-assign]
            v._ask_relist()
            end = time.monotonic() + 10  # a failure bound, not a speed
            while not (during and v._s.listed > during[0]):
                assert time.monotonic() < end, f"no list after the one asked during list {during}: listed {v._s.listed}"
                await asyncio.sleep(0.01)

    asyncio.run(main())


def test_a_view_keeps_each_section_s_count_check_as_it_applies_batches() -> None:
    """The count, revision sum and latest revision a view keeps per section
    (what a CheckCount of a section read whole needs) are what counting its
    records again answers, after lists, events, this process's commits, a
    lapsed claim's records leaving, and deletes of the latest record."""
    import random as rnd

    from fenced.model import ClaimEvent, count_check
    from fenced.view import _State, _stats_of, count_check_of

    rng = rnd.Random(7)
    st = _State("s", ())
    st.lock.acquire()  # what the view's thread holds while it applies
    rev = 10**13 + 5
    st.load(fenced.Snapshot(rev, {"a": {"x": fenced.Record(rev, "1")}, "b": {}}, {}), frozenset())
    for i in range(400):
        rev += rng.randint(1, 3)
        sec, key = rng.choice("abc"), rng.choice("pqrstx")
        op = rng.random()
        if op < 0.45:
            rec = fenced.Record(rev, str(i), "c1" if rng.random() < 0.2 else "", 1)
            st.apply(fenced.Event(rev, changes=(fenced.Change(sec, key, False, rec),)))
        elif op < 0.7:
            st.apply(fenced.Event(rev, changes=(fenced.Change(sec, key, True, None),)))
        elif op < 0.85:
            st.committed(rev, [fenced.Put(sec, key, 0, "9")] if rng.random() < 0.6 else [fenced.Delete(sec, key, 0)], "", 0)
        elif op < 0.9:
            st.apply(fenced.Event(rev, claim=ClaimEvent("c1", "lapsed", "o", 1, 0)))
        else:
            st.load(fenced.Snapshot(rev, {sec: dict(st.secs.get(sec, {}))}, {}), frozenset({sec}), rev)
        t = st.take()
        for name, recs in t.secs.items():
            assert t.stats.get(name, _stats_of({})) == _stats_of(recs)
            assert count_check_of(name, t.revision, t.stats[name]) == count_check(name, t.revision, recs)
