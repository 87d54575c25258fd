"""`agentx sweep --search`: the SLO saturation search against the simulator (one server per
point, the bracket consistent with every cell it ran, the cell budget, the answer in sweep.json,
on the console and starred on pareto.png), the bisection's own rules, and `--resume` refusing a
cell recorded with another config."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentx.recipe.load import recipes_dir
from agentx.sweep.search import Probe, bisect, judge, parse_search

# the cpu-tiny simulator with two sequences at a time: requests queue from 3 lanes on, and
# TTFT climbs past 200 ms between 8 and 16 lanes (measured: goodput 0.97 at c8, 0 at c16)
# loop_lag_threshold_ms: the subject is the search, so a loop lag from machine load (a cell
# `fail`ed beside busy processes) never decides a verdict here
FAST = ["--sim", "--duration", "3", "--warmup", "0", "--set", "think_scale=0.01",
        "--set", "drain_timeout_s=2", "--set", "min_samples=5", "--set", "context_scale=0.1",
        "--set", "loop_lag_threshold_ms=1000"]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    data = yaml.safe_load((recipes_dir() / "tiny-cpu.yaml").read_text())
    data.pop("speculative")
    data.update(max_num_seqs=2, points=[{"tp": 1, "conc": [4, 32]}])
    path = tmp_path_factory.mktemp("recipe") / "queueing.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _sweep(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentx.cli", "sweep", *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.alone  # timing: tests/parallel.py
def test_search_brackets_the_saturation_on_one_server(tmp_path, recipe):
    out = tmp_path / "search"
    proc = _sweep(recipe, *FAST, "--search", "ttft:200,goodput:0.9", "--search-max-cells", 6,
                  "-o", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = _json(out / "sweep.json")
    search = record["search"]
    assert search["slo_ms"] == {"ttft": 200.0} and search["goodput_target"] == 0.9
    res = search["points"]["p0-tp1"]
    tried = res["cells"]
    assert res["bounds"] == [4, 32] and 2 <= len(tried) <= 6  # the cell budget
    assert [c["conc"] for c in record["cells"]] == [c["conc"] for c in tried]
    assert [c["conc"] for c in tried[:2]] == [4, 32]  # both ends first, then midpoints
    answer, failing = res["answer"], res["lowest_failing"]
    assert answer is not None and failing is not None and answer < failing
    # goodput falls with concurrency around the answer: every passing cell is at or below it,
    # every failing cell at or above the lowest failing one
    assert all(c["conc"] <= answer for c in tried if c["passed"])
    assert all(c["conc"] >= failing for c in tried if not c["passed"])
    assert not res["converged"] or failing == answer + 1
    for c in tried:  # each goodput is the cell's own summary's, the target decides
        s = _json(out / "p0-tp1" / f"c{c['conc']}" / "summary.json")
        assert c["goodput"] == s["goodput"]["met"]["all"]
        assert c["verdict"] == s["validation"]["verdict"]
        if c["passed"]:
            assert c["goodput"] >= 0.9 and c["verdict"] == "pass"
    assert not next(c for c in tried if c["conc"] == 32)["passed"]
    # one server for the point: started once, every cell ran against the same URL
    assert proc.stderr.count("starting the server") == 1
    urls = {_json(out / "p0-tp1" / f"c{c['conc']}" / "summary.json")["target"]["url"]
            for c in tried}
    assert len(urls) == 1
    # the console, the plot and the runs.csv row say which cell answers
    assert f"highest concurrency with goodput >= 0.9 (ttft <= 200 ms): c{answer} " \
           f"(c{failing} fails)" in proc.stderr
    assert search["marked_on"] == "pareto.png" and (out / "pareto.png").stat().st_size > 1000
    with open(out / "runs.csv") as f:
        marked = {int(r["conc"]) for r in csv.DictReader(f) if r["slo_answer"] == "True"}
    assert marked == {answer}
    s = _json(out / "p0-tp1" / f"c{answer}" / "summary.json")
    assert s["sweep"]["slo_answer"]["lowest_failing"] == failing


def test_resume_refuses_a_cell_recorded_with_another_config(tmp_path, recipe):
    out = tmp_path / "sweep"
    assert _sweep(recipe, *FAST, "--conc", 4, "-o", out).returncode == 0
    again = _sweep(recipe, *FAST, "--conc", 4, "-o", out, "--resume",
                   "--set", "think_scale=0.02")
    assert again.returncode == 2
    (line,) = again.stderr.strip().splitlines()
    assert "cell p0-tp1 c4" in line and "think_scale recorded 0.01, this sweep 0.02" in line
    same = _sweep(recipe, *FAST, "--conc", 4, "-o", out, "--resume")
    assert same.returncode == 0, same.stderr[-3000:]
    assert [c["status"] for c in _json(out / "sweep.json")["cells"]] == ["skipped"]


@pytest.mark.parametrize("text, message", [
    ("ttft:abc", "'abc' is not a number of ms"),
    ("ttft:200,goodput:1.5", "goodput: 1.5 is not a fraction in (0, 1]"),
    ("goodput:0.9", "no SLO given"),
    ("ttft:200 --search-min 8 --search-max 4", "--search-min 8 > --search-max 4"),
    (None, "need --search"),
])
def test_bad_search_is_one_line(tmp_path, recipe, text, message):
    args = ["--search", *text.split()] if text else ["--search-max", "8"]
    proc = _sweep(recipe, "--sim", *args, "-o", tmp_path / "x")
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_parse_search_default_target():
    assert parse_search("ttft:500,tpot:50") == ({"ttft": 500.0, "tpot": 50.0}, 0.9)
    assert parse_search("e2el:9000, goodput:0.95") == ({"e2el": 9000.0}, 0.95)


def _knee(limit: int, ran: list[int]):
    """A probe whose cells pass up to `limit`, recording the concurrencies it was asked for."""
    def probe(c: int) -> Probe:
        ran.append(c)
        return judge(c, "ok", "pass", 1.0 if c <= limit else 0.5, 0.9)
    return probe


@pytest.mark.parametrize("limit", [1, 5, 12, 31, 64])
def test_bisection_finds_the_knee_within_its_budget(limit):
    ran: list[int] = []
    out = bisect(1, 64, _knee(limit, ran), max_cells=9)
    assert out.converged and len(ran) <= 9 and len(set(ran)) == len(ran)
    assert out.answer == limit and out.failing == (None if limit == 64 else limit + 1)


def test_bisection_stops_at_the_budget():
    ran: list[int] = []
    out = bisect(1, 64, _knee(12, ran), max_cells=3)
    assert ran == [1, 64, 8] and not out.converged  # geometric midpoint of 1 and 64
    assert (out.answer, out.failing) == (8, 64)
    assert "not converged within the cell budget" in out.text()


def test_lowest_bound_failing_means_no_answer():
    out = bisect(4, 32, _knee(2, []), max_cells=6)
    assert out.answer is None and out.failing == 4 and out.converged
    assert out.text().startswith("no concurrency in [4, 32] meets it (c4: goodput 0.500 < 0.9)")


def test_a_cell_that_cannot_be_published_is_never_the_answer():
    p = judge(8, "ok", "fail", 1.0, 0.9)
    assert not p.passed and p.decided and "cannot be the answer" in p.why
    thin = judge(8, "ok", "insufficient", 1.0, 0.9)
    assert not thin.passed and not thin.decided and "too few measured requests" in thin.why
    assert not judge(8, "failed", None, None, 0.9, "RuntimeError: boom").passed
    assert judge(8, "ok", None, 0.9, 0.9).passed  # validation off: publishable


def test_a_thin_cell_stops_the_search_undecided():
    """Issue 29 point 4: a cell still `insufficient` after lengthening is neither a pass nor a
    fail: the search stops there and says so instead of "no concurrency meets it"."""
    def probe(c: int) -> Probe:
        return judge(c, "ok", "insufficient" if c == 4 else "pass", 1.0, 0.9)

    out = bisect(4, 48, probe, max_cells=6)
    assert out.answer is None and out.failing is None and out.undecided == 4
    assert not out.converged and out.text().startswith("undecided: c4 verdict insufficient")
    assert "no concurrency" not in out.text()
    out = bisect(1, 64, lambda c: judge(c, "ok", "insufficient" if c == 8 else "pass",
                                        1.0 if c < 8 else 0.5, 0.9), max_cells=6)
    assert (out.answer, out.failing, out.undecided) == (1, 64, 8)
    assert "c1 passes so far" in out.text()


def test_search_lengthens_a_thin_cell_before_judging_it(tmp_path, recipe):
    """Issue 29 point 4: c4 for 3 s measures ~16 requests (measured 2026-12-03), fewer than
    min_samples 24: `insufficient`. The search reruns it twice as long (~32 requests), says so,
    and only then judges it: the answer is c4, labelled as lengthened in its summary."""
    out = tmp_path / "thin"
    proc = _sweep(recipe, *FAST, "--set", "min_samples=24", "--search", "ttft:100000",
                  "--search-min", 4, "--search-max", 4, "-o", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert ("p0-tp1 c4: verdict insufficient (too few measured requests to judge); the search "
            "reruns it 2x as long, 6 s, before judging it") in err
    res = _json(out / "sweep.json")["search"]["points"]["p0-tp1"]
    (cell,) = res["cells"]
    assert cell["lengthened_s"] == [6.0] and cell["verdict"] == "pass" and cell["decided"]
    assert res["answer"] == 4 and res["undecided"] is None
    s = _json(out / "p0-tp1" / "c4" / "summary.json")
    assert s["config"]["duration_s"] == 6.0 and s["completed"] >= 24
    assert s["labels"]["search_lengthened"] == "3s->6s"


def test_a_sweep_with_no_decidable_cell_exits_3(tmp_path, recipe):
    """Every cell `insufficient`: the Pareto frontier is empty and the sweep says so and exits
    3, as `agentx run` does on such a verdict (it exited 0 before)."""
    proc = _sweep(recipe, *FAST, "--set", "min_samples=100000", "--conc", 4,
                  "-o", tmp_path / "none")
    assert proc.returncode == 3, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "no cell has a verdict that can be published (p0-tp1 c4 insufficient)" in err
    # the cell's line says why it is kept off the frontier: the validation's first reason
    assert "p0-tp1 c4: verdict insufficient: samples: " in err, err
