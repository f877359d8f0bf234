"""A call fenced's fair queue refused its turn (RESOURCE_EXHAUSTED +
TOO_MANY_CALLS_QUEUED, nothing written) is sent again after the server's
RetryInfo delay, within the call's timeout, by both clients; a refusal whose
delay the timeout cannot wait for is raised as CallsQueued. The server here
is a stand-in answering the refusal a set number of times, so that every
outcome is the client's alone."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from typing import Iterator

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2

import fenced
import fenced.aio
from fenced import _rpc_pb2 as rpc
from fenced.v1 import records_pb2, records_pb2_grpc


def _refusal(delay_s: float) -> bytes:
    """The grpc-status-details-bin of TOO_MANY_CALLS_QUEUED with a delay."""
    info = rpc.ErrorInfo(reason="TOO_MANY_CALLS_QUEUED", domain="fenced", metadata={"why": "queue_full", "queued": "256", "max_queued": "256"})
    retry = rpc.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(delay_s), nanos=int(delay_s % 1 * 1e9)))
    details = []
    for name, msg in (("google.rpc.ErrorInfo", info), ("google.rpc.RetryInfo", retry)):
        details.append(any_pb2.Any(type_url="type.googleapis.com/" + name, value=msg.SerializeToString()))
    return rpc.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message="queued", details=details).SerializeToString()


class Queue(records_pb2_grpc.RecordsServiceServicer):
    """Refuses the first `refusals` FencedBatch calls their turn (delay
    `delay_s`), then commits at revision 7."""

    def __init__(self, refusals: int, delay_s: float) -> None:
        self.refusals, self.delay_s = refusals, delay_s
        self.calls = 0
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        records_pb2_grpc.add_RecordsServiceServicer_to_server(self, self._server)
        self.addr = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def FencedBatch(self, request: records_pb2.FencedBatchRequest, context: grpc.ServicerContext) -> records_pb2.FencedBatchResponse:
        with self.lock:
            self.calls += 1
            refuse = self.calls <= self.refusals
        if refuse:
            context.set_trailing_metadata((("grpc-status-details-bin", _refusal(self.delay_s)),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queued")
        return records_pb2.FencedBatchResponse(revision=7)

    def stop(self) -> None:
        self._server.stop(0)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> Iterator[Queue]:
    q = Queue(*request.param)
    yield q
    q.stop()


@pytest.mark.parametrize("queue", [(2, 0.01)], indirect=True)
def test_a_call_refused_its_turn_is_sent_again_after_the_delay(queue: Queue) -> None:
    with fenced.Client(queue.addr) as c:
        res = c.fenced_batch("py-queued", [fenced.Put("claims", "a", fenced.BLIND, "1")], fence=fenced.UNFENCED, timeout=30)
    assert res.revision == 7 and queue.calls == 3


@pytest.mark.parametrize("queue", [(1, 60.0)], indirect=True)
def test_a_delay_past_the_timeout_raises_calls_queued(queue: Queue) -> None:
    with fenced.Client(queue.addr) as c:
        with pytest.raises(fenced.CallsQueued) as e:
            c.fenced_batch("py-queued", [fenced.Put("claims", "a", fenced.BLIND, "1")], fence=fenced.UNFENCED, timeout=5, request_id="r-1")
    err = e.value
    assert isinstance(err, fenced.ResourceExhausted) and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (err.why, err.queued, err.max_queued, err.retry_after, err.request_id) == ("queue_full", 256, 256, 60.0, "r-1")
    assert queue.calls == 1  # not sent again: the delay is past the timeout


@pytest.mark.parametrize("queue", [(fenced.QUEUED_RETRIES, 0.001)], indirect=True)
def test_the_sends_are_bounded(queue: Queue) -> None:
    with fenced.Client(queue.addr) as c:
        with pytest.raises(fenced.CallsQueued):
            c.fenced_batch("py-queued", [fenced.Put("claims", "a", fenced.BLIND, "1")], fence=fenced.UNFENCED, timeout=60)
    assert queue.calls == fenced.QUEUED_RETRIES


@pytest.mark.parametrize("queue", [(2, 0.01)], indirect=True)
def test_the_aio_client_sends_it_again_too(queue: Queue) -> None:
    async def main() -> int:
        async with fenced.aio.Client(queue.addr) as c:
            res = await c.fenced_batch("py-queued", [fenced.Put("claims", "a", fenced.BLIND, "1")], fence=fenced.UNFENCED, timeout=30)
            return res.revision

    assert asyncio.run(main()) == 7 and queue.calls == 3
