"""Cost (`--gpu-hour-usd`, metrics/cost.py): a sweep on the simulator prices each cell with its
recipe point's GPU count, into summary.json, the console and runs.csv; `agentx report --cost`
draws cost against interactivity with the cheapest publishable run on the frontier; a run
whose GPU count is unknown says its cost is unknown instead of assuming one GPU."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from agentx.metrics.cost import cost_block
from agentx.report.pareto import frontier
from helpers import write_trace

FAST = ["--sim", "--duration", "4", "--warmup", "0", "--sim-time-scale", "50",
        "--set", "think_scale=0.01", "--set", "drain_timeout_s=2"]
PRICE = 3.5


def _summary(cell: Path) -> dict:
    return json.loads((cell / "summary.json").read_text())



def _csv(p: Path) -> list[dict]:
    with open(p) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    from agentx.cli import main

    out = tmp_path_factory.mktemp("cost") / "sweep"
    # cells this short decide nothing: strict would exit 3 (issue 29), warn keeps 0
    assert main(["sweep", "minimaxm3-fp8-h200", *FAST, "--conc", "1,4", "--gpu-hour-usd",
                 str(PRICE), "--set", "validation=warn", "-o", str(out)]) == 0
    return out


def test_sweep_cells_are_priced_with_the_points_gpus(swept):
    rows = {int(r["conc"]): r for r in _csv(swept / "runs.csv")}
    for conc in (1, 4):
        s = _summary(swept / "p0-tp8" / f"c{conc}")
        c, h = s["cost"], s["throughput"]["headline"]
        assert c["gpus"] == 8 and c["gpu_hour_usd"] == PRICE and c["unknown"] is None
        usd_s = PRICE * 8 / 3600
        assert c["usd_per_m_output_tokens"] == pytest.approx(usd_s / h["output_tok_s"] * 1e6)
        assert c["usd_per_m_input_tokens"] == pytest.approx(
            usd_s / (h["total_tok_s"] - h["output_tok_s"]) * 1e6)
        tokens = s["tokens"]["input"] + s["tokens"]["output"]
        assert c["usd_per_request"] == (pytest.approx(
            usd_s / h["total_tok_s"] * tokens / s["completed"]) if s["completed"] else None)
        row = rows[conc]
        assert float(row["usd_per_m_output_tokens"]) == pytest.approx(c["usd_per_m_output_tokens"])
        assert float(row["gpu_hour_usd"]) == PRICE


def test_report_cost_pareto_and_pricing_saved_runs(swept, cli, tmp_path):
    r = cli("report", swept / "p0-tp8", "--cost", "--gpu-hour-usd", 7.0, "-o", tmp_path, "--html")
    assert r.returncode == 0, r.stderr
    rows = _csv(tmp_path / "runs.csv")
    for row in rows:  # repriced at $7: twice the $3.5 the sweep recorded
        s = _summary(Path(row["run"]))
        assert float(row["usd_per_m_output_tokens"]) == pytest.approx(
            2 * s["cost"]["usd_per_m_output_tokens"])
    ok = [x for x in rows if x["validation"] == "pass"]
    if ok:  # the cheapest publishable run is on the frontier, whatever its interactivity
        cheapest = min(ok, key=lambda x: float(x["usd_per_m_output_tokens"]))
        assert cheapest["frontier_interactivity"] == "True"
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    page = (tmp_path / "report.html").read_text()
    assert "$ per million output tokens" in page and "/M output" in page


def test_unknown_gpu_count_means_unknown_cost(cli, tmp_path):
    """The simulator says its GPU count (cpu-tiny: TP 1), so its run is priced; a run whose
    target said nothing (a real server without --gpus: its summary has no GPU count) is never
    priced as one GPU, until the report is told the count."""
    trace = write_trace(tmp_path / "tr", sessions=4, turns=3, think=0.0)
    out = tmp_path / "run"
    r = cli("run", "--trace", trace, "--conc", 2, "--max-requests", 12, "--duration", 0,
            "--sim-profile", "cpu-tiny", "--sim-time-scale", 20, "--no-progress",
            "--validate", "warn", "--scrape-interval", 0, "--gpu-hour-usd", PRICE, "-o", out)
    assert r.returncode == 0, r.stderr
    c = _summary(out)["cost"]
    assert c["gpus"] == 1 and c["usd_per_m_output_tokens"] is not None
    for name in ("real", "real2"):  # the same run as a server that does not say its GPUs
        shutil.copytree(out, tmp_path / name)
        p = tmp_path / name / "summary.json"
        s = json.loads(p.read_text())
        s["gpus"] = s["gpus_source"] = s["target"]["gpus"] = s["config"]["gpus"] = None
        s["cost"] = cost_block(s, PRICE)  # what such a run records: unknown, saying why
        assert s["cost"]["gpus"] is None and s["cost"]["unknown"]
        p.write_text(json.dumps(s))
    real, real2 = tmp_path / "real", tmp_path / "real2"
    r = cli("report", real, real2, "--gpu-hour-usd", PRICE, "-o", tmp_path / "rep",
            "--no-plots")
    assert r.returncode == 0 and "GPU count unknown" in r.stdout
    row = _csv(tmp_path / "rep" / "runs.csv")[0]
    assert row["usd_per_m_output_tokens"] == ""  # never priced as one GPU
    bad = cli("report", real, real2, "--cost", "-o", tmp_path / "rep2")
    assert bad.returncode == 2 and "--cost" in bad.stderr
    # told the count afterwards, the report prices it
    r2 = cli("report", real, "--gpu-hour-usd", PRICE, "--gpus", 2, "--no-plots")
    assert r2.returncode == 0 and "cost ($3.5/GPU-h x 2 GPUs" in r2.stdout


def test_cost_frontier_minimises():
    pts = [(10, 5.0), (20, 4.0), (30, 9.0), (15, 6.0), (None, 1.0)]
    assert frontier(pts, lower_y=True) == [1, 2]  # (20, $4) beats (10, $5) and (15, $6)
    assert frontier(pts) == [2]
