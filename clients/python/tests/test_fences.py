"""Unfenced by accident: writing without the swarm's lease is an explicit
choice in the client (fenced.UNFENCED), a server can require a fence
(--require-fence), and fenced.port keeps the in-house fence=None."""

from __future__ import annotations

from typing import Callable

import pytest

import fenced
from conftest import Fenced, Redis, swarm_key
from fenced import port


def test_a_fence_left_out_is_refused_before_anything_is_sent(client: fenced.Client, redis: Redis, slug: str) -> None:
    put = [fenced.Put("claims", "T-3", 0, "{}")]
    for fence in ({}, {"fence": None}):
        with pytest.raises(ValueError, match="fenced.UNFENCED"):
            client.fenced_batch(slug, put, **fence)  # type: ignore[arg-type]
    ran = []
    with pytest.raises(ValueError, match="fenced.UNFENCED"):
        client.update(slug, lambda tx: ran.append(tx.put("claims", "T-3", "{}")))
    assert ran == [] and redis.cli("EXISTS", swarm_key(slug, "claims")) == "0"

    rev = client.fenced_batch(slug, put, fence=fenced.UNFENCED).revision
    assert client.record(slug, "claims", "T-3").revision == rev  # type: ignore[union-attr]
    # The in-house port's fence=None stays unfenced.
    assert port.Port(client).fenced_batch(slug, [fenced.Put("claims", "T-4", 0, "{}")]) > rev


def test_a_server_requiring_a_fence_refuses_an_unfenced_batch(
    start_fenced: Callable[..., tuple[Fenced, Redis]], slug: str
) -> None:
    """The tour's example: while tick-b holds demo-swarm's lease, an
    unfenced put into claims on a server run with --require-fence claims is
    FenceRequired naming claims, nothing written; tick-b's fenced batch
    commits."""
    f, r = start_fenced("--require-fence", "claims")
    with fenced.Client(f.addr) as c, c.keep("demo-swarm", "tick-b", ttl_ms=600_000) as keeper:
        with pytest.raises(fenced.FenceRequired) as e:
            c.fenced_batch("demo-swarm", [fenced.Put("claims", "T-3", 0, "{}")], fence=fenced.UNFENCED)
        assert e.value.sections == ("claims",) and e.value.code.name == "FAILED_PRECONDITION"
        assert r.cli("HEXISTS", swarm_key("demo-swarm", "claims"), "T-3") == "0"
        c.fenced_batch("demo-swarm", [fenced.Put("claims", "T-3", 0, "{}")], fence=keeper.fence())
