"""Test fixtures: a real redis-server and a real `fenced serve` on loopback.

fenced is built from this repository (`go build ./cmd/fenced`) once per test
session, or taken from $FENCED_BIN. Every process a fixture starts is stopped
by that fixture. No test asserts how fast anything is: waits are bounded polls.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Callable, Iterator, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PYCLIENT = ROOT / "clients" / "python"
sys.path.insert(0, str(PYCLIENT))

import fenced  # noqa: E402

KEY_PREFIX = "agentihooks"

# WAIT_S bounds every poll; it guards against a hang, never measures speed.
WAIT_S = 60.0


def wait_until(cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll cond every 10 ms until it holds; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def swarm_key(slug: str, name: str) -> str:
    """A swarm's Redis key, as fenced names it (docs/design/02-redis-layout.md §2.1)."""
    return f"{KEY_PREFIX}:swarm:{{{slug}}}:fence:{name}"


class Redis:
    """A redis-server on 127.0.0.1, nothing persisted."""

    def __init__(self, workdir: pathlib.Path, *args: str) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server not found: apt-get install -y redis-server")
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = workdir
        self.args = args
        self.log = workdir / f"redis-{self.port}.log"
        self._start()

    def restart(self) -> None:
        """Stop and start again on the same port and directory: the data comes
        back from the last SAVE only (nothing is saved at shutdown)."""
        self.stop()
        self._start()

    def _start(self) -> None:
        workdir = self.dir
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--logfile", str(self.log), *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self._ping() or self.proc.poll() is not None, "redis-server to answer PING")
        if self.proc.poll() is not None:
            pytest.fail(f"redis-server exited: {self.log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _ping(self) -> bool:
        try:
            return self.cli("PING") == "PONG"
        except subprocess.CalledProcessError:
            return False

    def cli(self, *args: str) -> str:
        """Run one command with redis-cli; answer its raw output, stripped."""
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            check=True, capture_output=True, text=True, timeout=30,
        )
        return out.stdout.strip()

    def cli_last(self, *args: str, last: str) -> str:
        """cli with ``last`` as the command's last argument, read from stdin
        (redis-cli -x): an argument of any size (the command line takes at
        most 128 KiB one)."""
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "-x", *args],
            check=True, capture_output=True, timeout=30, input=last.encode(),
        )
        return out.stdout.decode().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_SERVING = re.compile(r'msg="serving gRPC" addr=(\S+)')


class Fenced:
    """A `fenced serve` on 127.0.0.1, port picked by the kernel."""

    def __init__(self, binary: pathlib.Path, redis: Redis, workdir: pathlib.Path, *args: str,
                 listen: str = "127.0.0.1:0") -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCED_", "AGENTIHOOKS_", "OTEL_"))}
        self.log = workdir / f"fenced-{redis.port}-{time.monotonic_ns()}.log"
        self._logf = open(self.log, "wb")
        # --redis-timeout 20s: a Redis slowed by a busy box must not answer a
        # test UNAVAILABLE (the default, 3 s, is hit under load), and 20 s is
        # still below the client's 30 s deadline, so a wait for Redis ends as
        # UNAVAILABLE first.
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--listen", listen, "--metrics-listen", "", "--drain-delay", "0s",
             "--redis-timeout", "20s", "--redis-url", redis.url, *args],
            stdin=subprocess.DEVNULL, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
        )
        found: list[str] = []

        def serving() -> bool:
            m = _SERVING.search(self.log.read_text(errors="replace"))
            if m:
                found.append(m.group(1))
            return bool(m) or self.proc.poll() is not None

        wait_until(serving, "fenced to log its address")
        if not found:
            pytest.fail(f"fenced exited: {self.log.read_text(errors='replace')[-3000:]}")
        self.addr = found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


def _go_build(out: pathlib.Path, pkg: str) -> pathlib.Path:
    if shutil.which("go") is None:
        pytest.fail("go not found: the tests build fenced from this repository (or set FENCED_BIN)")
    subprocess.run(["go", "build", "-o", str(out), pkg], cwd=ROOT, check=True, timeout=600)
    return out


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("fenced")


@pytest.fixture(scope="session")
def fenced_bin(workdir: pathlib.Path) -> pathlib.Path:
    """The fenced binary: $FENCED_BIN, else built from this repository."""
    if os.environ.get("FENCED_BIN"):
        return pathlib.Path(os.environ["FENCED_BIN"])
    return _go_build(workdir / "fenced", "./cmd/fenced")


@pytest.fixture(scope="session")
def redis(workdir: pathlib.Path) -> Iterator[Redis]:
    r = Redis(workdir / "redis")
    yield r
    r.stop()


@pytest.fixture(scope="session")
def server(fenced_bin: pathlib.Path, redis: Redis, workdir: pathlib.Path) -> Iterator[Fenced]:
    f = Fenced(fenced_bin, redis, workdir)
    yield f
    f.stop()


@pytest.fixture(scope="session")
def start_fenced(fenced_bin: pathlib.Path, workdir: pathlib.Path) -> Iterator[Callable[..., tuple[Fenced, Redis]]]:
    """Start another fenced with its own redis-server (stopped at session end)."""
    started: list[object] = []

    def start(
        *args: str, redis_args: tuple[str, ...] = (), prepare: Optional[Callable[[Redis], None]] = None
    ) -> tuple[Fenced, Redis]:
        """fenced serve with args, on a new redis-server with redis_args, which
        prepare (if given) sets up before fenced starts."""
        r = Redis(workdir / f"redis-extra-{len(started)}", *redis_args)
        started.append(r)
        if prepare is not None:
            prepare(r)
        f = Fenced(fenced_bin, r, workdir, *args)
        started.append(f)
        return f, r

    yield start
    for p in reversed(started):
        p.stop()  # type: ignore[attr-defined]


def one_node_cluster(r: Redis) -> None:
    """Make a redis-server started with cluster_args() a Redis Cluster of one node holding every slot."""
    r.cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
    wait_until(lambda: "cluster_state:ok" in r.cli("CLUSTER", "INFO"), "the one-node cluster to be ok")


def cluster_args() -> tuple[str, ...]:
    """redis-server arguments of a Redis Cluster node (its bus on a free port)."""
    return ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(free_port()))


@pytest.fixture
def client(server: Fenced) -> Iterator[fenced.Client]:
    with fenced.Client(server.addr, timeout=30) as c:
        yield c


_slugs = itertools.count(1)


@pytest.fixture
def slug(request: pytest.FixtureRequest) -> str:
    """A slug no other test of this session uses."""
    name = re.sub(r"[^A-Za-z0-9]", "-", request.node.name)[:100]
    return f"py{next(_slugs)}-{name}"


@pytest.fixture(scope="session")
def go_interop(workdir: pathlib.Path) -> Optional[pathlib.Path]:
    """The Go client helper of the interop test (tests/interop), built once."""
    return _go_build(workdir / "interop", "./clients/python/tests/interop")
