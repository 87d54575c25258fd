"""The h200-qwen3-8b-bf16 profile against real agentx runs on one H200 (tests/data/h200-runs:
vLLM 0.24.0, swe trace, 8 lanes, base and EAGLE3 synthetic AL 2.78).

The calibration figures come from replaying every recorded request (its send time, prompt,
prefix hit and output length) through the served simulator's engine on a virtual clock
(sim_calibration/replay.py), so they are deterministic; the served path is then checked end to end
by replaying the same workload with agentx itself against the embedded simulator."""
from __future__ import annotations

import io

import orjson
import pytest

from agentx.config import RunConfig
from agentx.sim.config import SimConfig
from agentx.sim.profile import load_profile
from agentx.targets.embedded import EmbeddedSim
from conftest import H200_RUNS
from sim_calibration.fit import fit
from sim_calibration.replay import figures, h200_runs, measured, replay_figures

FIGURES = ("ttft_p50", "ttft_p90", "tpot_p50", "e2e_p50")
RUNS = {name: (cfg, recs, summ) for name, cfg, recs, summ in h200_runs(H200_RUNS)}
TIME_SCALE = 4.0


@pytest.mark.parametrize("name", ["base", "spec"])
def test_profile_reproduces_real_run(name):
    cfg, recs, summ = RUNS[name]
    real = figures(measured(recs))
    # the records are the ones the run's summary was computed from
    assert real["ttft_p50"] == pytest.approx(summ["ttft_ms"]["p50"])
    assert real["e2e_p50"] == pytest.approx(summ["e2e_ms"]["p50"])
    sim = replay_figures(cfg, recs)
    for k in FIGURES:
        assert abs(sim[k] / real[k] - 1) <= 0.15, (k, sim[k], real[k])
    # without the front end the engine alone is far too fast to first token (the gap this closes)
    bare = replay_figures(cfg, recs, {"frontend_ms": 0.0, "frontend_us_per_prompt_token": 0.0})
    assert bare["ttft_p50"] < 0.5 * real["ttft_p50"]


def test_profile_constants_are_the_fit():
    """The shipped constants are what `python -m sim_calibration.fit` fits from the runs."""
    fitted = fit(H200_RUNS.parent, out=io.StringIO())
    cal = load_profile("h200-qwen3-8b-bf16").calibration
    for k, v in fitted.items():
        assert getattr(cal, k) == pytest.approx(v, rel=0.03), (k, v)


@pytest.mark.slow
@pytest.mark.alone  # timing: tests/parallel.py
def test_served_replay_of_base_run(tmp_path):
    """agentx replays the base run's workload (its recorded config, time-scaled) against the
    embedded simulator: the same requests, the same prefix hits, and the served timings (the
    simulator's truth log, rescaled to modelled time) show the calibrated profile."""
    _, real_recs, summ = RUNS["base"]
    c, f = summ["config"], TIME_SCALE
    truth = tmp_path / "truth.jsonl"
    cfg = RunConfig(trace=c["trace"], conc=c["conc"], seed=c["seed"], duration_s=c["duration_s"] / f,
                    think_scale=c["think_scale"] / f, max_think_s=c["max_think_s"] / f,
                    start_min=c["start_min"], start_max=c["start_max"],
                    drain_timeout_s=c["drain_timeout_s"] / f, context_scale=c["context_scale"],
                    output_dir=str(tmp_path / "out"), progress=False, scrape_interval_s=1.0,
                    validation="off")
    sim = EmbeddedSim(SimConfig(profile="h200-qwen3-8b-bf16", time_scale=f, truth_log=str(truth)))
    from agentx.run import run

    s = run(cfg, sim)
    recs = [orjson.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_bytes().splitlines()]
    key = lambda r: (r["lane"], r["trace_id"], r["turn"], r["subagent"])  # noqa: E731
    real = {key(r): r for r in measured(real_recs)}
    mine = {key(r): r for r in measured(recs)}
    both = real.keys() & mine.keys()
    assert len(both) >= 0.8 * len(real)  # the same schedule (think times scaled with the clock)
    assert all(mine[k]["isl"] == real[k]["isl"] for k in both)  # same prompt sizes
    assert s["cache"]["achieved_hit_rate"] == pytest.approx(summ["cache"]["achieved_hit_rate"], abs=0.01)
    # served timings in modelled time, measured by the simulator itself (no client overhead)
    log = {t["request_id"]: t for t in map(orjson.loads, truth.read_bytes().splitlines())}
    rows = []
    for r in mine.values():
        t = log[r["request_id"]]
        start = t["received_ns"] or t["arrival_ns"]
        ch = [x for x in t["chunks"] if x[1] > 0]
        n = sum(x[1] for x in ch)
        rows.append({"ttft_ms": (ch[0][0] - start) / 1e6 * f, "e2e_ms": (ch[-1][0] - start) / 1e6 * f,
                     "tpot_ms": (ch[-1][0] - ch[0][0]) / 1e6 * f / (n - 1) if n > 1 else None})
    served, want = figures(rows), figures(list(real.values()))
    # Load only makes the served simulator slower (a late step is late by x4 in modelled time
    # here; on a loaded 2-core box TTFT p90 reached 2x), so the lower bound is the calibration's
    # 15% and the upper one only catches gross errors (front end lost, or counted twice or
    # unscaled); the 15% both ways is test_profile_reproduces_real_run, on the same engine code.
    for k in FIGURES:
        assert 0.85 <= served[k] / want[k] <= 2.5, (k, served[k], want[k])
