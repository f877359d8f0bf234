"""Benchmark: a whole-swarm snapshot read end to end from the Python client.

Starts a redis-server and a `fenced serve` (built from this repository, or
$FENCED_BIN) on loopback, loads testdata/swarm-state.json into a swarm through
the client (blind batches of 256 puts), then times ``Client.sections(slug)``
(every section but archive: 2,403 records with meta's) ROUNDS times one at a
time, and the same call on the raw gRPC stub (what the client adds is the
difference: the Record objects). Prints the least and the median, in ms. A
benchmark, not a test: the figures depend on the machine and its load.
$FENCED_BIN_BEFORE (another fenced binary, e.g. an older build) starts a
second fenced on the same Redis, and each round times every side on both, in
turn, so that the two are compared under the same load. A fenced older than
its fair queue paced a caller reading in a loop (--heavy-read-share); such a
build runs with --heavy-read-share 1, so that the wait measured is the read's,
not the pacing's. A caller alone is never held by the fair queue.

    /usr/bin/python3 clients/python/tools/bench_sections.py [rounds]
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import fenced  # noqa: E402
from bench_tick import free_port, wait_for  # noqa: E402
from fenced.v1 import records_pb2  # noqa: E402

SLUG = "snapshot-bench"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    work = pathlib.Path(tempfile.mkdtemp(prefix="fenced-bench-sections-"))
    binary = work / "fenced"
    if os.environ.get("FENCED_BIN"):
        binary = pathlib.Path(os.environ["FENCED_BIN"])
    else:
        subprocess.run(["go", "build", "-o", str(binary), "./cmd/fenced"], cwd=ROOT, check=True, timeout=600)
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    binaries = [("this build", binary)]
    if os.environ.get("FENCED_BIN_BEFORE"):
        binaries.append(("before", pathlib.Path(os.environ["FENCED_BIN_BEFORE"])))
    servers = []
    try:
        for n, (label, path) in enumerate(binaries):
            log = work / f"fenced-{n}.log"
            with open(log, "wb") as logf:
                paced = "--heavy-read-share" in subprocess.run(
                    [str(path), "serve", "--help"], capture_output=True, text=True).stdout
                proc = subprocess.Popen(
                    [str(path), "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--drain-delay", "0s",
                     *(["--heavy-read-share", "1"] if paced else []), "--redis-url", f"redis://127.0.0.1:{port}"],
                    stdout=logf, stderr=subprocess.STDOUT)
            servers.append(proc)
            addr: list[str] = []

            def serving() -> bool:
                m = re.search(r'msg="serving gRPC" addr=(\S+)', log.read_text(errors="replace"))
                if m:
                    addr.append(m.group(1))
                return bool(m) or proc.poll() is not None

            wait_for(serving, "fenced to serve")
            if not addr:
                raise SystemExit(log.read_text(errors="replace")[-3000:])
            binaries[n] = (label, fenced.Client(addr[0]))
        client = binaries[0][1]
        fx = json.loads((ROOT / "testdata" / "swarm-state.json").read_text())
        for section, recs in sorted(fx["sections"].items()):
            keys = sorted(recs)
            for i in range(0, len(keys), 256):
                client.fenced_batch(SLUG, [fenced.Put(section, k, fenced.BLIND, json.dumps(recs[k])) for k in keys[i:i + 256]], fence=fenced.UNFENCED)
        snap = client.sections(SLUG)
        records = sum(len(s) for s in snap.sections.values())
        sides = {}
        for label, c in binaries:
            stub = c._records  # the raw stub: what grpc and protobuf cost alone
            sides[f"{label}: Client.sections"] = lambda c=c: c.sections(SLUG)
            sides[f"{label}: raw stub"] = lambda stub=stub: stub.Sections(records_pb2.SectionsRequest(slug=SLUG), timeout=30)
        for f in sides.values():
            for _ in range(5):
                f()
        print(f"whole-swarm snapshot: {records} records, {rounds} reads each, one at a time, sides in turn")
        took: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, f in sides.items():
                start = time.perf_counter()
                f()
                took[name].append((time.perf_counter() - start) * 1000)
        for name, t in took.items():
            print(f"  {name:32s} least {min(t):6.1f} ms  median {statistics.median(t):6.1f} ms")
        for _, c in binaries:
            c.close()
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=30)
        redis.terminate()
        redis.wait(timeout=30)


if __name__ == "__main__":
    main()
