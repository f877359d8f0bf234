"""watch: a swarm's committed batches as a stream, resumed across restarts, as the Go client's Watch."""

from __future__ import annotations

import pathlib
import queue
import threading
from concurrent import futures
from typing import Any, Callable, Iterator

import grpc
import pytest

import fenced
from conftest import WAIT_S, Fenced, Redis, free_port, swarm_key
from fenced.v1 import records_pb2, records_pb2_grpc


def test_list_then_watch_yields_every_later_batch_with_its_changes(client: fenced.Client, slug: str) -> None:
    first = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, '"a"'), fenced.Put("intents", "x", 0, "1")], fence=fenced.UNFENCED).revision
    snap = client.sections(slug)
    lease = client.acquire(slug, "tick-w", ttl_ms=60_000)
    r1 = client.fenced_batch(slug, [fenced.Put("claims", "b", 0, '{"by":"w"}')], fence=lease.fence(), request_id="req-1").revision
    r2 = client.fenced_batch(slug, [fenced.Delete("claims", "a", first)], fence=fenced.UNFENCED).revision
    r3 = client.fenced_batch(slug, [fenced.Put("intents", "x", first, "2")], fence=fenced.UNFENCED).revision

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
    rev = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED).revision
    stream = client.watch(slug, progress=True)
    first = next(stream)
    assert first.progress and first.revision >= rev
    nxt = client.fenced_batch(slug, [fenced.Put("claims", "a", rev, "2")], fence=fenced.UNFENCED).revision
    ev = next(e for e in stream if not e.progress)
    stream.close()
    assert ev.revision == nxt


def test_watch_reports_compaction_as_a_typed_error(client: fenced.Client, redis: Redis, slug: str) -> None:
    # The log keeps the last 1000 batches, trimmed approximately (whole
    # stream nodes): commit past the cap until entries are gone, as the Go
    # tests do (fencedtest.FillLogPastItsCap).
    log = swarm_key(slug, "log")
    revs: list[int] = []
    for i in range(11_000):
        revs.append(client.fenced_batch(slug, [fenced.Put("journals", "j", fenced.BLIND, str(i))], fence=fenced.UNFENCED).revision)
        if len(revs) > 1000 and len(revs) % 10 == 0 and int(redis.cli("XLEN", log)) < len(revs):
            break
    else:
        pytest.fail(f"the log at {log} kept all of {len(revs)} entries")
    oldest = len(revs) - int(redis.cli("XLEN", log))
    with pytest.raises(fenced.RevisionCompacted) as e:
        next(client.watch(slug, revs[0]))
    assert (e.value.from_revision, e.value.oldest) == (revs[0], revs[oldest])


def test_watch_resumes_across_a_fenced_restart(fenced_bin: pathlib.Path, workdir: pathlib.Path, slug: str) -> None:
    r = Redis(workdir / "redis-watch")
    addr = f"127.0.0.1:{free_port()}"
    f = Fenced(fenced_bin, r, workdir, listen=addr)
    got: "queue.Queue[object]" = queue.Queue()
    try:
        with fenced.Client(addr) as writer, fenced.Client(addr) as watcher:
            def put(i: int) -> int:
                return writer.fenced_batch(slug, [fenced.Put("journals", "j", fenced.BLIND, str(i))], fence=fenced.UNFENCED).revision

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


# grpc-go's answer to a request compressed with an encoding it has no
# decompressor for: what a fenced older than its gzip support answers.
GO_NO_GZIP = 'grpc: Decompressor is not installed for grpc-encoding "gzip"'


class OldFenced(records_pb2_grpc.RecordsServiceServicer):
    """A RecordsService on loopback in front of a real fenced, relaying every
    Watch it serves to it, as a fenced without gzip support answers:

    - "gzip disabled in the transport": the server's transport refuses every
      request compressed with gzip (UNIMPLEMENTED, before the servicer runs);
    - "grpc-go's status": the first Watch (a Client's first, compressed) is
      refused with grpc-go's UNIMPLEMENTED status, as fenced's server does
      (a servicer cannot see the request's encoding);
    - "no Watch": every Watch is refused UNIMPLEMENTED (a server without it).

    ``calls`` counts every Watch that reached the server, ``served`` those
    the servicer relayed."""

    def __init__(self, upstream: str, refusal: str) -> None:
        self.refusal = refusal
        self.calls = 0
        self.served = 0
        self._upstream = grpc.insecure_channel(upstream)
        self._stub = records_pb2_grpc.RecordsServiceStub(self._upstream)
        opts = [("grpc.compression_enabled_algorithms_bitset", 1)] if refusal == "gzip disabled in the transport" else []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=opts, interceptors=[_Count(self)])
        records_pb2_grpc.add_RecordsServiceServicer_to_server(self, self._server)
        self.addr = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def Watch(self, request: records_pb2.WatchRequest, context: grpc.ServicerContext) -> Iterator[records_pb2.WatchResponse]:
        if self.refusal == "no Watch" or (self.refusal == "grpc-go's status" and self.calls == 1):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, GO_NO_GZIP if self.refusal != "no Watch" else "unknown method Watch")
        self.served += 1
        up = self._stub.Watch(request)
        context.add_callback(up.cancel)
        try:
            yield from up
        except grpc.RpcError:
            return  # cancelled: the watcher left

    def stop(self) -> None:
        self._server.stop(None).wait(WAIT_S)
        self._upstream.close()


class _Count(grpc.ServerInterceptor):
    """Counts the Watch calls that reach the server (compressed or not)."""

    def __init__(self, old: OldFenced) -> None:
        self.old = old

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        if details.method.endswith("/Watch"):  # type: ignore[attr-defined]
            self.old.calls += 1
        return continuation(details)


@pytest.mark.parametrize("refusal", ["gzip disabled in the transport", "grpc-go's status"])
def test_watch_falls_back_to_uncompressed_once_a_server_refuses_gzip(
    server: Fenced, client: fenced.Client, slug: str, refusal: str
) -> None:
    r0 = client.fenced_batch(slug, [fenced.Put("claims", "k", fenced.BLIND, "0")], fence=fenced.UNFENCED).revision
    r1 = client.fenced_batch(slug, [fenced.Put("claims", "k", fenced.BLIND, "1")], fence=fenced.UNFENCED).revision
    old = OldFenced(server.addr, refusal)
    try:
        with fenced.Client(old.addr) as c:
            for _ in range(2):
                stream = c.watch(slug, r0)
                ev = next(stream)
                stream.close()
                assert ev.revision == r1 and ev.changes == (fenced.Change("claims", "k", False, fenced.Record(r1, "1")),)
        # The first watch refused (compressed), asked again uncompressed; the
        # second uncompressed straight away.
        assert (old.calls, old.served) == (3, 2)
    finally:
        old.stop()


def test_watch_raises_unimplemented_when_the_server_has_no_watch(server: Fenced, slug: str) -> None:
    old = OldFenced(server.addr, "no Watch")
    try:
        with fenced.Client(old.addr) as c, pytest.raises(fenced.FencedError) as e:
            next(c.watch(slug))
        assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
        assert (old.calls, old.served) == (2, 0)  # once compressed, once not
    finally:
        old.stop()


def test_watch_yields_claim_events_whatever_the_sections(client: fenced.Client, slug: str) -> None:
    """A claim (a named lease) granted, renewed and released reaches watch as
    events carrying ``claim``, on a stream filtered to a section the claim
    operations do not write; current(name=) reads the claim."""
    start = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED).revision
    grant = client.acquire(slug, "worker-1", ttl_ms=60_000, name="wake/9")
    assert client.current(slug, name="wake/9").lease.owner == "worker-1"
    renewal = client.renew(slug, "worker-1", grant.epoch, ttl_ms=90_000, name="wake/9")
    released = client.release(slug, "worker-1", grant.epoch, name="wake/9")

    stream = client.watch(slug, start, sections=["claims"])
    got = [next(stream) for _ in range(3)]
    stream.close()
    assert [e.revision for e in got] == [grant.revision, renewal.revision, released]
    assert got[0].claim == fenced.ClaimEvent("wake/9", "granted", "worker-1", grant.epoch, grant.expires_at_ms)
    assert got[1].claim == fenced.ClaimEvent("wake/9", "renewed", "worker-1", grant.epoch, renewal.expires_at_ms)
    assert got[2].claim is not None and (got[2].claim.kind, got[2].claim.epoch) == ("released", grant.epoch)
    assert all(e.changes == () for e in got)
