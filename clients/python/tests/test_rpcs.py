"""Every RPC of fenced through the Python client, against a live server."""

from __future__ import annotations

import pytest

import fenced
from conftest import Fenced

# The values the Go tests round-trip (internal/store TestValuesByteForByte):
# each must come back byte for byte.
VALUES = {
    "empties": '{"ids":[],"m":{},"l":[[]]}',
    "numbers": '{"n":12345678901234567890,"f":0.1}',
    "order": '{"z":1,"a":{"y":"https://h/p","b":"<&>"}}',
    "unicode": '{"name":"ünïcödé","jp":"日本語","emoji":"🐝","esc":"\\u00e9\\n"}',
    "whitespace": '{ "a" :\t[ 1 , 2 ]\n, "b" : { } }',
    "scalar": '"just a string"',
    "null": "null",
}


def test_values_round_trip_byte_for_byte(client: fenced.Client, slug: str) -> None:
    res = client.fenced_batch(slug, [fenced.Put("intents", k, 0, v) for k, v in VALUES.items()], fence=fenced.UNFENCED)
    assert res.revision > 0 and not res.replayed
    for k, want in VALUES.items():
        rec = client.record(slug, "intents", k)
        assert rec is not None, k
        assert (rec.value, rec.revision) == (want, res.revision), k
    snap = client.sections(slug, "intents")
    assert snap.revision == res.revision
    assert {k: r.value for k, r in snap.sections["intents"].items()} == VALUES
    assert snap.section_revisions["intents"] == res.revision
    scanned = {}
    for page in client.scan_section(slug, "intents", page_size=2):
        assert len(page.records) <= 2
        scanned.update({k: r.value for k, r in page.records.items()})
    assert scanned == VALUES


def test_dumps_is_compact_and_keeps_key_order_and_unicode(client: fenced.Client, slug: str) -> None:
    obj = {"z": 1, "a": {"b": "<&>", "ids": []}, "n": 12345678901234567890, "name": "ünï 🐝"}
    text = fenced.dumps(obj)
    assert text == '{"z":1,"a":{"b":"<&>","ids":[]},"n":12345678901234567890,"name":"ünï 🐝"}'
    client.fenced_batch(slug, [fenced.Put("intents", "o", 0, text)], fence=fenced.UNFENCED)
    rec = client.record(slug, "intents", "o")
    assert rec is not None and rec.value == text and rec.json() == obj
    with pytest.raises(ValueError):
        fenced.dumps(float("nan"))
    with pytest.raises(TypeError):
        fenced.Put("intents", "o", 0, {"not": "text"})  # type: ignore[arg-type]


def test_layout_record_and_batch_kinds(client: fenced.Client, slug: str) -> None:
    assert client.layout(slug) == fenced.Layout.UNSPECIFIED
    assert client.record(slug, "claims", "a") is None
    assert client.record_at(slug, "claims", "a") == (None, 0)
    r1 = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1"), fenced.Put("claims", "b", 0, "2")], fence=fenced.UNFENCED).revision
    assert client.layout(slug) == fenced.Layout.RECORDS
    r2 = client.fenced_batch(
        slug,
        [fenced.Delete("claims", "a", r1), fenced.Check("claims", "b", r1), fenced.CheckSection("claims", r1),
         fenced.Put("claims", "c", fenced.BLIND, '"c"')],
     fence=fenced.UNFENCED,).revision
    assert r2 > r1
    assert client.record(slug, "claims", "a") is None
    rec, rev = client.record_at(slug, "claims", "c")
    assert rec == fenced.Record(r2, '"c"') and rev == r2
    # A batch of checks alone commits nothing and answers the current revision.
    assert client.fenced_batch(slug, [fenced.Check("claims", "b", r1)], fence=fenced.UNFENCED).revision == r2
    every = client.sections(slug)
    assert "claims" in every.sections and "meta" in every.sections and "archive" not in every.sections


def test_request_id_replays_the_original_revision(client: fenced.Client, slug: str) -> None:
    rid = fenced.new_request_id()
    assert len(rid) == 32 and rid != fenced.new_request_id()
    ws = [fenced.Put("claims", "a", 0, "1")]
    first = client.fenced_batch(slug, ws, request_id=rid, fence=fenced.UNFENCED)
    again = client.fenced_batch(slug, ws, request_id=rid, fence=fenced.UNFENCED)
    assert again.revision == first.revision and again.replayed and not first.replayed


def test_scan_section_pages(client: fenced.Client, slug: str) -> None:
    want = {f"k{i:03d}": str(i) for i in range(25)}
    rev = client.fenced_batch(slug, [fenced.Put("journals", k, 0, v) for k, v in want.items()], fence=fenced.UNFENCED).revision
    pages = list(client.scan_section(slug, "journals", page_size=10))
    assert len(pages) >= 3 and pages[-1].next_page_token == ""
    assert all(len(p.records) <= 10 for p in pages)
    assert {k: r.value for p in pages for k, r in p.records.items()} == want
    assert pages[0].section_revision == pages[-1].section_revision == rev
    empty = list(client.scan_section(slug, "orphans"))
    assert len(empty) == 1 and not empty[0].records


def test_lease_rpcs(client: fenced.Client, slug: str) -> None:
    cur = client.current(slug)
    assert cur.lease is None and not cur.live and cur.revision == 0 and cur.now_ms > 0
    lease = client.acquire(slug, "tick-1", ttl_ms=10_000)
    assert lease.owner == "tick-1" and lease.epoch >= 1 and lease.expires_at_ms > cur.now_ms
    assert lease.revision > 0
    again = client.acquire(slug, "tick-1", ttl_ms=10_000)
    assert again.epoch == lease.epoch  # the holder acquiring again keeps its epoch
    renewed = client.renew(slug, "tick-1", lease.epoch, ttl_ms=20_000)
    assert renewed.epoch == lease.epoch and renewed.expires_at_ms >= lease.expires_at_ms
    cur = client.current(slug)
    assert cur.live and cur.lease is not None and cur.lease.owner == "tick-1" and cur.lease.epoch == lease.epoch
    rev = client.fenced_batch(slug, [fenced.Put("claims", "x", 0, "1")], fence=lease.fence()).revision
    assert client.release(slug, "tick-1", lease.epoch) > rev
    assert not client.current(slug).live
    nxt = client.acquire(slug, "tick-2", ttl_ms=10_000)
    assert nxt.epoch > lease.epoch  # a new grant raises the epoch, kept across release


def test_client_options(server: Fenced) -> None:
    with pytest.raises(ValueError):
        fenced.Client(server.addr, token="secret")  # a token over plaintext needs insecure_token
    with fenced.Client(server.addr, token="secret", insecure_token=True) as c:
        # Authorization is off on this server: the token is sent and ignored.
        assert c.layout("py-options") == fenced.Layout.UNSPECIFIED
    assert dict(fenced.CHANNEL_OPTIONS)["grpc.max_receive_message_length"] == 64 << 20


def test_tls_with_a_bearer_token(start_fenced, tmp_path) -> None:
    """Over TLS the token needs no insecure_token; without it, a call is UNAUTHENTICATED."""
    import subprocess

    import grpc

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", "/CN=fenced-test", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": [{"name": "py", "token": "tls-token-for-python-tests", "slugs": ["py-*"], "access": "write"}]}')
    f, _ = start_fenced("--tls-cert", str(cert), "--tls-key", str(key), "--auth-tokens-file", str(tokens))
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with fenced.Client(f.addr, tls=creds, token="tls-token-for-python-tests") as c:
        assert c.fenced_batch("py-tls", [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED).revision > 0
        assert c.record("py-tls", "claims", "a").value == "1"  # type: ignore[union-attr]
    with fenced.Client(f.addr, tls=creds) as anon, pytest.raises(fenced.FencedError) as e:
        anon.record("py-tls", "claims", "a")
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_bearer_token_is_sent(start_fenced, tmp_path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": [{"name": "py", "token": "s3cret-token-for-python-tests", "slugs": ["*"], "access": "write"}]}')
    f, _ = start_fenced("--auth-tokens-file", str(tokens))
    with fenced.Client(f.addr) as anon, pytest.raises(fenced.FencedError) as e:
        anon.layout("py-auth")
    assert e.value.code.name == "UNAUTHENTICATED"
    with fenced.Client(f.addr, token="s3cret-token-for-python-tests", insecure_token=True) as c:
        assert c.layout("py-auth") == fenced.Layout.UNSPECIFIED


def test_migrate_without_state_or_already_moved_writes_nothing(client: fenced.Client, slug: str) -> None:
    """Client.migrate (AdminService/Migrate); a document swarm's move: tests/test_port.py."""
    assert client.migrate(slug, writers_upgraded=True) == fenced.MigrateResult(records=0, revision=0, no_state=True)
    assert client.layout(slug) == fenced.Layout.UNSPECIFIED
    rev = client.fenced_batch(slug, [fenced.Put("claims", "a", 0, "1")], fence=fenced.UNFENCED).revision
    got = client.migrate(slug, writers_upgraded=True, dry_run=True)
    assert got == fenced.MigrateResult(records=0, revision=0, already_moved=True)
    assert client.record(slug, "claims", "a") == fenced.Record(rev, "1")
