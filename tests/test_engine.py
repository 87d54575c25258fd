"""The replay engine end to end against the embedded simulator over real HTTP.

The simulator's truth log (what actually reached the server, with its own clock) is the
referee: lanes, request accounting and think times are checked against it and against the
request records, never against the engine's own counters alone.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from agentx.records import read_records
from agentx.run import RunConfig, run
from agentx.targets.embedded import EmbeddedSim
from agentx.verdict.run_summary import max_overlap
from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]
FAST = {"profile": "cpu-tiny", "time_scale": 20.0}


def truth(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]


def _cfg(tmp_path: Path, trace: Path, **kw) -> tuple[RunConfig, EmbeddedSim]:
    sim = dict(FAST)
    sim["truth_log"] = str(tmp_path / "truth.jsonl")
    sim.update(kw.pop("sim", {}))
    base = dict(trace=str(trace), conc=3, duration_s=4.0, seed=1, think_scale=0.05,
                output_dir=str(tmp_path / "out"), progress=False, scrape_interval_s=1.0,
                drain_timeout_s=10.0)
    base.update(kw)
    cfg = RunConfig(**base)
    return cfg, EmbeddedSim(sim, api_key=cfg.secret_key(), pin=cfg.golden_al)


def test_lanes_bound_sessions_and_requests(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.2, subagent_at=3)
    s = run(*_cfg(tmp_path, trace, conc=3, duration_s=5.0))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    assert s["completed"] > 20 and s["failed"] == 0
    assert s["client"]["max_sessions_active"] == 3
    assert s["client"]["max_in_flight"] <= 3
    assert {r["lane"] for r in recs} == {0, 1, 2}
    # independent check on the records' own intervals: never more than 3 requests at once
    assert max_overlap([(r["start_ns"], r["end_ns"]) for r in recs]) <= 3
    # subagents ran inside their parent's lane, and the parent waited for them
    subs = [r for r in recs if r["subagent"]]
    assert subs
    by_lane = defaultdict(list)
    for r in recs:
        by_lane[r["lane"]].append(r)
    for lane_recs in by_lane.values():
        assert max_overlap([(r["start_ns"], r["end_ns"]) for r in lane_recs]) == 1


def test_every_started_request_recorded_exactly_once(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.1, out=200)
    cfg = _cfg(tmp_path, trace, conc=4, duration_s=3.0, drain_timeout_s=0.2,
               sim={"fail_rate": 0.15, "fail_kinds": ["500", "429", "reset", "malformed"]})
    s = run(*cfg)
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids))
    arrived = {t["request_id"] for t in truth(tmp_path / "truth.jsonl")}
    # everything that reached the server is in our records; what we recorded as sent and
    # not refused at connect reached the server
    assert arrived <= set(ids)
    assert {r["request_id"] for r in recs if r["error"] != "connect"} == arrived
    assert s["failed"] > 0 and s["completed"] > 0
    # completed, failed, cancelled and warm-up partition the records
    assert s["completed"] + s["failed"] + s["cancelled"] + s["warmup_requests"] == len(recs)
    assert set(s["errors"]) <= {"http_500", "http_429", "reset", "malformed", "incomplete"}


def test_think_time_scaled_and_capped(tmp_path):
    trace = write_trace(tmp_path / "tr", sessions=2, turns=6, think=4.0, out=5)
    for scale, cap, expect in ((0.1, 300.0, 0.4), (1.0, 0.25, 0.25)):
        out = tmp_path / f"o{scale}"
        run(*_cfg(tmp_path, trace, conc=1, duration_s=3.0, think_scale=scale, max_think_s=cap,
                 output_dir=str(out), start_min=0.0, start_max=0.0))
        recs = sorted(read_records(out / "requests.jsonl"), key=lambda r: r["start_ns"])
        # end of one answer -> the engine's intended send of the next turn = the think time
        gaps = [(b["intended_send_ns"] - a["end_ns"]) / 1e9 for a, b in zip(recs, recs[1:])
                if a["session_id"] == b["session_id"]]
        assert len(gaps) >= 3
        assert min(gaps) >= expect - 0.005, (scale, cap, gaps)  # never shorter than asked
        assert statistics.median(gaps) <= expect + 0.03, (scale, cap, gaps)


@pytest.mark.alone  # timing: the median dispatch lag
def test_a_lane_goes_on_with_its_next_session_at_once(tmp_path):
    """The next session is opened while the current one's last turn runs: its first request
    is due when the last response ends, and goes then (the history build is not in it)."""
    trace = write_trace(tmp_path / "tr", sessions=4, turns=3, think=0.3, out=5)
    run(*_cfg(tmp_path, trace, conc=2, duration_s=4.0, think_scale=0.2))
    recs = sorted(read_records(tmp_path / "out" / "requests.jsonl"),
                  key=lambda r: r["intended_send_ns"])
    by_lane = defaultdict(list)
    for r in recs:
        by_lane[r["lane"]].append(r)
    gaps = [(b["intended_send_ns"] - a["end_ns"]) / 1e6
            for lane_recs in by_lane.values() for a, b in zip(lane_recs, lane_recs[1:])
            if a["session_id"] != b["session_id"] and b["start_ns"]]
    assert len(gaps) >= 4, gaps
    assert max(gaps) < 20.0, gaps  # ms: the bookkeeping after a response, nothing more
    assert statistics.median(r["dispatch_lag_ms"] for r in recs if r["start_ns"]) < 5.0


def test_warmup_requests_flagged_and_excluded(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.05)
    s = run(*_cfg(tmp_path, trace, conc=2, duration_s=3.0, warmup_s=1.0))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    primes = [r for r in recs if r["kind"] == "prime"]
    assert primes and all(r["warmup"] for r in primes)
    t0 = min(r["intended_send_ns"] for r in recs)
    late = [r for r in recs if r["kind"] == "turn" and r["intended_send_ns"] - t0 > 1.1e9]
    early = [r for r in recs if r["intended_send_ns"] - t0 < 0.9e9]
    assert early and all(r["warmup"] for r in early)
    assert late and not any(r["warmup"] for r in late)
    measured_ok = [r for r in recs if r["ok"] and not r["warmup"]]
    assert s["completed"] == len(measured_ok)
    assert s["warmup_requests"] == sum(r["warmup"] for r in recs)
    assert s["ttft_ms"]["count"] == len(measured_ok)


def test_sigint_drains_and_writes_summary(tmp_path):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group, the embedded
    simulator's process included. The run drains against a simulator still serving."""
    trace = write_trace(tmp_path / "tr", think=0.05, out=400)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "bench.py"), "--trace", str(trace), "--conc", "4",
           "--duration", "60", "--output-dir", str(out), "--no-progress",
           "--sim-profile", "cpu-tiny", "--sim-time-scale", "5", "--drain-timeout", "2"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (out / "requests.jsonl").exists() and (out / "requests.jsonl").stat().st_size > 0:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    t_int = time.time()
    os.killpg(p.pid, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr.decode()[-2000:]  # interrupted (docs/reliability.md)
    assert time.time() - t_int < 20  # bounded drain, not the 60 s duration
    summary = json.loads((out / "summary.json").read_text())
    recs = read_records(out / "requests.jsonl")
    assert summary["stop_reason"] == "signal"
    assert summary["completed"] > 0
    assert len({r["request_id"] for r in recs}) == len(recs)
    # nothing failed because the server went away: finished, or cancelled at the drain limit
    assert all(r["ok"] or r["error"] == "cancelled" for r in recs), \
        {r["error"] for r in recs if not r["ok"]}


def test_max_requests_and_reproducible_schedule(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.0)
    runs = []
    for i in range(2):
        out = tmp_path / f"o{i}"
        run(*_cfg(tmp_path, trace, conc=2, duration_s=None, max_requests=12,
                 output_dir=str(out)))
        runs.append(read_records(out / "requests.jsonl"))
    assert all(len(r) == 12 for r in runs)
    sched = [sorted((r["lane"], r["trace_id"], r["turn"], r["isl_intended"]) for r in rr)
             for rr in runs]
    assert sched[0] == sched[1]


def test_api_key_never_reaches_results(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.0)
    secret = "sk-test-" + os.urandom(8).hex()
    run(*_cfg(tmp_path, trace, conc=1, duration_s=None, max_requests=3, api_key=secret))
    for f in (tmp_path / "out").iterdir():
        assert secret not in f.read_text(errors="replace")


def test_workers_split_lanes_and_merge_records(tmp_path):
    trace = write_trace(tmp_path / "tr", think=0.1)
    s = run(*_cfg(tmp_path, trace, conc=4, duration_s=4.0, workers="2"))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    assert s["client"]["workers"] == 2
    assert len(s["client"]["cpu_util_per_worker"]) == 2
    assert {r["lane"] for r in recs} == {0, 1, 2, 3}
    assert len({r["request_id"] for r in recs}) == len(recs)
    assert [r["start_ns"] for r in recs] == sorted(r["start_ns"] for r in recs)
    assert s["completed"] > 10 and s["failed"] == 0
    assert s["client"]["max_in_flight"] <= 4
    arrived = {t["request_id"] for t in truth(tmp_path / "truth.jsonl")}
    assert arrived == {r["request_id"] for r in recs}
    assert not list((tmp_path / "out").glob("requests.w*.jsonl"))


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_thinking_mode_reaches_the_server(tmp_path, thinking):
    trace = write_trace(tmp_path / "tr", think=0.0, out=30)
    s = run(*_cfg(tmp_path, trace, conc=2, duration_s=None, max_requests=8, thinking=thinking,
                 min_samples=1))  # 8 requests: the thinking check, not the sample count
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    reasoning = sum(r["reasoning_tokens"] for r in recs)
    assert (reasoning > 0) is (thinking == "on")
    assert all(r["osl"] == r["osl_intended"] for r in recs if r["ok"])
    # TTFC (first visible answer token) comes after TTFT when the model thinks first
    if thinking == "on":
        assert all(r["ttfc_ms"] >= r["ttft_ms"] for r in recs if r["ok"])
    assert s["validation"]["verdict"] in ("pass", "fail")
    thinking_check = [c for c in s["validation"]["checks"] if c["name"] == "thinking_mode"]
    assert thinking_check and thinking_check[0]["ok"] is True


def test_merging_record_files_survives_a_writer_killed_mid_line(tmp_path):
    """The one merge (live worker files, and `agentx report` on a killed run): ordered by start,
    each request once, a cut-off line skipped rather than losing every other record, flagged
    against the run's warm-up end, parts removed and `dest` kept."""
    import orjson

    from agentx.rundir import merge_record_files

    def row(rid: str, start: int, warm: bool = False) -> bytes:
        return orjson.dumps({"request_id": rid, "start_ns": start, "intended_send_ns": start,
                             "warmup": warm}) + b"\n"

    dest, w0, w1 = tmp_path / "requests.jsonl", tmp_path / "requests.w0.jsonl", tmp_path / "requests.w1.jsonl"
    dest.write_bytes(row("a", 30))
    w0.write_bytes(row("b", 20) + row("a", 30))  # "a" already merged once
    w1.write_bytes(row("c", 10) + row("d", 40) + b'{"request_id": "e", "sta')  # killed mid-line
    n, bad = merge_record_files([dest, w0, w1], dest, warm_until_ns=25)
    rows = read_records(dest)
    assert (n, bad) == (4, 1) and [r["request_id"] for r in rows] == ["c", "b", "a", "d"]
    assert [r["warmup"] for r in rows] == [True, True, False, False]
    assert dest.exists() and not w0.exists() and not w1.exists()
    assert not list(tmp_path.glob("*.tmp"))
