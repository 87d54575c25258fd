"""Per-session and per-turn results (metrics/sessions.py, report/sessions.py): a run on the
embedded simulator over HTTP writes them into summary.json, sessions.csv and turns.csv, and
each figure is checked against the raw records recomputed here, independently."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from agentx.metrics.sessions import busy_ns, pow2_bins, session_rows
from helpers import write_trace

SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "--no-progress",
       "--validate", "warn", "--scrape-interval", "0"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run: 2 lanes over 6 four-turn sessions with a subagent at turn 1, think 0.2 s."""
    from agentx.cli import main

    root = tmp_path_factory.mktemp("sessions")
    trace = write_trace(root / "tr", sessions=6, turns=4, think=0.2, out=20, subagent_at=1)
    out = root / "run"
    code = main(["run", "--trace", str(trace), "--conc", "2", "--max-requests", "60",
                 "--duration", "0", "--warmup", "0", "--start-min", "0", "--start-max", "0",
                 "-o", str(out), *SIM])
    assert code == 0
    return out


def _records(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines()]


def _csv(p: Path) -> list[dict]:
    with open(p) as f:
        return list(csv.DictReader(f))


def test_sessions_csv_matches_the_records(run_dir):
    recs = _records(run_dir)
    rows = _csv(run_dir / "sessions.csv")
    assert {"sessions.csv", "turns.csv"} <= set((run_dir / ".agentx-files").read_text().split())
    by_root: dict[str, list[dict]] = {}
    for r in recs:  # a subagent's id is <parent>.<agent>/<agent> (one level in this trace)
        sid = r["session_id"]
        if r["kind"] != "prime":
            by_root.setdefault(sid.split("/")[0].rsplit(".", 1)[0] if "/" in sid else sid,
                               []).append(r)
    assert {x["session_id"] for x in rows} == set(by_root)
    assert any(int(x["subagent_requests"]) for x in rows)  # subagents fold into their parent
    for x in rows:
        mine = by_root[x["session_id"]]
        own = [r for r in mine if "/" not in r["session_id"]]
        assert int(x["turns"]) == len(own) and int(x["requests"]) == len(mine)
        assert int(x["input_tokens"]) == sum(r["isl"] for r in mine if r["ok"])
        assert int(x["cached_tokens"]) == sum(r["cached_tokens"] for r in mine if r["ok"])
        wall = (max(r["end_ns"] for r in mine) - min(r["intended_send_ns"] for r in mine)) / 1e9
        assert float(x["wall_s"]) == pytest.approx(wall)
        assert float(x["server_s"]) + float(x["think_s"]) == pytest.approx(wall)
        # think time was 0.2 s per turn (max-think 30 s): a session of k turns thought k-1 times
        assert float(x["think_s"]) >= 0.2 * (len(own) - 1) * 0.9
        # the trace has 4 turns (0..3): complete iff its last turn was sent and answered
        assert (x["complete"] == "True") == (max(r["turn"] for r in own) == 3 and own[-1]["ok"])


def test_summary_per_session_counts_only_complete_measured_sessions(run_dir):
    s = json.loads((run_dir / "summary.json").read_text())
    rows = _csv(run_dir / "sessions.csv")
    counted = [x for x in rows if x["complete"] == "True" and x["measured"] == "True"]
    ps = s["per_session"]
    assert ps["sessions"] == len(rows) and ps["counted"] == len(counted) > 0
    assert ps["turns"]["count"] == len(counted)
    assert ps["wall_s"]["mean"] == pytest.approx(sum(float(x["wall_s"]) for x in counted)
                                                 / len(counted))
    assert ps["turns"]["max"] == max(int(x["turns"]) for x in counted)


def test_turns_csv_bins_every_measured_turn_once(run_dir):
    recs = _records(run_dir)
    s = json.loads((run_dir / "summary.json").read_text())
    meas = [r for r in recs if r["ok"] and not r["warmup"] and r["kind"] == "turn"
            and "/" not in r["session_id"]]
    rows = _csv(run_dir / "turns.csv")
    for axis, key in (("turn", lambda r: r["turn"]), ("context", lambda r: r["isl"])):
        bins = [b for b in rows if b["axis"] == axis]
        assert sum(int(b["n"]) for b in bins) == len(meas)
        for b in bins:
            inside = [r for r in meas if int(b["lo"]) <= key(r) <= int(b["hi"])]
            assert int(b["n"]) == len(inside)
            assert float(b["hit_rate"]) == pytest.approx(
                sum(r["cached_tokens"] for r in inside) / sum(r["isl"] for r in inside))
            ttfts = sorted(r["ttft_ms"] for r in inside)
            assert ttfts[0] <= float(b["ttft_p50_ms"]) <= ttfts[-1]
    assert [b["n"] for b in s["per_turn"]["by_turn"]] == \
        [int(b["n"]) for b in rows if b["axis"] == "turn"]


def test_report_shows_them_and_writes_them_for_an_older_run(run_dir, cli, tmp_path):
    old = tmp_path / "old"  # a run from before: no CSVs, no per_session in its summary
    old.mkdir()
    for name in ("requests.jsonl", "run.json", "summary.json"):
        (old / name).write_bytes((run_dir / name).read_bytes())
    doc = json.loads((old / "summary.json").read_text())
    del doc["per_session"], doc["per_turn"]
    (old / "summary.json").write_text(json.dumps(doc))
    r = cli("report", old, "--html")
    assert r.returncode == 0, r.stderr
    assert "sessions: " in r.stdout and "counted" in r.stdout
    assert _csv(old / "sessions.csv") == _csv(run_dir / "sessions.csv")
    assert (old / "per_turn.png").stat().st_size > 0
    page = (old / "report.html").read_text()
    assert "per session" in page and "measured requests by turn index" in page
    assert 'alt="per-turn TTFT and hit rate"' in page


def test_union_of_overlapping_requests_and_the_bins():
    assert busy_ns([(0, 10), (5, 12), (20, 25)]) == 17  # a subagent overlapping its parent
    assert busy_ns([]) == 0
    assert [pow2_bins(v) for v in (0, 1, 2, 3, 4, 7, 8, 100)] == \
        [(0, 0), (1, 1), (2, 3), (2, 3), (4, 7), (4, 7), (8, 15), (64, 127)]


def test_lane_rule_when_the_trace_is_unknown():
    def rec(sid: str, lane: int, turn: int, t: int, ok: bool = True) -> dict:
        return {"session_id": sid, "lane": lane, "turn": turn, "kind": "turn", "ok": ok,
                "warmup": False, "start_ns": t, "end_ns": t + 5, "intended_send_ns": t,
                "isl": 100, "isl_intended": 100, "osl": 5, "osl_intended": 5,
                "cached_tokens": 50, "ttft_ms": 1.0, "trace_id": "x"}
    rows = {x["session_id"]: x for x in session_rows(
        [rec("a", 0, 1, 1), rec("a", 0, 2, 10), rec("b", 0, 3, 20), rec("c", 1, 1, 1)])}
    assert rows["a"]["complete"] is True  # lane 0 moved on to b
    assert rows["b"]["complete"] is None and rows["c"]["complete"] is None  # may be cut


def test_report_goes_on_when_the_csvs_cannot_be_written(run_dir, cli, tmp_path):
    """A run directory the report may not write into (here: the temporary file's name is a
    directory) gets its report, with one line saying the CSVs were not written."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("requests.jsonl", "run.json", "summary.json"):
        (old / name).write_bytes((run_dir / name).read_bytes())
    (old / "sessions.csv.tmp").mkdir()
    r = cli("report", old, "--no-plots")
    assert r.returncode == 0, r.stderr
    assert "sessions.csv: not written" in r.stdout and "sessions: " in r.stdout
