"""Live progress answers "how long, and is it healthy?": a real short run against the embedded
simulator (faults injected) prints, on a pipe, a plain line at each phase change, in order,
with the time left going down and the errors counted as they happen."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from agentx.engine.lanes import LiveStats
from agentx.engine.workers import merge_live
from agentx.report.progress import PHASES, _table

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\[\s*([\d.]+)s\] (\S+) \| left (\S+) s.*\| in flight (\d+) \| done (\d+) \| "
                  r"since warm-up (\S+) req/s, \S+ output tok/s \| errors (\d+)")


def _progress(tmp_path: Path, *args: str) -> tuple[list[tuple[str, ...]], str, list[str]]:
    """Run `agentx run` on a pipe (a separate process: progress is printed for a pipe) against
    cpu-tiny at 20x; return its progress lines' fields, its stderr and its records' lines."""
    p = subprocess.run(
        [sys.executable, "-m", "agentx", "run", "--trace", "swe", *args, "--max-think", "0",
         "--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "--validate", "warn",
         "--scrape-interval", "1", "--output-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [m.groups() for m in map(LINE.match, p.stderr.splitlines()) if m]
    return lines, p.stderr, (tmp_path / "run" / "requests.jsonl").read_text().splitlines()


def test_plain_progress_shows_phases_time_left_and_errors(tmp_path):
    lines, stderr, records = _progress(
        tmp_path, "--conc", "2", "--duration", "8", "--ramp-up", "2", "--warmup", "4",
        "--sim-fail-rate", "0.2", "--sim-fail-kinds", "429,500", "--sim-seed", "3")
    phases = [g[1] for g in lines]
    seen = list(dict.fromkeys(phases))
    assert seen == ["ramp-up", "warm-up", "measuring", "draining", "done"] \
        or seen == ["ramp-up", "warm-up", "measuring", "done"], stderr  # a drain < 0.5 s
    assert [PHASES.index(x) for x in phases] == sorted(PHASES.index(x) for x in phases)
    left = [float(g[2]) for g in lines]
    assert left == sorted(left, reverse=True) and left[0] >= 6 and left[-1] == 0, left
    t = [float(g[0]) for g in lines]
    assert t == sorted(t) and 7 <= t[-1] < 12, t  # elapsed counts from the lanes' start
    errors, done = int(lines[-1][6]), int(lines[-1][4])
    assert errors > 0 and done > errors and float(lines[-1][5]) > 0
    assert int(lines[-1][3]) == 0  # done: nothing in flight
    assert done == len(records)  # every request the run recorded was counted live
    failed = [r for r in map(json.loads, records) if not r["ok"] and r["error"] != "cancelled"]
    assert errors == len(failed)  # the run's own cancellations are no errors


def test_worker_processes_report_one_run(tmp_path):
    """--workers 2: the parent's line adds up the processes' counters, phases in order, and
    the last line holds every worker's final counts (each sends them as it ends)."""
    lines, stderr, records = _progress(tmp_path, "--conc", "4", "--workers", "2",
                                       "--duration", "5", "--warmup", "2")
    phases = [g[1] for g in lines]
    assert phases[-1] == "done" and "measuring" in phases, stderr
    assert [PHASES.index(x) for x in phases] == sorted(PHASES.index(x) for x in phases)
    assert int(lines[-1][4]) == len(records) and int(lines[-1][3]) == 0


def test_rich_panel_has_the_same_answers():
    s = LiveStats(lanes=4, sessions_active=4, in_flight=3, done=50, errors=5, running=True,
                  ramp_up_s=1.0, warmup_end_s=2.0, duration_s=60.0, limit_s=60.0,
                  output_tokens=5000, window_done=42, window_output_tokens=4200)
    console = Console(width=100, record=True, force_terminal=False)
    console.print(_table(s, 30.0, "run"))
    text = console.export_text()
    for row in ("phase", "measuring", "remaining", "30 s", "requests in flight", "3",
                "throughput since the warm-up", "1.50 req/s, 150 output tok/s", "5 (10.0%)"):
        assert row in text, text


def test_workers_merge_into_one_run():
    """Two worker processes' stats: counters add up, the budget is the sum of the shares, the
    warm-up is over only when every worker's is, draining once one has stopped."""
    a = LiveStats(lanes=2, done=10, errors=1, output_tokens=100, running=True, start_wall=5.0,
                  ramp_up_s=1.0, warmup_end_s=3.0, duration_s=None, max_requests=20)
    b = LiveStats(lanes=2, done=12, errors=0, output_tokens=150, running=True, start_wall=5.0,
                  ramp_up_s=1.0, warmup_end_s=None, duration_s=None, max_requests=20,
                  stopping=True)
    s = LiveStats(lanes=4)
    merge_live(s, [asdict(a), asdict(b)])
    assert (s.done, s.errors, s.output_tokens, s.max_requests) == (22, 1, 250, 40)
    assert s.running and s.stopping and s.warmup_end_s is None and s.start_wall == 5.0
    b.warmup_end_s = 3.5
    merge_live(s, [asdict(a), asdict(b)])
    assert s.warmup_end_s == 3.5
