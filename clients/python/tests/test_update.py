"""update: read tracking, the diff, checks, reruns and lost replies, against a live fenced."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from typing import Callable, Optional

import grpc
import pytest

import fenced
from conftest import WAIT_S, Fenced, Redis, swarm_key, wait_until
from fenced.v1 import records_pb2


def log_entries(redis: Redis, slug: str) -> list[dict[str, str]]:
    """A swarm's whole log stream (XRANGE - +), read straight from Redis."""
    out: list[dict[str, str]] = []
    lines = redis.cli("XRANGE", swarm_key(slug, "log"), "-", "+").splitlines()
    i = 0
    while i < len(lines):
        assert re.fullmatch(r"\d+-\d+", lines[i]), lines
        entry: dict[str, str] = {"id": lines[i]}
        i += 1
        while i < len(lines) and not re.fullmatch(r"\d+-\d+", lines[i]):
            entry[lines[i]] = lines[i + 1]
            i += 2
        out.append(entry)
    return out


class _LostReply(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """The error a client sees when fenced's answer is lost on the way."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "reply lost (test)"

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def initial_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Optional[float]:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:  # type: ignore[no-untyped-def]
        return False


class BatchRecorder(grpc.UnaryUnaryClientInterceptor):
    """Records every FencedBatch sent and, when lose_reply(n) says so, lets the
    n-th one (from 0) reach fenced but drops its answer, answering ``lost``
    instead (UNAVAILABLE by default)."""

    def __init__(self, lose_reply: Callable[[int], bool] = lambda n: False,
                 lost: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.sent: list[records_pb2.FencedBatchRequest] = []
        self._lose = lose_reply
        self._lost = lost
        self._mu = threading.Lock()

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        if not details.method.endswith("/FencedBatch"):
            return continuation(details, request)
        with self._mu:
            n = len(self.sent)
            copy = records_pb2.FencedBatchRequest()
            copy.CopyFrom(request)
            self.sent.append(copy)
        outcome = continuation(details, request)
        if self._lose(n):
            outcome.result()  # the commit happened; its answer is lost
            raise _LostReply(self._lost)
        return outcome


@pytest.fixture
def recorded(server: Fenced):  # type: ignore[no-untyped-def]
    """A factory of Clients whose FencedBatch calls go through a BatchRecorder."""
    channels: list[grpc.Channel] = []

    def make(rec: BatchRecorder) -> fenced.Client:
        ch = grpc.intercept_channel(grpc.insecure_channel(server.addr, options=list(fenced.CHANNEL_OPTIONS)), rec)
        channels.append(ch)
        return fenced.Client.from_channel(ch)

    yield make
    for ch in channels:
        ch.close()


def kinds(req: records_pb2.FencedBatchRequest) -> list[tuple[str, str, str, int]]:
    return [(records_pb2.WriteKind.Name(w.kind), w.section, w.key, w.expected) for w in req.writes]


def test_eight_concurrent_writers_commit_each_change_exactly_once(server: Fenced, redis: Redis, slug: str) -> None:
    callers, each = 8, 10
    setup = fenced.Client(server.addr)
    setup.fenced_batch(slug, [fenced.Put("operations", "counter", 0, fenced.dumps({"n": 0, "ids": []}))], fence=fenced.UNFENCED)
    before = len(log_entries(redis, slug))
    failures: list[BaseException] = []

    def caller(i: int) -> None:
        # A call that gave up (KeptChanging: nothing committed, the designed
        # outcome under contention) is made again; the loop ends, since every
        # conflict is another caller's commit and once they are done nothing
        # conflicts. How often it happens depends on the box's speed.
        with fenced.Client(server.addr) as c:
            for j in range(each):
                change_id = f"{i}.{j}"

                def change(tx: fenced.Txn) -> None:
                    v = tx.get_json("operations", "counter")
                    v["n"] += 1
                    v["ids"].append(change_id)
                    tx.put_json("operations", "counter", v)

                while True:
                    try:
                        c.update(slug, change, fence=fenced.UNFENCED)
                        break
                    except fenced.KeptChanging:
                        pass  # nothing committed: run the change again

    def run(i: int) -> None:
        try:
            caller(i)
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and not failures, failures
    rec = setup.record(slug, "operations", "counter")
    assert rec is not None
    v = rec.json()
    want = sorted(f"{i}.{j}" for i in range(callers) for j in range(each))
    assert v["n"] == callers * each and sorted(v["ids"]) == want  # each change once, none lost, none twice
    assert len(log_entries(redis, slug)) - before == callers * each  # one commit per change
    setup.close()


def test_phantom_insert_during_whole_section_read_is_caught_when_phantom_proof(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)
    rec = BatchRecorder()
    c = recorded(rec)
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        claims = tx.section("claims", phantom_proof=True)
        n = len(claims)  # reads the section whole
        if runs == 1:  # another writer inserts a record meanwhile
            client.fenced_batch(slug, [fenced.Put("claims", "phantom", 0, "2")], fence=fenced.UNFENCED)
        tx.put_json("operations", "claim-count", n)

    c.update(slug, change, fence=fenced.UNFENCED)
    assert runs == 2
    assert len(rec.sent) == 2
    assert ("WRITE_KIND_CHECK_SECTION", "claims", "", rec.sent[0].writes[1].expected) in kinds(rec.sent[0])
    got = client.record(slug, "operations", "claim-count")
    assert got is not None and got.value == "2"  # the rerun counted the phantom


@pytest.mark.parametrize("lost", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED])
def test_lost_reply_is_not_applied_twice(redis: Redis, slug: str, recorded, lost: grpc.StatusCode,  # type: ignore[no-untyped-def]
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A batch that committed but whose answer came back UNAVAILABLE,
    DEADLINE_EXCEEDED or CANCELLED (not the caller's doing) is resent under
    the same request id, logged at WARNING, and applied once. (Before:
    DEADLINE_EXCEEDED and CANCELLED raised a plain FencedError at once, with
    no resend and no request id.)"""
    caplog.set_level(logging.INFO, logger="fenced")
    rec = BatchRecorder(lose_reply=lambda n: n == 0, lost=lost)
    c = recorded(rec)
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        v = tx.get_json("operations", "counter", {"n": 0})
        v["n"] += 1
        tx.put_json("operations", "counter", v)

    rev = c.update(slug, change, fence=fenced.UNFENCED)
    assert runs == 1 and len(rec.sent) == 2  # one resend, the change ran once
    assert rec.sent[0] == rec.sent[1] and rec.sent[0].request_id != ""
    log = log_entries(redis, slug)
    assert len(log) == 1 and log[0]["request_id"] == rec.sent[0].request_id
    got = c.record(slug, "operations", "counter")
    assert got == fenced.Record(rev, '{"n":1}')
    resends = [r for r in caplog.records if r.name == "fenced.update" and r.levelno == logging.WARNING]
    assert len(resends) == 1 and getattr(resends[0], "request_id") == rec.sent[0].request_id
    assert lost.name in resends[0].getMessage() and "resending under the same request id" in resends[0].getMessage()


def test_a_replication_timeout_or_a_closed_client_is_not_resent(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """Outcomes after which the batch did or did not commit for sure are
    raised at once, with the request id: REPLICATION_TIMEOUT (committed on the
    primary, too few replicas) and CANCELLED by the caller's own close()."""
    rec = BatchRecorder()
    c = recorded(rec)

    def change(tx: fenced.Txn) -> None:
        tx.put("operations", "a", "1")

    with pytest.raises(fenced.ReplicationTimeout) as e:
        c.update(slug, change, replica_ack=fenced.ReplicaAck(replicas=1, timeout_ms=10), fence=fenced.UNFENCED)
    assert len(rec.sent) == 1 and e.value.request_id == rec.sent[0].request_id != ""
    assert client.record(slug, "operations", "a") is not None  # it did commit

    closed = BatchRecorder(lose_reply=lambda n: True, lost=grpc.StatusCode.CANCELLED)
    d = recorded(closed)
    d.close()  # the caller closed it: a CANCELLED now is the caller's doing
    with pytest.raises(fenced.Cancelled) as e2:
        d.update(slug, lambda tx: tx.put("operations", "b", "1"), fence=fenced.UNFENCED)
    assert len(closed.sent) == 1 and e2.value.request_id == closed.sent[0].request_id != ""


def test_reads_are_checked_and_a_whole_read_is_one_count_check(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    r1 = client.fenced_batch(
        slug, [fenced.Put("claims", "a", 0, '"a"'), fenced.Put("claims", "b", 0, '"b"'), fenced.Put("intents", "x", 0, "1")], fence=fenced.UNFENCED
    ).revision
    rec = BatchRecorder()
    c = recorded(rec)

    def by_key(tx: fenced.Txn) -> None:
        claims = tx.section("claims")
        assert claims["a"] == '"a"' and "zzz" not in claims and claims.get("b") == '"b"'
        assert tx.get("intents", "x") == "1"
        tx.put("orphans", "o", '"new"')

    c.update(slug, by_key, fence=fenced.UNFENCED)
    assert kinds(rec.sent[-1]) == [
        ("WRITE_KIND_PUT", "orphans", "o", 0),
        ("WRITE_KIND_CHECK", "claims", "a", r1),
        ("WRITE_KIND_CHECK", "claims", "b", r1),
        ("WRITE_KIND_CHECK", "intents", "x", r1),
        ("WRITE_KIND_CHECK", "claims", "zzz", 0),
    ]

    wholes = (lambda s: list(s), lambda s: dict(s.items()), lambda s: s == {}, lambda s: s.copy(), len)
    for phantom_proof, whole in [(False, w) for w in wholes] + [(True, len)]:
        def change(tx: fenced.Txn) -> None:
            claims = tx.section("claims", phantom_proof=phantom_proof)
            whole(claims)
            claims["a"] = '"a"'  # unchanged: not a write, covered by the section's check
            claims.put_json("c", [1])
            del claims["b"]

        before = client.sections(slug, "claims")
        sec_rev, swarm_rev = before.section_revisions["claims"], before.revision
        a_rev = client.record(slug, "claims", "a").revision  # type: ignore[union-attr]
        c.view(slug).sync()  # client (another Client) wrote claims last: c's view catches up first
        c.update(slug, change, fence=fenced.UNFENCED)
        if phantom_proof:
            assert kinds(rec.sent[-1]) == [
                ("WRITE_KIND_PUT", "claims", "c", 0),
                ("WRITE_KIND_DELETE", "claims", "b", r1),
                ("WRITE_KIND_CHECK_SECTION", "claims", "", sec_rev),
            ], whole
        else:
            # Every record the section held (a and b), in one count check at
            # the snapshot's revision.
            assert kinds(rec.sent[-1]) == [
                ("WRITE_KIND_PUT", "claims", "c", 0),
                ("WRITE_KIND_DELETE", "claims", "b", r1),
                ("WRITE_KIND_CHECK_COUNT", "claims", "", swarm_rev),
            ], whole
            w = rec.sent[-1].writes[2]
            assert (w.count, w.revision_sum) == (2, (a_rev + r1) % 10**14), whole
        # Put b back and drop c for the next form of whole read.
        snap = client.sections(slug, "claims")
        client.fenced_batch(slug, [fenced.Put("claims", "b", 0, '"b"'), fenced.Delete("claims", "c", snap.sections["claims"]["c"].revision)], fence=fenced.UNFENCED)
        r1 = client.record(slug, "claims", "b").revision  # type: ignore[union-attr]


def test_update_that_writes_nothing_sends_nothing(client: fenced.Client, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    rev = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, '"a"')], fence=fenced.UNFENCED).revision
    rec = BatchRecorder()
    c = recorded(rec)

    def same(tx: fenced.Txn) -> None:
        tx.put("claims", "a", tx.get("claims", "a") or "")
        tx.delete("claims", "absent")

    assert c.update(slug, same, fence=fenced.UNFENCED) == rev and rec.sent == []


def test_update_gives_up_after_sixteen_attempts(client: fenced.Client, slug: str) -> None:
    client.fenced_batch(slug, [fenced.Put("claims", "hot", 0, "0")], fence=fenced.UNFENCED)
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        n = int(tx.get("claims", "hot") or "0")
        client.fenced_batch(slug, [fenced.Put("claims", "hot", fenced.BLIND, str(n + 1000))], fence=fenced.UNFENCED)  # always meddles
        tx.put("claims", "hot", str(n + 1))

    with pytest.raises(fenced.KeptChanging) as e:
        client.update(slug, change, fence=fenced.UNFENCED)
    assert runs == fenced.MAX_UPDATE_ATTEMPTS == 16 and e.value.attempts == 16
    assert "the swarm fencing state kept changing; nothing was committed" in str(e.value)
    assert isinstance(e.value.__cause__, fenced.RevisionConflict) and e.value.last is e.value.__cause__
    # Also a RevisionConflict, as Go's ErrKeptChanging wraps the last *ConflictError.
    assert isinstance(e.value, fenced.RevisionConflict) and e.value.conflicts == e.value.last.conflicts
    assert client.record(slug, "claims", "hot").value == str(16 * 1000)  # type: ignore[union-attr]


def test_update_stops_at_once_on_stale_lease_and_on_the_change_s_own_error(client: fenced.Client, slug: str) -> None:
    runs = 0

    def change(tx: fenced.Txn) -> None:
        nonlocal runs
        runs += 1
        tx.put("claims", "a", "1")

    with pytest.raises(fenced.StaleLease):
        client.update(slug, change, fence=fenced.LeaseFence("ghost", 7))
    assert runs == 1

    def boom(tx: fenced.Txn) -> None:
        tx.put("claims", "a", "1")
        raise RuntimeError("change failed")

    with pytest.raises(RuntimeError, match="change failed"):
        client.update(slug, boom, fence=fenced.UNFENCED)
    assert client.record(slug, "claims", "a") is None


def test_rerun_wait_is_the_go_clients() -> None:
    """update's rerun wait is a port of client/update.go's RerunWait* constants:
    the same first wait, factor, ceiling and spread (a change made to one alone
    fails here)."""
    from conftest import ROOT
    from fenced import update

    go = (ROOT / "client" / "update.go").read_text()

    def const(name: str) -> str:
        m = re.search(rf"^\s*(?:const\s+)?{name}\s*=\s*(.+)$", go, re.M)
        assert m, f"{name} not found in client/update.go"
        return m.group(1).strip()

    def duration_s(text: str) -> float:
        m = re.fullmatch(r"(\d+) \* time\.Millisecond", text)
        assert m, text
        return int(m.group(1)) / 1000

    assert update._RERUN_INITIAL_S == duration_s(const("RerunWaitInitial"))
    assert update._RERUN_MULTIPLIER == int(const("RerunWaitMultiplier"))
    assert update._RERUN_MAX_S == duration_s(const("RerunWaitMax"))
    assert update._RERUN_RANDOMISATION == float(const("RerunWaitRandomization"))
    assert fenced.MAX_UPDATE_ATTEMPTS == int(const("MaxUpdateAttempts"))


class Outcomes(grpc.UnaryUnaryClientInterceptor):
    """Records every FencedBatch: its request id and how it ended (the
    response, or the status code). batch_timeout: each FencedBatch call's
    deadline in seconds, whatever update gave it (the reads keep theirs, so
    a busy box's slow read never times out a test meant for a batch)."""

    def __init__(self, batch_timeout: Optional[float] = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self._mu = threading.Lock()
        self._batch_timeout = batch_timeout

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        if self._batch_timeout is not None and details.method.endswith("/FencedBatch"):
            details = details._replace(timeout=min(details.timeout or self._batch_timeout, self._batch_timeout))
        outcome = continuation(details, request)
        if details.method.endswith("/FencedBatch"):
            try:
                got: object = outcome.result()
            except grpc.RpcError as e:
                got = e.code()
            with self._mu:
                self.calls.append((request.request_id, got))
        return outcome


def _stopping_change(redis: Redis, stopped: list[bool]) -> Callable[[fenced.Txn], None]:
    """A change that reads, then SIGSTOPs redis (once): its batch reaches a
    Redis that answers nothing until SIGCONT."""

    def change(tx: fenced.Txn) -> None:
        v = tx.get_json("operations", "counter", {"n": 0})
        tx.put_json("operations", "counter", {"n": v["n"] + 1})
        if not stopped:
            stopped.append(True)
            os.kill(redis.proc.pid, signal.SIGSTOP)

    return change


def test_update_resends_a_batch_whose_call_deadline_passed_under_the_same_id(start_fenced, slug: str) -> None:  # type: ignore[no-untyped-def]
    """A batch whose call passed its deadline (Redis stopped under it) may
    have committed: update resends it under the same request id, logging the
    resend, and the change is committed once, under that id (the resend
    answers the first attempt's revision, replayed, when that one reached
    Redis before its deadline; it commits itself otherwise). (Before: update
    raised the DEADLINE_EXCEEDED at once and never resent.)"""
    f, r = start_fenced()
    rec = Outcomes(batch_timeout=1.0)
    ch = grpc.intercept_channel(grpc.insecure_channel(f.addr, options=list(fenced.CHANNEL_OPTIONS)), rec)
    c = fenced.Client.from_channel(ch, timeout=WAIT_S)
    resumed: list[str] = []

    class Resume(logging.Handler):
        """On update's first resend: SIGCONT Redis."""

        def emit(self, record: logging.LogRecord) -> None:
            rid = getattr(record, "request_id", "")
            if resumed or not rid:
                return
            resumed.append(rid)
            os.kill(r.proc.pid, signal.SIGCONT)

    handler = Resume(level=logging.WARNING)
    logger = logging.getLogger("fenced.update")
    logger.addHandler(handler)
    stopped: list[bool] = []
    try:
        rev = c.update(slug, _stopping_change(r, stopped), timeout=WAIT_S, fence=fenced.UNFENCED)
    finally:
        logger.removeHandler(handler)
        os.kill(r.proc.pid, signal.SIGCONT)
        ch.close()
    assert resumed, "update did not log a resend"
    rid = resumed[0]
    assert [i for i, _ in rec.calls] == [rid] * len(rec.calls) and len(rec.calls) >= 2, rec.calls
    assert rec.calls[0][1] == grpc.StatusCode.DEADLINE_EXCEEDED
    last = rec.calls[-1][1]
    assert isinstance(last, records_pb2.FencedBatchResponse) and last.revision == rev
    log = [e for e in log_entries(r, slug) if e.get("request_id") == rid]
    assert len(log) == 1  # committed once
    assert len(log_entries(r, slug)) == 1  # and nothing else
    with fenced.Client(f.addr) as check:
        assert check.record(slug, "operations", "counter") == fenced.Record(rev, '{"n":1}')


def test_update_gives_up_at_its_timeout_naming_the_request_id(start_fenced, slug: str) -> None:  # type: ignore[no-untyped-def]
    """Redis stays stopped: update raises DeadlineExceeded once its own
    timeout passes, with the request id its batch went under; that batch
    commits once Redis is back, and only once. (Before: a plain FencedError
    DEADLINE_EXCEEDED with no request id, and no overall timeout.)"""
    f, r = start_fenced()
    # Batches of 2 s within 6 s: the third send gets what is left, so the
    # update's timeout runs out before its resends do.
    rec = Outcomes(batch_timeout=2.0)
    ch = grpc.intercept_channel(grpc.insecure_channel(f.addr, options=list(fenced.CHANNEL_OPTIONS)), rec)
    c = fenced.Client.from_channel(ch, timeout=WAIT_S)
    stopped: list[bool] = []
    try:
        with pytest.raises(fenced.DeadlineExceeded) as e:
            c.update(slug, _stopping_change(r, stopped), timeout=6.0, fence=fenced.UNFENCED)
    finally:
        os.kill(r.proc.pid, signal.SIGCONT)
    err = e.value
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED and isinstance(err, fenced.Unavailable)
    assert err.request_id and [i for i, _ in rec.calls] == [err.request_id] * len(rec.calls) and rec.calls, rec.calls
    assert "timeout of 6s passed" in str(err) and err.request_id in str(err)
    # Resent now under that id, the batch commits exactly once: replayed if
    # a send before reached Redis, committed now if none did (fenced may not
    # have passed it on before its deadline: "may still commit").
    again = c.fenced_batch(slug, [fenced.Put("operations", "counter", 0, '{"n":1}')], request_id=err.request_id, fence=fenced.UNFENCED)
    assert [x["revision"] for x in log_entries(r, slug) if x.get("request_id") == err.request_id] == [str(again.revision)]
    assert c.record(slug, "operations", "counter").revision == again.revision
    ch.close()


def test_every_error_of_a_batch_carries_its_request_id(client: fenced.Client, slug: str) -> None:
    client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED)
    with pytest.raises(fenced.RevisionConflict) as e:
        client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "2")], request_id="rid-conflict", fence=fenced.UNFENCED)
    assert e.value.request_id == "rid-conflict" and "rid-conflict" in str(e.value)
    with pytest.raises(fenced.StaleLease) as s:
        client.update(slug, lambda tx: tx.put("claims", "b", "1"), fence=fenced.LeaseFence("ghost", 9))
    assert len(s.value.request_id) == 32
    with pytest.raises(fenced.RevisionConflict) as n:
        client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "2")], fence=fenced.UNFENCED)
    assert n.value.request_id == ""
