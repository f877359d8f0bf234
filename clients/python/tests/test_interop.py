"""Interop: records written by the Go client are read by Python and the reverse, on one swarm."""

from __future__ import annotations

import json
import pathlib
import subprocess

import fenced
from conftest import Fenced
from test_rpcs import VALUES


def go(binary: pathlib.Path, *args: str) -> str:
    return subprocess.run([str(binary), *args], check=True, capture_output=True, text=True, timeout=120).stdout


def test_go_and_python_read_each_other_s_records(server: Fenced, client: fenced.Client, go_interop: pathlib.Path, slug: str) -> None:
    for k, v in VALUES.items():
        rev = int(go(go_interop, server.addr, slug, "put", "intents", "go-" + k, v))
        assert client.record(slug, "intents", "go-" + k) == fenced.Record(rev, v), k
        py_rev = client.fenced_batch(slug, [fenced.Put("intents", "py-" + k, 0, v)], fence=fenced.UNFENCED).revision
        got = json.loads(go(go_interop, server.addr, slug, "get", "intents", "py-" + k))
        assert got == {"revision": py_rev, "value": v}, k
    # Python updates a record the Go client wrote; Go reads the update.
    client.update(slug, lambda tx: tx.put_json("intents", "go-null", {"from": "python"}), fence=fenced.UNFENCED)
    assert json.loads(go(go_interop, server.addr, slug, "get", "intents", "go-null"))["value"] == '{"from":"python"}'
