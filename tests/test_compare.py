"""`agentx compare` (agentx/ab/compare.py): saved runs made on the embedded simulator over HTTP,
compared with `agentx ab`'s bootstrap; figures checked against the records recomputed here,
pairing by session when the seeds match, and runs of another workload refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentx.ab.stats import METRICS, SideData, paired_weights
from helpers import write_trace

SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "--no-progress",
       "--validate", "warn", "--scrape-interval", "0", "--max-think", "0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """a, b: seed 0; c: seed 1; d: seed 0 at another lane count."""
    from agentx.cli import main

    root = tmp_path_factory.mktemp("compare")
    trace = write_trace(root / "tr", sessions=12, turns=5, think=0.0, out=20)
    out = {}
    for name, seed, conc in (("a", 0, 4), ("b", 0, 4), ("c", 1, 4), ("d", 0, 2)):
        out[name] = root / name
        assert main(["run", "--trace", str(trace), "--conc", str(conc), "--max-requests", "80",
                     "--duration", "0", "--seed", str(seed), "-o", str(out[name]), *SIM]) == 0
    return out


def _measured_ttft(d: Path) -> list[float]:
    recs = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines()]
    return [r["ttft_ms"] for r in recs if r["ok"] and not r["warmup"]]


def test_compare_two_saved_runs_paired_by_session(runs, cli, tmp_path):
    r = cli("compare", runs["a"], runs["b"], runs["c"], "--min-sessions", 2, "-o", tmp_path,
            "--bootstrap", 500)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "compare.json").read_text())
    ab, ac = doc["pairs"]
    assert set(ab["metrics"]) == {m.name for m in METRICS}  # what `agentx ab` compares
    assert ab["paired"] and ab["paired_sessions"] > 0 and not ac["paired"]  # seeds 0/0, 0/1
    assert "paired by session" in r.stdout and "agentx compare — a" in r.stdout
    m = ab["metrics"]["ttft_p50_ms"]
    assert m["a"] == pytest.approx(float(np.percentile(_measured_ttft(runs["a"]), 50)))
    assert m["b"] == pytest.approx(float(np.percentile(_measured_ttft(runs["b"]), 50)))
    assert m["diff"] == pytest.approx(m["b"] - m["a"])
    for pair in (ab, ac):
        for x in pair["metrics"].values():
            assert x["verdict"] in ("a_better", "b_better", "no_difference", "insufficient")
            if x["ci_low"] is not None:
                assert x["ci_low"] <= x["ci_high"]
    page = (tmp_path / "compare.html").read_text()
    assert "compare 1: a against b" in page and "compare 2: a against c" in page
    from test_html_report import check_page  # the page in headless Chromium

    shown = check_page(tmp_path / "compare.html", tmp_path, {
        "comparison 1 CDFs", "comparison 2 CDFs", "Pareto frontier", "latency CDFs",
        "per-turn TTFT and hit rate"})
    assert "paired by session (same seed)" in shown["text"]
    # unpaired, the same two runs' interval of a p50 is wider: the same sessions on the same
    # lanes share their difficulty, which pairing cancels
    r2 = cli("compare", runs["a"], runs["b"], "--min-sessions", 2, "-o", tmp_path / "u",
             "--unpaired", "--bootstrap", 500, "--no-plots")
    assert r2.returncode == 0, r2.stderr
    u = json.loads((tmp_path / "u" / "compare.json").read_text())["pairs"][0]
    assert not u["paired"]
    width = {k: (p["metrics"]["hit_rate"]["ci_high"] - p["metrics"]["hit_rate"]["ci_low"])
             for k, p in (("paired", ab), ("unpaired", u))}
    assert width["paired"] < width["unpaired"]


def test_another_workload_is_refused_unless_allowed(runs, cli, tmp_path):
    r = cli("compare", runs["a"], runs["d"], "-o", tmp_path / "x")
    assert r.returncode == 2
    assert "conc" in r.stderr and "--allow-mismatch" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x").exists()
    r = cli("compare", runs["a"], runs["d"], "--allow-mismatch", "-o", tmp_path / "y",
            "--no-plots", "--bootstrap", 200, "--names", "base,two-lanes")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "y" / "compare.json").read_text())["pairs"][0]
    assert doc["mismatch"].startswith("lanes: conc 2")
    assert (doc["a"]["label"], doc["b"]["label"]) == ("base", "two-lanes")
    assert any("workloads differ" in w for w in doc["warnings"])
    assert "workloads differ" in (tmp_path / "y" / "compare.html").read_text()


def test_paired_draw_weighs_a_session_alike_on_both_sides():
    def side(keys: list[str], owner: list[int]) -> SideData:
        return SideData(owner=np.array(owner), n_sessions=len(keys), cols={}, window_s=1.0,
                        keys=keys)
    a = side(["r1-L0.0", "r1-L1.0", "r1-L0.1"], [0, 0, 1, 2])
    b = side(["r2-L1.0", "r2-L0.0"], [0, 1, 1])  # L0.1 only on A
    wa, wb = paired_weights(a, b, np.random.default_rng(1), 50)
    assert wa.shape == (50, 4) and wb.shape == (50, 3)
    assert (wa[:, 0] == wb[:, 1]).all() and (wa[:, 2] == wb[:, 0]).all()  # L0.0, L1.0
    assert (wa.sum(axis=1) > 0).any() and not (wa[:, 3] == wb[:, 0]).all()
