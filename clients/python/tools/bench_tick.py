"""Benchmark: the tick's cycle (W1-W3 of ../shared/bench-tick) through the
Python port, from its views and without, against the in-house port's path,
in one process, the sides' cycles interleaved.

Starts a redis-server and a `fenced serve` (built from this repository, or
$FENCED_BIN) on loopback and loads testdata/swarm-state.json into one swarm
per side, each leased. Then, per workload, ROUNDS rounds of one cycle of
each side in turn:

- port (views): ``fenced.port.Port(client).write(slug, change, fence)`` as
  shipped, reading from the client's view of the swarm (one FencedBatch a
  cycle);
- port (no views): ``Port(client, views=False)``: a Sections read per
  section read whole, a Record read per key;
- in-house: the in-house port's path on redis-py (Debian's python3-redis;
  the side is left out without it): one pipeline of HGETALLs of every
  section but archive and meta, every record decoded, the change, one
  EVALSHA of the in-house-style batch script with a check of every record
  of a section read whole; fencing.write's retry loop (16 attempts, 1-32 ms).

W1 iterates executions and puts intents/bench-<side>; W2 reads one journals
record and puts it back bumped; W3 iterates every section but archive and
puts intents/bench-<side>. It prints, per workload and side, the median and
least ms a cycle, this process's CPU ms a cycle (time.process_time: the
view's follower thread included), and in-house ÷ side of the median (the
side's cycles/s over the in-house port's: above 1 is faster). A benchmark,
not a test: the figures depend on the machine and its load; compare only
within one run.

    /usr/bin/python3 clients/python/tools/bench_tick.py [rounds]   # default 30
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import fenced  # noqa: E402
from fenced import port  # noqa: E402

PREFIX = "agentihooks:swarm"  # fenced serve's default key prefix

# The in-house batch script, verbatim as bench-tick (INHOUSE_LUA) runs it
# (testdata/inhouse_commit.lua, which the Go benchmarks read too). KEYS:
# meta, revision, log, bucket, one section per write; ARGV: slug, owner,
# epoch, now_ms, mode ("raw"), then per write kind, key, expected, value.
INHOUSE_LUA = (ROOT / "testdata" / "inhouse_commit.lua").read_text()


def skey(slug: str, name: str) -> str:
    return f"{PREFIX}:{{{slug}}}:fence:{name}"


class InhouseConflict(Exception):
    pass


class InhouseView:
    """The in-house port's decoded view of one attempt: every section but
    archive, and meta, in one pipeline; records what the change read."""

    def __init__(self, r, slug: str, sections: list[str]) -> None:
        pipe = r.pipeline(transaction=False)
        for name in sections:
            pipe.hgetall(skey(slug, name))
        self.secs: dict[str, dict[str, tuple[int, object]]] = {}
        for name, raw in zip(sections, pipe.execute()):
            sec = {}
            for f, v in raw.items():
                d = json.loads(v)
                sec[f.decode()] = (int(d["r"]), d["v"])
            self.secs[name] = sec
        self.whole: set[str] = set()
        self.read: dict[tuple[str, str], int] = {}
        self.puts: dict[tuple[str, str], object] = {}

    def items(self, name: str):
        self.whole.add(name)
        return [(k, rv[1]) for k, rv in self.secs.get(name, {}).items()]

    def get(self, name: str, key: str):
        rv = self.secs.get(name, {}).get(key)
        self.read[(name, key)] = rv[0] if rv else 0
        if rv is None:
            raise KeyError(key)
        return rv[1]

    def put(self, name: str, key: str, value) -> None:
        if (name, key) not in self.read:
            rv = self.secs.get(name, {}).get(key)
            self.read[(name, key)] = rv[0] if rv else 0
        self.puts[(name, key)] = value

    def writes(self):
        out = [("put", n, k, self.read[(n, k)], json.dumps(v, separators=(",", ":"))) for (n, k), v in self.puts.items()]
        for name in sorted(self.whole):
            for key, (rev, _) in self.secs.get(name, {}).items():
                if (name, key) not in self.puts:
                    out.append(("check", name, key, rev, ""))
        for (name, key), rev in self.read.items():
            if (name, key) not in self.puts and name not in self.whole:
                out.append(("check", name, key, rev, ""))
        return out


def inhouse_write(r, sha: str, slug: str, sections: list[str], change, fence) -> None:
    """fencing.write's loop: read everything but archive, run change, commit;
    16 attempts, 1-32 ms waits."""
    ceiling = 0.001
    for attempt in range(1, 17):
        if attempt > 1:
            time.sleep(random.uniform(max(0.001, ceiling / 2), ceiling))
            ceiling = min(ceiling * 2, 0.032)
        view = InhouseView(r, slug, sections)
        change(view)
        if not view.puts:
            return
        writes = view.writes()
        keys = [skey(slug, "meta"), skey(slug, "revision"), skey(slug, "log"), f"{PREFIX}:bench-bucket:{{{slug}}}"]
        keys += [skey(slug, w[1]) for w in writes]
        argv = [slug, fence[0], str(fence[1]), "0", "raw"]
        for kind, _sec, key, exp, val in writes:
            argv += [kind, key, str(exp), val]
        try:
            r.evalsha(sha, len(keys), *keys, *argv)
            return
        except Exception as e:  # redis.exceptions.ResponseError
            if "FENCE_CONFLICT" not in str(e):
                raise
    raise RuntimeError("in-house: the swarm kept changing")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def port_changes(side: str, journal: str, n: list[int]):
    """W1-W3 as changes of the port's document (bench-tick's)."""
    ikey = f"bench-{side}"

    def w1(doc):
        best, bg = None, -1
        for k, v in doc["sections"]["executions"].items():
            g = v.get("generation", 0) if isinstance(v, dict) else 0
            if g > bg:
                best, bg = k, g
        doc["sections"]["intents"][ikey] = {"kind": "bench", "picked": best, "n": n[0]}

    def w2(doc):
        v = doc["sections"]["journals"][journal]
        v["bench_n"] = v.get("bench_n", 0) + 1

    def w3(doc):
        secs, seen = doc["sections"], 0
        for name in list(secs):
            for _k, _v in secs[name].items():
                seen += 1
        secs["intents"][ikey] = {"kind": "bench", "seen": seen, "n": n[0]}
    return {"W1": w1, "W2": w2, "W3": w3}


def inhouse_changes(journal: str, read_sections: list[str], n: list[int]):
    ikey = "bench-inhouse"

    def w1(view):
        best, bg = None, -1
        for k, v in view.items("executions"):
            g = v.get("generation", 0) if isinstance(v, dict) else 0
            if g > bg:
                best, bg = k, g
        view.put("intents", ikey, {"kind": "bench", "picked": best, "n": n[0]})

    def w2(view):
        v = view.get("journals", journal)
        v["bench_n"] = v.get("bench_n", 0) + 1
        view.put("journals", journal, v)

    def w3(view):
        seen = 0
        for name in read_sections:
            for _k, _v in view.items(name):
                seen += 1
        view.put("intents", ikey, {"kind": "bench", "seen": seen, "n": n[0]})
    return {"W1": w1, "W2": w2, "W3": w3}


def contended(p: port.Port, r, sha: str, fence, secs: list[str], cycles: int) -> None:
    """W1 whose put bumps the execution it picked, from the port (its view)
    and from the in-house port on one swarm at once, ``cycles`` each in two
    threads: how often each side ends KeptChanging (16 attempts), and its
    reruns. Counts only; nothing asserted."""
    import threading

    slug = "tick-views"
    counts = {"port": [0, 0], "inhouse": [0, 0]}  # kept changing, attempts

    def pick(items):
        best, bg = None, -1
        for k, v in items:
            g = v.get("generation", 0) if isinstance(v, dict) else 0
            if g > bg:
                best, bg = k, g
        return best

    def port_side() -> None:
        def change(doc):
            counts["port"][1] += 1
            ex = doc["sections"]["executions"]
            best = pick(ex.items())
            v = ex[best]
            v["bench_bump"] = v.get("bench_bump", 0) + 1
        for _ in range(cycles):
            try:
                p.write(slug, change, fence)
            except port.KeptChanging:
                counts["port"][0] += 1

    def inhouse_side() -> None:
        def change(view):
            counts["inhouse"][1] += 1
            best = pick(view.items("executions"))
            v = view.get("executions", best)
            v["bench_bump"] = v.get("bench_bump", 0) + 1
            view.put("executions", best, v)
        for _ in range(cycles):
            try:
                inhouse_write(r, sha, slug, secs, change, fence)
            except RuntimeError:
                counts["inhouse"][0] += 1

    threads = [threading.Thread(target=port_side), threading.Thread(target=inhouse_side)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for side, (kept, attempts) in counts.items():
        print(f"under a live writer on one swarm: {side:8s} KeptChanging {kept} of {cycles}, reruns {attempts - cycles}")


@contextlib.contextmanager
def started_fenced(prefix: str):
    """A redis-server and a fenced (FENCED_BIN, else built here) on loopback ports, in a temporary directory named
    by prefix: yields a fenced.Client of it and Redis's port; both processes are ended (by the handles started here)
    on the way out."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    binary = pathlib.Path(os.environ["FENCED_BIN"]) if os.environ.get("FENCED_BIN") else work / "fenced"
    if not os.environ.get("FENCED_BIN"):
        subprocess.run(["go", "build", "-o", str(binary), "./cmd/fenced"], cwd=ROOT, check=True, timeout=600)
    rport = free_port()
    redis_proc = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    log = work / "fenced.log"
    with open(log, "wb") as logf:
        server = subprocess.Popen(
            [str(binary), "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--drain-delay", "0s",
             "--redis-url", f"redis://127.0.0.1:{rport}"], stdout=logf, stderr=subprocess.STDOUT)
    try:
        addr: list[str] = []

        def serving() -> bool:
            m = re.search(r'msg="serving gRPC" addr=(\S+)', log.read_text(errors="replace"))
            if m:
                addr.append(m.group(1))
            return bool(m) or server.poll() is not None

        wait_for(serving, "fenced to serve")
        if not addr:
            raise SystemExit(log.read_text(errors="replace")[-3000:])
        yield fenced.Client(addr[0]), rport
    finally:
        server.terminate()
        server.wait(timeout=30)
        redis_proc.terminate()
        redis_proc.wait(timeout=30)


def load_fixture(client, sides: list[str]):
    """The fixture swarm (testdata/swarm-state.json) written into tick-<side> for each side, unfenced, and a lease
    of each: answers the fixture and each side's fence (owner, epoch)."""
    fx = json.loads((ROOT / "testdata" / "swarm-state.json").read_text())
    fences = {}
    for side in sides:
        slug = f"tick-{side}"
        for section, recs in sorted(fx["sections"].items()):
            keys = sorted(recs)
            for i in range(0, len(keys), 256):
                client.fenced_batch(slug, [fenced.Put(section, k, fenced.BLIND, json.dumps(recs[k])) for k in keys[i:i + 256]],
                                    fence=fenced.UNFENCED)
        lease = client.acquire(slug, f"bench-{slug}", ttl_ms=600_000)
        fences[side] = (lease.owner, lease.epoch)
    return fx, fences


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    try:
        import redis as redis_py
    except ImportError:
        redis_py = None
        print("python3-redis is not installed: the in-house side is left out (apt-get install -y python3-redis)")
    with started_fenced("fenced-bench-tick-") as (client, rport):
        sides = ["views", "noviews"] + (["inhouse"] if redis_py else [])
        fx, fences = load_fixture(client, sides)
        read_sections = sorted(s for s in fx["sections"] if s != "archive")
        journal = sorted(fx["sections"]["journals"])[0]
        n = [0]
        ports = {"views": port.Port(client), "noviews": port.Port(client, views=False)}
        cycles = {}
        for side in ("views", "noviews"):
            fns = port_changes(side, journal, n)
            p, slug, fence = ports[side], f"tick-{side}", fences[side]
            cycles[side] = {wl: (lambda f=f, p=p, slug=slug, fence=fence: p.write(slug, f, fence)) for wl, f in fns.items()}
        if redis_py:
            r = redis_py.Redis(host="127.0.0.1", port=rport)
            sha = r.script_load(INHOUSE_LUA)
            fns = inhouse_changes(journal, read_sections, n)
            secs = read_sections + ["meta"]
            cycles["inhouse"] = {wl: (lambda f=f: inhouse_write(r, sha, "tick-inhouse", secs, f, fences["inhouse"])) for wl, f in fns.items()}
        print(f"tick cycles: {rounds} rounds a workload, one cycle of each side in turn; load average {os.getloadavg()}")
        print(f"{'workload':8s} {'side':12s} {'median ms':>10s} {'least ms':>9s} {'CPU ms':>7s} {'in-house ÷ side':>16s}")
        for wl in ("W1", "W2", "W3"):
            for side in sides:  # one cycle each first: views listed, scripts loaded
                cycles[side][wl]()
            took: dict[str, list[float]] = {s: [] for s in sides}
            cpu: dict[str, float] = {s: 0.0 for s in sides}
            for _ in range(rounds):
                n[0] += 1
                for side in sides:
                    c0, t0 = time.process_time(), time.perf_counter()
                    cycles[side][wl]()
                    took[side].append((time.perf_counter() - t0) * 1000)
                    cpu[side] += (time.process_time() - c0) * 1000
            base = statistics.median(took["inhouse"]) if "inhouse" in took else None
            for side in sides:
                med = statistics.median(took[side])
                ratio = f"{base / med:16.2f}" if base else f"{'-':>16s}"
                print(f"{wl:8s} {side:12s} {med:10.1f} {min(took[side]):9.1f} {cpu[side] / rounds:7.1f} {ratio}")
        print(f"view of tick-views: {client.view('tick-views').memory_bytes() / 2**20:.1f} MB held; load average {os.getloadavg()}")
        if redis_py:
            contended(ports["views"], r, sha, fences["views"], read_sections + ["meta"], rounds * 10)
        client.close()


if __name__ == "__main__":
    main()
