"""A controller process for the paused-controller test (test_keeper.py).

Usage: paused_controller.py ADDR SLUG OWNER TTL_MS. It keeps the swarm's lease
with a LeaseKeeper and prints {"epoch": N}; then, on a line on stdin, writes
one record fenced by its keeper and prints what happened as JSON.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import fenced  # noqa: E402


def main() -> None:
    addr, slug, owner, ttl_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with fenced.Client(addr) as c:
        k = c.keep(slug, owner, ttl_ms=ttl_ms)
        print(json.dumps({"epoch": k.epoch}), flush=True)
        sys.stdin.readline()
        held = k.held()
        try:
            c.fenced_batch(slug, [fenced.Put("claims", "paused", 0, '"paused"')], fence=k.fence())
            write = "committed"
        except fenced.FencedError as e:
            write = type(e).__name__
        lost = k.lost.wait(60)
        print(json.dumps({"held": held, "write": write, "lost": lost, "error": type(k.error).__name__}), flush=True)
        k.close()


if __name__ == "__main__":
    main()
