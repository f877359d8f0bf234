"""Profile: the client CPU of a tick's cycle (W1-W3 of ../shared/bench-tick)
through fenced.port reading from its view, against the in-house port's path,
and where the port's time goes.

Starts a redis-server and a `fenced serve` (built from this repository, or
$FENCED_BIN) on loopback, loads testdata/swarm-state.json into one swarm per
side, then per workload ROUNDS rounds of one cycle of each side in turn
(bench_tick.py's cycles), printing each side's CPU ms a cycle
(time.process_time: the view's thread included) and the ratio of the two;
then cProfile (by CPU time) of PROFILED cycles of the port, the top costs.
Needs Debian's python3-redis. A profile, not a test: compare only within
one run.

    /usr/bin/python3 clients/python/tools/profile_tick.py [rounds [profiled [W1,W3]]]   # 20 5 W1,W3
"""

from __future__ import annotations

import cProfile
import io
import os
import pathlib
import pstats
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_tick as bt  # noqa: E402
import redis as redis_py  # noqa: E402

from fenced import port  # noqa: E402


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    profiled = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    wls = sys.argv[3].split(",") if len(sys.argv) > 3 else ["W1", "W3"]
    with bt.started_fenced("fenced-profile-tick-") as (client, rport):
        fx, fences = bt.load_fixture(client, ["views", "inhouse"])
        read_sections = sorted(s for s in fx["sections"] if s != "archive")
        journal = sorted(fx["sections"]["journals"])[0]
        n = [0]
        p = port.Port(client)
        r = redis_py.Redis(host="127.0.0.1", port=rport)
        sha = r.script_load(bt.INHOUSE_LUA)
        secs = read_sections + ["meta"]
        cycles = {
            "port": {wl: (lambda f=f: p.write("tick-views", f, fences["views"])) for wl, f in bt.port_changes("views", journal, n).items()},
            "inhouse": {wl: (lambda f=f: bt.inhouse_write(r, sha, "tick-inhouse", secs, f, fences["inhouse"]))
                        for wl, f in bt.inhouse_changes(journal, read_sections, n).items()},
        }
        print(f"client CPU ms a cycle, {rounds} rounds a workload; load average {os.getloadavg()}")
        for wl in wls:
            for side in cycles:  # one cycle each first: the view listed, the script loaded
                cycles[side][wl]()
            cpu: dict[str, list[float]] = {s: [] for s in cycles}
            for _ in range(rounds):
                n[0] += 1
                for side in cycles:
                    c0 = time.process_time()
                    cycles[side][wl]()
                    cpu[side].append((time.process_time() - c0) * 1000)
            pm, im = statistics.mean(cpu["port"]), statistics.mean(cpu["inhouse"])
            print(f"{wl}: port {pm:.1f} (median {statistics.median(cpu['port']):.1f})  in-house {im:.1f} "
                  f"(median {statistics.median(cpu['inhouse']):.1f})  port / in-house {pm / im:.2f}")
        for wl in wls if profiled else ():
            prof = cProfile.Profile(time.process_time)
            for _ in range(profiled):
                n[0] += 1
                prof.enable()
                cycles["port"][wl]()
                prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
            print(f"--- {wl}, the port, {profiled} cycles (cProfile, CPU time)")
            print(out.getvalue().split("\n\n", 1)[-1].strip())
        print(f"view of tick-views: {client.view('tick-views').memory_bytes() / 2**20:.1f} MB held; load average {os.getloadavg()}")
        client.close()


if __name__ == "__main__":
    main()
