"""fork() with the client in use: a tick forking its workers while it renews
and watches (fenced/_fork.py), in a process of its own (forking_tick.py)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import fenced
from conftest import PYCLIENT, Fenced

SCRIPT = pathlib.Path(__file__).with_name("forking_tick.py")


def run_tick(server: Fenced, slug: str, how: str, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), server.addr, slug, how],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
def test_a_forking_tick_works(server: Fenced, client: fenced.Client, slug: str, how: str) -> None:
    """20 workers forked while the parent's keeper renews, a thread follows a
    watch and another is busy: each worker's own Client commits under the
    parent's fence; the parent still holds the lease, its next batch commits,
    and its watch saw every worker's commit once. (Before: 16 of 20 workers
    hung in grpcio's fork handler, the rest failed "Bad file descriptor",
    and the parent's next batch failed INTERNAL RST_STREAM.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(PYCLIENT)
    got = run_tick(server, slug, how, env)
    assert got["workers"] == ["ok"] * 20, got
    assert got["held"] and got["keeper_error"] is None, got
    assert got["batch"] == "committed", got
    assert got["watched"] == sorted(f"w{i}" for i in range(20)) and got["watched_twice"] == 0, got
    assert got["watch_errors"] == [], got
    snap = client.sections(slug, "claims")
    assert sorted(snap.sections["claims"]) == sorted(f"w{i}" for i in range(20))
    assert not client.current(slug).live  # the parent released its lease at the end


def test_the_package_turns_grpc_fork_support_on_unless_told_otherwise(tmp_path: pathlib.Path) -> None:
    probe = "import fenced, fenced._fork as f, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'], f.fork_support_enabled())"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    base["PYTHONPATH"] = str(PYCLIENT)

    def run(code: str, **extra: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env={**base, **extra}, cwd=tmp_path,
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()

    assert run(probe) == "true True"
    assert run(probe, GRPC_ENABLE_FORK_SUPPORT="false") == "false False"  # the caller's choice is kept
    # grpc imported first: too late to choose; the package leaves it alone.
    assert run("import grpc, os; import fenced, fenced._fork as f; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'), "
               "f.fork_support_enabled())") == "None False"


def test_a_forked_child_cannot_use_the_parent_s_client_and_never_releases_its_lease(
    server: Fenced, slug: str, tmp_path: pathlib.Path
) -> None:
    code = f"""
import os, sys, json
import fenced
c = fenced.Client({server.addr!r})
k = c.keep({slug!r}, "parent", ttl_ms=60_000)
pid = os.fork()
if pid == 0:
    out = {{"held": k.held()}}
    try:
        c.record({slug!r}, "claims", "a")
        out["parent_client"] = "answered"
    except fenced.FencedError as e:
        out["parent_client"] = str(e)
    k.close()   # nothing: the lease is the parent's
    c.close()
    with fenced.Client({server.addr!r}) as own:
        out["own_client_live"] = own.current({slug!r}).live
    print(json.dumps(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({{"parent_live": c.current({slug!r}).live, "held": k.held(), "child": os.waitstatus_to_exitcode(status)}}))
k.close()
c.close()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(PYCLIENT)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    child, parent = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert child["held"] is False and child["own_client_live"] is True
    assert "made in process" in child["parent_client"] and "makes its own Client" in child["parent_client"]
    assert parent == {"parent_live": True, "held": True, "child": 0}


def test_a_fork_without_grpc_fork_support_is_refused_in_the_child_not_hung(
    server: Fenced, slug: str, tmp_path: pathlib.Path
) -> None:
    """grpc imported before fenced (fork support off): a child forked while
    the parent holds a keeper and a watch is refused a Client with the way
    out, instead of hanging, and the parent keeps working. (Before: 16 of 20
    such children hung, the rest failed "Bad file descriptor".)"""
    code = f"""
import grpc, os, sys, json, threading, logging
import fenced
logging.basicConfig(level=logging.WARNING)
c = fenced.Client({server.addr!r})
k = c.keep({slug!r}, "parent", ttl_ms=60_000)
threading.Thread(target=lambda: [None for _ in c.watch({slug!r})], daemon=True).start()
pid = os.fork()
if pid == 0:
    try:
        fenced.Client({server.addr!r})
        out = "made"
    except fenced.FencedError as e:
        out = str(e)
    print(json.dumps({{"child": out}}), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
rev = c.fenced_batch({slug!r}, [fenced.Put("claims", "p", 0, "1")], fence=k.fence()).revision
print(json.dumps({{"exit": os.waitstatus_to_exitcode(status), "held": k.held(), "committed": rev > 0}}), flush=True)
k.close()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(PYCLIENT)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    child, parent = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert "fork support was off" in child["child"] and "'spawn'" in child["child"], child
    assert parent == {"exit": 0, "held": True, "committed": True}
    assert "grpcio's fork support is off" in out.stderr  # the fork's WARNING
