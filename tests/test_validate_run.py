"""`--validate strict` end to end: a run whose measurements contradict its configuration
exits 3 with the reason in summary.json; a consistent one exits 0. Against the simulator,
run as a separate server process, with synthetic speculative acceptance (its /metrics are
vLLM's)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port, wait_healthy, write_trace

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sim_url():
    """The simulator as its own process (as a real server is), with synthetic acceptance."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "agentx.sim", "--port", str(port),
                          "--profile", "cpu-tiny", "--spec-k", "3",
                          "--synthetic-al", "2.5"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        p.terminate()
        p.wait(10)


def _bench(tmp_path: Path, url: str, expect_al: float, name: str) -> tuple[int, dict, str]:
    trace = write_trace(tmp_path / "tr", think=0.0, out=200)
    out = tmp_path / name
    cmd = [sys.executable, str(REPO / "bench.py"), "--trace", str(trace), "--conc", "2",
           "--duration", "0", "--max-requests", "48", "--output-dir", str(out),
           "--no-progress", "--base-url", url, "--scrape-interval", "1",
           "--validate", "strict", "--expect-al", str(expect_al), "--al-tolerance", "0.1",
           # this test is about the AL check; a shared CI core must not add `client-bound`
           "--loop-lag-threshold", "1000"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    summary = json.loads((out / "summary.json").read_text())
    return p.returncode, summary, p.stdout + p.stderr


@pytest.mark.parametrize("expect_al,code", [(2.5, 0), (3.5, 3)])
def test_strict_validation_exit_code(tmp_path, sim_url, expect_al, code):
    rc, summary, output = _bench(tmp_path, sim_url, expect_al, f"al{expect_al}")
    v = summary["validation"]
    al = summary["server_metrics"]["spec_decode"]["acceptance_length"]
    assert abs(al - 2.5) < 0.1  # what the simulator was told to do
    assert rc == code, output[-2000:]
    assert v["verdict"] == ("pass" if code == 0 else "fail")
    if code:
        assert any("acceptance" in r.lower() or "al" in r.lower() for r in v["reasons"])
        assert "validation: fail" in output
