"""Stopping a run: the event-loop helpers (agentx.aio) and LaneEngine.request_stop behind the
signals of an in-process run and of worker processes, checked from the records written."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentx import aio
from agentx.records import read_records
from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]


def test_run_surfaces_an_import_error_raised_inside_the_run():
    async def failing() -> None:
        raise ImportError("no module named 'somewhere_deep'")

    with pytest.raises(ImportError, match="somewhere_deep"):
        aio.run(failing())


def test_run_and_new_event_loop_use_uvloop_when_installed():
    uvloop = pytest.importorskip("uvloop")

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert aio.run(loop_type()) is uvloop.Loop
    loop = aio.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_first_signal_drains_and_any_later_one_forces(capsys):
    calls: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        aio.install_stop_signals(loop, calls.append, "agentx: stopping")
        try:
            for n, sig in enumerate((signal.SIGINT, signal.SIGTERM, signal.SIGINT), 1):
                os.kill(os.getpid(), sig)
                for _ in range(200):
                    if len(calls) == n:
                        break
                    await asyncio.sleep(0.01)
        finally:
            aio.remove_stop_signals(loop)

    aio.run(main())
    assert calls == [False, True, True]
    assert capsys.readouterr().err.count("agentx: stopping") == 1


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """bench.py in its own process group, once its first records are on disk; a request of
    1500 tokens takes about 4 s on cpu-tiny at time scale 0.5, so the next ones are still in
    flight a second later."""
    trace = write_trace(tmp_path / "tr", think=0.05, out=1500)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "bench.py"), "--trace", str(trace), "--conc", "4",
           "--duration", "120", "--output-dir", str(out), "--no-progress",
           "--sim-profile", "cpu-tiny", "--sim-time-scale", "0.5", *extra]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline and p.poll() is None:
        if any(f.stat().st_size for f in out.glob("requests*.jsonl")):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    return p, out


def _finish(p: subprocess.Popen, out: Path) -> tuple[dict, list[dict]]:
    _, stderr = p.communicate(timeout=90)
    assert p.returncode == 130, stderr.decode()[-2000:]  # interrupted (docs/reliability.md)
    summary = json.loads((out / "summary.json").read_text())
    return summary, read_records(out / "requests.jsonl")


def test_one_ctrl_c_drains_worker_processes(tmp_path):
    """The terminal's SIGINT reaches the parent and both workers; the parent forwards it too.
    One Ctrl-C must drain: every in-flight request finishes (drain timeout 60 s), none is
    cancelled by the repeated forward."""
    p, out = _start(tmp_path, "--workers", "2", "--drain-timeout", "60")
    os.killpg(p.pid, signal.SIGINT)
    summary, recs = _finish(p, out)
    assert summary["stop_reason"] == "signal"
    assert summary["client"]["workers"] == 2
    assert recs and all(r["ok"] for r in recs), {r["error"] for r in recs if not r["ok"]}


def test_second_ctrl_c_cancels_in_flight_now(tmp_path):
    p, out = _start(tmp_path, "--drain-timeout", "60")
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(0.3)
    t_force = time.time()
    os.killpg(p.pid, signal.SIGINT)
    summary, recs = _finish(p, out)
    assert time.time() - t_force < 20  # not the 60 s drain
    assert summary["stop_reason"] == "signal"
    cancelled = [r for r in recs if not r["ok"]]
    assert cancelled and all(r["error"] == "cancelled" for r in cancelled)
