"""A cancelled update learns its outcome: an asyncio task cancelled (or a
sync update interrupted) while its batch may have been sent raises what
names the batch and its request id, and a resend under it answers replayed
when the batch had committed."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc
import pytest

import fenced
import fenced.aio
from conftest import WAIT_S, Fenced, Redis, swarm_key
from test_update import BatchRecorder, log_entries, recorded  # noqa: F401 (recorded: a fixture)


class _HoldAnswers(grpc.aio.UnaryUnaryClientInterceptor):
    """Lets every FencedBatch reach fenced, then holds some answers: those of
    the keys in ``hold`` until the call is cancelled (setting ``answered``
    once fenced answered), and one in three others for a second, so that
    cancellations land before a batch is sent, while it is with fenced, and
    after it committed with its answer not yet seen."""

    def __init__(self, rng: random.Random, hold: set[str]) -> None:
        self.rng = rng
        self.hold = hold
        self.answered: dict[str, asyncio.Event] = {k: asyncio.Event() for k in hold}

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        call = await continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/FencedBatch"):
            await call  # answered: committed or refused
            key = request.writes[0].key
            if key in self.hold:
                self.answered[key].set()
                await asyncio.sleep(WAIT_S)  # until cancelled (bounded)
            await asyncio.sleep(self.rng.choice((0.0, 0.0, 1.0)))
        return call


def test_every_cancelled_aio_update_is_uncommitted_or_learnable(server: Fenced, redis: Redis, slug: str) -> None:
    """200 updates, each putting its own key, each task cancelled: one in
    four once fenced answered its batch (the answer held back), the others
    at a random moment (0-20 ms). One that finished committed its key; a
    plain CancelledError committed nothing (read from Redis); an
    UpdateCancelled names the request id, and a resend under it answers
    replayed exactly when the key was committed, committing it once
    otherwise. The swarm's log then holds exactly one batch per key there."""
    rng = random.Random(43)
    outcomes: dict[str, Any] = {}
    keys = [f"k-{i:03d}" for i in range(200)]
    hold = set(keys[::4])

    async def main() -> None:
        held = _HoldAnswers(rng, hold)
        channel = grpc.aio.insecure_channel(server.addr, interceptors=[held], options=list(fenced.CHANNEL_OPTIONS))
        c = fenced.aio.Client.from_channel(channel)
        try:
            for key in keys:
                task = asyncio.ensure_future(c.update(slug, lambda tx, key=key: tx.put("operations", key, "1"), fence=fenced.UNFENCED))
                if key in hold:
                    await asyncio.wait_for(held.answered[key].wait(), WAIT_S)
                else:
                    await asyncio.sleep(rng.uniform(0, 0.02))
                task.cancel()
                try:
                    outcomes[key] = await task
                except fenced.UpdateCancelled as e:
                    outcomes[key] = e
                except asyncio.CancelledError:
                    outcomes[key] = None
        finally:
            await channel.close()

    asyncio.run(main())
    # Every batch the interceptor let through was answered before its task
    # ended: nothing is left in flight.
    with fenced.Client(server.addr) as c:
        for key, out in sorted(outcomes.items()):
            stored = redis.cli("HGET", swarm_key(slug, "operations"), key)
            if isinstance(out, int):
                assert stored != "", f"{key}: the update answered r{out} but nothing is stored"
            elif out is None:
                assert key not in hold and stored == "", f"{key}: a plain CancelledError, yet the key was committed: its outcome could not be learned"
            else:
                assert isinstance(out, fenced.UpdateCancelled) and out.request_id and out.slug == slug
                res = c.fenced_batch(**out.resend_args())  # type: ignore[arg-type]
                assert res.replayed == (stored != ""), f"{key}: stored {stored!r}, resend replayed {res.replayed}"
                assert key not in hold or res.replayed, f"{key}: committed before its cancellation, yet the resend was not replayed"
    batches = [e for e in log_entries(redis, slug) if "operations" in e.get("changes", "")]
    there = [k for k in keys if redis.cli("HEXISTS", swarm_key(slug, "operations"), k) == "1"]
    assert len(batches) == len(there), "a key committed twice, or a batch without its key"


class _InterruptAfterCommit(BatchRecorder):
    """A KeyboardInterrupt once the first FencedBatch committed, before its
    answer is seen (as a Ctrl-C landing there would)."""

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        outcome = super().intercept_unary_unary(continuation, details, request)
        if details.method.endswith("/FencedBatch") and len(self.sent) == 1:
            outcome.result()
            raise KeyboardInterrupt
        return outcome


def test_an_interrupted_sync_update_names_its_batch(redis: Redis, slug: str, recorded) -> None:  # type: ignore[no-untyped-def]
    """A sync update interrupted after its batch committed raises
    UpdateInterrupted (a KeyboardInterrupt) naming the request id; a resend
    answers replayed, and the log holds one batch."""
    c = recorded(_InterruptAfterCommit())
    with pytest.raises(fenced.UpdateInterrupted) as e:
        c.update(slug, lambda tx: tx.put("operations", "a", "1"), fence=fenced.UNFENCED)
    assert isinstance(e.value, KeyboardInterrupt) and e.value.request_id
    res = c.fenced_batch(**e.value.resend_args())  # type: ignore[arg-type]
    assert res.replayed and len(log_entries(redis, slug)) == 1
    with pytest.raises(KeyboardInterrupt) as plain:
        c.update(slug, lambda tx: (_ for _ in ()).throw(KeyboardInterrupt), fence=fenced.UNFENCED)
    assert not isinstance(plain.value, fenced.BatchInFlight)  # interrupted in the change: nothing sent
