"""The cache-cliff planner (`agentx cliff`, agentx/cache_theory/cliff.py): predicted hit rates per
tier against lanes, the cliff where they collapse, and `--verify` measuring the lane counts on
either side of it on the embedded simulator over HTTP."""
from __future__ import annotations

import json

import pytest

from agentx.cache_theory.cliff import Replay, cliffs, predict
from agentx.trace.load import load_traces
from helpers import write_trace


def test_cliff_is_the_first_collapse_below_half_the_best():
    pts = [{"lanes": 1, "gpu": 0.9}, {"lanes": 2, "gpu": 0.95}, {"lanes": 4, "gpu": 0.5},
           {"lanes": 8, "gpu": 0.4}, {"lanes": 16, "gpu": 0.0}]
    assert cliffs(pts, ("gpu",))["gpu"] == {"at": 8, "holds_to": 4, "from": 0.5, "to": 0.4}
    assert cliffs(pts[:3], ("gpu",))["gpu"] is None


def test_prediction_falls_as_lanes_outgrow_the_pool(tmp_path):
    ts = load_traces(str(write_trace(tmp_path / "tr", sessions=12, turns=8, think=1.0)))
    r = Replay(duration_s=60.0, max_think_s=1.0)
    one_session = max(t.turns[-1].in_tokens for t in ts.traces)
    pool = 3 * one_session  # three sessions' contexts fit, eight do not
    hits = [predict(ts, n, pool, None, False, r)["hit_rate"] for n in (1, 2, 8, 16)]
    assert min(hits[:2]) > 0.7 and hits[2] < hits[0] - 0.3 and hits[-1] < 0.1
    # a tier as large again takes the hits the pool loses at 8 lanes
    tiered = predict(ts, 8, pool, 6 * one_session, True, r)
    assert tiered["hit_rate"] > hits[2] + 0.3 and tiered["offload"] > 0.3


def test_cliff_command_verified_on_the_simulator(cli, tmp_path):
    trace = write_trace(tmp_path / "tr", sessions=12, turns=8, think=1.0)
    out = tmp_path / "cliff"
    r = cli("cliff", "--trace", trace, "--sim-profile", "cpu-tiny", "--sim-time-scale", 20,
            "--sim-kv-pool-tokens", 16000, "--lanes", "1,2,4,8,16", "--max-think", 0.3,
            "--duration", 4, "--verify", "--no-progress", "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "cliff.json").read_text())
    c = doc["cliffs"]["hit_rate"]
    assert c and doc["pool_tokens"] == 16000 and "collapsed at" in r.stdout
    measured = {m["lanes"]: m["hit_rate"] for m in doc["measured"]}
    assert set(measured) == {c["holds_to"], c["at"]}
    # the simulator's server collapses where the prediction does
    assert measured[c["holds_to"]] > measured[c["at"]] + 0.3
    assert measured[c["at"]] < 0.1 and c["to"] < 0.1
    assert (out / "cliff.png").stat().st_size > 1000
    assert (out / f"c{c['at']}" / "summary.json").exists()


def test_cliff_sizes_from_the_simulator_profile(cli, tmp_path):
    trace = write_trace(tmp_path / "tr", sessions=4, turns=3)
    r = cli("cliff", "--trace", trace, "--sim-profile", "cpu-tiny", "--sim-kv-offload",
            "simple-cpu", "--lanes", "1,2", "--duration", 5, "--no-plots", "-o",
            tmp_path / "c")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "c" / "cliff.json").read_text())
    from agentx.sim.config import SimConfig
    from agentx.sim.profile import resolve

    assert doc["pool_tokens"] == resolve(SimConfig(profile="cpu-tiny")).kv_pool_tokens
    assert doc["offload_tokens"] and doc["offload_eager"] is False  # simple-cpu: lazy
    assert all(p["offload"] is not None for p in doc["points"])


@pytest.mark.parametrize("bad", [["--lanes", "0"], ["--pool-tokens", "-5"]])
def test_bad_sizes_are_refused(cli, bad, tmp_path):
    r = cli("cliff", "--trace", "swe", *bad, "-o", tmp_path / "x")
    assert r.returncode == 2 and r.stderr.strip()


@pytest.mark.parametrize("run", ["h200-runs/base/summary.json", "h200-runs/offA/summary.json",
                                 "h200-runs-2/offb-summary.json"])
def test_prediction_against_the_real_h200_runs(run):
    """The real vLLM 0.24 runs on one H200 (tests/data/h200-runs*): 8 lanes on a 759k-token
    pool, 32 lanes on a 197k-token pool (0% hit), and the same with a 437k-token lazy
    SimpleCPUOffload tier; each run's own options replayed, its pool and tier as recorded."""
    from conftest import DATA

    s = json.loads((DATA / run).read_text())
    cfg, cache = s["config"], s["cache"]
    r = Replay(seed=cfg["seed"], think_scale=cfg["think_scale"], max_think_s=cfg["max_think_s"],
               duration_s=cfg["duration_s"], start_min=cfg["start_min"],
               start_max=cfg["start_max"], context_scale=cfg["context_scale"])
    p = predict(load_traces(cfg["trace"]), cfg["conc"], cache["kv_pool_tokens"],
                cache.get("offload_tokens"), bool(cache.get("offload_eager")), r)
    # the run's own pool-aware theory (the same cache model over the run's real interleaving)
    # and the hit rate the server achieved
    assert p["hit_rate"] == pytest.approx(cache["theoretical_hit_rate_pool"], abs=0.05)
    assert p["hit_rate"] == pytest.approx(cache["achieved_hit_rate"], abs=0.15)
