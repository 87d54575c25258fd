"""The wheel is self-contained: built from this checkout, installed into a fresh venv and run
from a directory outside the repo, it still has the built-in `swe` trace and the simulator
profiles (package data, not files beside a checkout)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def _sh(*argv: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENTX_TRACES_DIR")}
    p = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(bin dir of a fresh venv holding only the wheel (its dependencies: this environment's),
    a dir outside the repo)."""
    root = tmp_path_factory.mktemp("wheel")
    # build from a copy of what the wheel is made of: pip builds in the source tree, and a
    # stale build/ there could add modules that no longer exist
    src = root / "src"
    for name in ("agentx", "traces", "recipes"):
        shutil.copytree(REPO / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    dist = root / "dist"
    _sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src, cwd=root)
    wheels = list(dist.glob("agentx_bench-*.whl"))
    assert len(wheels) == 1, wheels
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    # only the wheel is installed here; its dependencies are this environment's (the same
    # pyproject list `pip install -e .` installed), seen through a .pth line after the venv's
    # own site-packages, so the wheel's agentx is the one imported. Installing them again
    # cost 100-140 s of CI CPU per run for nothing the wheel ships.
    _sh(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-compile", wheels[0],
        cwd=root)
    site = next((root / "venv" / "lib").glob("python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz_agentx_test_deps.pth").write_text("\n".join(deps) + "\n")
    where = _sh(bin_dir / "python", "-c", "import agentx, numpy; print(agentx.__file__)",
                cwd=root).stdout
    assert where.startswith(str(site)), where  # the wheel's agentx, not the checkout's
    work = root / "work"
    work.mkdir()
    return bin_dir, work


def test_wheel_ships_the_builtin_trace(installed):
    bin_dir, work = installed
    out = _sh(bin_dir / "agentx", "trace", "stats", "swe", cwd=work).stdout
    assert "trace swe: 500 sessions" in out, out


def test_wheel_runs_against_the_embedded_simulator(installed):
    bin_dir, work = installed
    # the installed wheel runs and records; its verdict (thin 5 s run, shared CPU) is not the subject
    _sh(bin_dir / "agentx", "run", "--trace", "swe", "--conc", "4", "--duration", "5",
        "--max-think", "0.2", "--sim-time-scale", "20", "--no-progress", "--validate", "warn",
        "-o", "out", cwd=work)
    summary = json.loads((work / "out" / "summary.json").read_text())
    assert summary["completed"] > 0 and summary["failed"] == 0, summary
    assert (work / "out" / "requests.jsonl").stat().st_size > 0
    site = bin_dir.parent / "lib"
    assert list(site.glob("python*/site-packages/agentx/_traces/swe.tar.xz"))
    assert list(site.glob("python*/site-packages/agentx/sim/profiles/*.yaml"))
