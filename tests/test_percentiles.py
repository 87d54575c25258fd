"""`--percentiles`: parsing and key names as pure functions, then real short runs against the
embedded simulator through the command line: summary.json, the console table, runs.csv (via
`agentx report`) and ab.json carry the chosen percentiles, computed by numpy's rule from the
run's own records."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from agentx.metrics.percentiles import parse_percentiles, pct_key
from agentx.metrics.summary import measured
from agentx.records import read_records
from helpers import write_trace

SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20"]
QUICK = ["--conc", "2", "--max-requests", "16", "--duration", "0", "--max-think", "0",
         "--no-progress", "--scrape-interval", "0", "--validate", "off", *SIM]
CHOSEN = "99.9,50,90,95,99,90"  # unsorted, with a duplicate


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("pct") / "tr", sessions=8, turns=6, think=0.0)


def test_parse_sorts_dedupes_and_names_keys():
    assert parse_percentiles(CHOSEN) == [50.0, 90.0, 95.0, 99.0, 99.9]
    assert parse_percentiles([100, 0.5]) == [0.5, 100.0]
    assert [pct_key(q) for q in (50, 50.0, 99.9, 99.99, 0.5, 100)] == \
        ["p50", "p50", "p99_9", "p99_99", "p0_5", "p100"]
    for bad, word in (("0,50", "outside"), ("101", "outside"), ("-5", "outside"),
                      ("p99", "not a number"), (",", "no percentile")):
        with pytest.raises(ValueError, match=word):
            parse_percentiles(bad)


@pytest.mark.parametrize("bad", ["0,50", "50,100.5", "ninety"])
def test_bad_percentiles_are_one_line_naming_the_flag(cli, tmp_path, trace, bad):
    for cmd in (["run", "--trace", trace, "-o", tmp_path / "x"], ["report", tmp_path]):
        r = cli(*cmd, "--percentiles", bad)
        assert r.returncode == 2, r
        assert len(r.stderr.strip().splitlines()) == 1 and "--percentiles" in r.stderr, r.stderr


def test_run_writes_and_shows_the_chosen_percentiles(cli, tmp_path, trace):
    out = tmp_path / "run"
    r = cli("run", "--trace", trace, "-o", out, "--percentiles", CHOSEN, *QUICK)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["percentiles"] == [50, 90, 95, 99, 99.9]
    assert s["config"]["percentiles"] == [50, 90, 95, 99, 99.9]
    ttft = [x["ttft_ms"] for x in measured(read_records(out / "requests.jsonl"))]
    assert len(ttft) == s["ttft_ms"]["count"] > 0
    for q in (50, 95, 99.9):
        assert s["ttft_ms"][pct_key(q)] == pytest.approx(float(np.percentile(ttft, q)))
    assert s["ttft_ms"]["p10"] is not None  # the fixed keys stay for other readers
    header = next(ln for ln in r.stdout.splitlines() if "metric" in ln and "mean" in ln)
    assert [c for c in ("p50", "p90", "p95", "p99", "p99.9") if c in header] == \
        ["p50", "p90", "p95", "p99", "p99.9"]

    # without --percentiles: the default columns, and no p99_9 key
    plain = tmp_path / "plain"
    r2 = cli("run", "--trace", trace, "-o", plain, *QUICK)
    assert r2.returncode == 0, r2.stderr
    s2 = json.loads((plain / "summary.json").read_text())
    assert s2["percentiles"] is None and "p99_9" not in s2["ttft_ms"]
    header2 = next(ln for ln in r2.stdout.splitlines() if "metric" in ln and "mean" in ln)
    assert "p95" not in header2 and "p99" in header2

    # report: runs.csv columns follow each run's percentiles, or report's own (from records)
    r3 = cli("report", out, plain, "--no-plots", "-o", tmp_path / "rep")
    assert r3.returncode == 0, r3.stderr
    rows = list(csv.DictReader((tmp_path / "rep" / "runs.csv").open()))
    assert "ttft_p99_9_ms" in rows[0] and "tpot_p95_ms" in rows[0] and "ttft_p90_ms" in rows[0]
    by_run = {Path(row["run"]).name: row for row in rows}
    assert float(by_run["run"]["ttft_p99_9_ms"]) == pytest.approx(s["ttft_ms"]["p99_9"])
    assert by_run["plain"]["ttft_p99_9_ms"] == ""  # that run did not compute it
    r4 = cli("report", out, plain, "--no-plots", "-o", tmp_path / "rep2",
             "--percentiles", "75,99.9")
    assert r4.returncode == 0, r4.stderr
    rows = list(csv.DictReader((tmp_path / "rep2" / "runs.csv").open()))
    # the catalog's columns stay (tools read them), the chosen ones join them
    assert [k for k in rows[0] if re.match(r"ttft_p\d", k)] == \
        ["ttft_p50_ms", "ttft_p75_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_p99_9_ms"]
    plain_ttft = [x["ttft_ms"] for x in measured(read_records(plain / "requests.jsonl"))]
    row = next(x for x in rows if Path(x["run"]).name == "plain")
    assert float(row["ttft_p99_9_ms"]) == pytest.approx(float(np.percentile(plain_ttft, 99.9)))
    r5 = cli("report", plain, "--no-plots", "--percentiles", "75,99.9")
    header5 = next(ln for ln in r5.stdout.splitlines() if "metric" in ln and "mean" in ln)
    assert "p75" in header5 and "p99.9" in header5 and "p50" not in header5


def test_ab_compares_the_chosen_percentiles(cli, tmp_path, trace):
    out = tmp_path / "ab"
    r = cli("ab", "--a", "tiny-cpu", "--b", "tiny-cpu", "--sim", "--trace", trace, "-o", out,
            "--conc", "2", "--max-requests", "12", "--duration", "0", "--max-think", "0",
            "--no-progress", "--scrape-interval", "0", "--validate", "off", "--bootstrap", "200",
            "--sim-time-scale", "20", "--percentiles", "50,99.9")
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "ab.json").read_text())
    keys = [k for k in doc["metrics"] if re.match(r"ttft_p\d", k)]
    assert keys == ["ttft_p50_ms", "ttft_p99_9_ms"]
    assert doc["metrics"]["ttft_p99_9_ms"]["label"] == "TTFT p99.9 ms"
    assert "TTFT p99.9 ms" in r.stdout
    a = [x["ttft_ms"] for x in measured(read_records(Path(doc["a"]["runs"][0])
                                                      / "requests.jsonl"))]
    assert doc["metrics"]["ttft_p99_9_ms"]["a"] == pytest.approx(float(np.percentile(a, 99.9)))
