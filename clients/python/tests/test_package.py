"""The package as users get it: the README's tick example runs, and pip installs it with no index."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import fenced
from conftest import PYCLIENT, Fenced


def readme_example() -> str:
    text = (PYCLIENT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"## Tick example\n.*?```python\n(.*?)```", text, re.S)
    assert m, "README.md has no tick example"
    return m.group(1)


def test_readme_tick_example_runs(server: Fenced, client: fenced.Client, slug: str, tmp_path: pathlib.Path) -> None:
    code = readme_example()
    assert len(code.strip().splitlines()) <= 22
    client.fenced_batch(slug, [fenced.Put("claims", "T-1", 0, '{"state":"done"}'), fenced.Put("claims", "T-2", 0, '{"state":"open"}')], fence=fenced.UNFENCED)
    env = dict(os.environ, FENCED_ADDR=server.addr, SWARM=slug, PYTHONPATH=str(PYCLIENT))
    for n in (1, 2):
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120)
        assert out.stdout.startswith("tick committed at revision "), out
        assert client.record(slug, "operations", "tick").json() == {"n": n}  # type: ignore[union-attr]
    assert client.record(slug, "claims", "T-1") is None and client.record(slug, "claims", "T-2") is not None
    assert not client.current(slug).live  # the keeper released the lease


def test_readme_tick_example_runs_right_after_the_tour(server: Fenced, client: fenced.Client, tmp_path: pathlib.Path) -> None:
    """Pasted right after the tour, which leaves demo-swarm leased to tick-b
    for 600 s, the example runs on its default swarm: one no page's grpcurl
    example leases."""
    code = readme_example()
    default = re.search(r'os\.environ\.get\("SWARM", "([^"]+)"\)', code)
    assert default, "the example names no default swarm"
    slugs = set()
    for page in ("README.md", "docs/tour.md", "docs/api.md", "docs/clients.md"):
        slugs |= set(re.findall(r'"slug":"([^"]+)"', (PYCLIENT.parents[1] / page).read_text(encoding="utf-8")))
    assert "demo-swarm" in slugs and default.group(1) not in slugs, (default.group(1), slugs)
    client.acquire("demo-swarm", "tick-b", ttl_ms=600_000)  # the tour's last lease
    env = {k: v for k, v in os.environ.items() if k != "SWARM"}
    env.update(FENCED_ADDR=server.addr, PYTHONPATH=str(PYCLIENT))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("tick committed at revision "), out


def test_pip_installs_without_an_index(tmp_path: pathlib.Path) -> None:
    # A copy, so that the build leaves nothing in the source tree.
    src = tmp_path / "src"
    shutil.copytree(PYCLIENT, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index", "--no-deps",
         "--target", str(target), str(src)],
        check=True, capture_output=True, timeout=300, cwd=tmp_path,
    )
    probe = "import fenced, fenced.v1.records_pb2_grpc as g; print(fenced.__file__); print(g.RecordsServiceStub.__name__)"
    out = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=str(target)), cwd=tmp_path,
                         check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert out == [str(target / "fenced" / "__init__.py"), "RecordsServiceStub"]
    assert (target / "fenced" / "py.typed").exists()
