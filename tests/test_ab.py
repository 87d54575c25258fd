"""`agentx ab`: the bootstrap by hand on known distributions, and end to end on simulator
processes over real HTTP — offload on vs off with a working set larger than the GPU pool
(B better on TTFT, both sides validated against their own pool-aware theory), and identical
configurations that must not be called different."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentx.ab.stats import METRICS, compare, session_key, side_data, weighted_percentile, weights
from agentx.cli import main
from agentx.targets.process import start
from helpers import free_port, write_trace

# a toy GPU pool of 12,288 tokens (768 blocks of 16); the trace's sessions grow to ~5,000
# tokens, so 8 lanes need ~36k: the GPU alone thrashes.
SIM = ["--profile", "cpu-tiny", "--kv-pool-tokens", "12288", "--time-scale", "2"]
OFFLOAD = ["--kv-offload", "simple-cpu", "--offload-gb", "1"]  # ~244k tokens of CPU tier


# ------------------------------------------------------------------- bootstrap by hand
def _records(rng: np.random.Generator, sessions: int, per: int, ttft_ms: float, tag: str,
             spread: float = 10.0) -> list[dict]:
    """`sessions` sessions of `per` requests; each session has its own level (sessions differ
    more than requests within one do, as in a real replay)."""
    out = []
    for s in range(sessions):
        level = ttft_ms + rng.normal(0, spread)
        for i in range(per):
            ttft = max(1.0, level + rng.normal(0, spread / 4))
            out.append({"ok": True, "warmup": False, "session_id": f"{tag}-s{s}" + ("/sub" if i == 2 else ""),
                        "ttft_ms": ttft, "tpot_ms": 5.0 + rng.normal(0, 0.2), "e2e_ms": ttft + 100,
                        "osl": 16 + (7 * s) % 9, "isl": 1000, "isl_intended": 1000, "cached_tokens": 900})
    return out


def test_clear_difference_gets_a_verdict_in_each_metrics_direction():
    rng = np.random.default_rng(1)
    a = side_data(_records(rng, 30, 5, 100.0, "a"), window_s=10.0)
    b = side_data(_records(rng, 30, 5, 50.0, "b"), window_s=5.0)  # same tokens in half the time
    m = compare(a, b, replicates=500, seed=0)
    assert m["ttft_p50_ms"]["verdict"] == "b_better"  # lower is better
    assert m["ttft_p50_ms"]["ci_high"] < 0 < m["ttft_p50_ms"]["a"] - m["ttft_p50_ms"]["b"]
    assert m["output_tok_s"]["verdict"] == "b_better"  # higher is better
    assert m["output_tok_s"]["ratio"] == pytest.approx(2.0, rel=0.05)
    swapped = compare(b, a, replicates=500, seed=0)
    assert swapped["ttft_p50_ms"]["verdict"] == "a_better"
    assert swapped["output_tok_s"]["verdict"] == "a_better"


def test_a_handful_of_requests_gets_no_verdict():
    """One request a side, 113.6 ms apart: every replicate draws the same values, the interval
    is [-113.6, -113.6], and that is no evidence; nor are 3 sessions a side, however far apart."""
    rng = np.random.default_rng(3)
    one_a = side_data(_records(rng, 1, 1, 200.0, "a", spread=0.0), window_s=5.0)
    one_b = side_data(_records(rng, 1, 1, 86.4, "b", spread=0.0), window_s=5.0)
    m = compare(one_a, one_b, replicates=300, seed=0)
    assert m["ttft_p50_ms"]["ci_low"] == m["ttft_p50_ms"]["ci_high"]
    assert {v["verdict"] for v in m.values()} == {"insufficient"}
    few_a = side_data(_records(rng, 3, 5, 200.0, "a"), window_s=5.0)
    few_b = side_data(_records(rng, 3, 5, 50.0, "b"), window_s=5.0)
    assert compare(few_a, few_b, replicates=300, seed=0)["ttft_p50_ms"]["verdict"] == "b_better"
    thin = compare(few_a, few_b, replicates=300, seed=0, min_sessions=10, min_requests=30)
    assert {v["verdict"] for v in thin.values()} == {"insufficient"}


def test_same_distribution_is_no_difference():
    rng = np.random.default_rng(2)
    verdicts = []
    for _ in range(20):
        a = side_data(_records(rng, 30, 5, 100.0, "a"), window_s=10.0)
        b = side_data(_records(rng, 30, 5, 100.0, "b"), window_s=10.0)
        verdicts.append(compare(a, b, replicates=300, seed=0)["ttft_p50_ms"]["verdict"])
    assert verdicts.count("no_difference") >= 17  # a 95% interval: ~1 in 20 may miss


def test_resampling_keeps_a_sessions_requests_together():
    """A replicate holds whole sessions (a subagent's requests with its parent's): every request
    of a session counts as often as its session was drawn, and n sessions are drawn of n."""
    rng = np.random.default_rng(3)
    d = side_data(_records(rng, 12, 6, 100.0, "x"), window_s=1.0)
    assert d.n_sessions == 12 and session_key("x-s1/sub") == "x-s1"
    w = weights(d, rng, 200)
    for s in range(12):
        mine = w[:, d.owner == s]
        assert mine.shape[1] == 6 and (mine == mine[:, :1]).all()
    assert (w.sum(axis=1) == 12 * 6).all()


def _runs(rng: np.random.Generator, n_runs: int, tag: str, run_spread: float) -> tuple[list, list]:
    """n_runs runs of one configuration; each run has its own level (a batching pattern that
    lasts the run), shared by all its sessions. Returns (records, run index per record)."""
    recs, runs = [], []
    for j in range(n_runs):
        part = _records(rng, 12, 4, 100.0 + rng.normal(0, run_spread), f"{tag}{j}", spread=4.0)
        recs += part
        runs += [j] * len(part)
    return recs, runs


def test_repeats_resample_runs_then_sessions():
    """With repeats, a replicate draws runs first: a run left out takes all its sessions with
    it, a run drawn twice doubles them; within a run, sessions stay whole."""
    rng = np.random.default_rng(6)
    recs, runs = _runs(rng, 3, "x", 10.0)
    d = side_data(recs, window_s=3.0, runs=runs)
    assert d.n_runs == 3 and d.n_sessions == 36
    w = weights(d, rng, 3000)
    run_of_req = d.run_of[d.owner]
    per_run = np.stack([w[:, run_of_req == j].sum(axis=1) for j in range(3)], axis=1)
    assert set(np.unique(per_run)) <= {0, 48, 96, 144}  # 12 sessions x 4 requests, 0-3 times
    assert (per_run.sum(axis=1) == 144).all()
    assert np.mean(per_run[:, 0] == 0) == pytest.approx((2 / 3) ** 3, abs=0.03)
    for s in range(d.n_sessions):
        mine = w[:, d.owner == s]
        assert (mine == mine[:, :1]).all()


def test_run_to_run_variance_is_in_the_interval_with_repeats():
    """Two identical configurations, three runs a side, each run at its own level: resampling
    the pooled sessions calls them different most of the time; resampling runs, then
    sessions, rarely (a 95% interval misses ~1 in 20; two-stage resampling errs wide)."""
    rng = np.random.default_rng(7)
    pooled = two_stage = 0
    for _ in range(40):
        (ra, ia), (rb, ib) = _runs(rng, 3, "a", 10.0), _runs(rng, 3, "b", 10.0)
        v1 = compare(side_data(ra, 3.0), side_data(rb, 3.0), replicates=300, seed=0)
        v2 = compare(side_data(ra, 3.0, runs=ia), side_data(rb, 3.0, runs=ib), replicates=300,
                     seed=0)
        pooled += v1["ttft_p50_ms"]["verdict"] != "no_difference"
        two_stage += v2["ttft_p50_ms"]["verdict"] != "no_difference"
    assert pooled >= 15 and two_stage <= 4, (pooled, two_stage)  # seeded: 22 and 2 of 40


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=25), st.integers(0, 2**31),
       st.sampled_from([0, 10, 50, 90, 99, 100]))
def test_weighted_percentile_is_the_percentile_of_the_repeated_sample(values, seed, q):
    v = np.array(values)
    w = np.random.default_rng(seed).integers(0, 4, size=(4, v.size))
    got = weighted_percentile(v, w, q)
    for row, g in zip(w, got):
        rep = np.repeat(v, row)
        assert np.isnan(g) if rep.size == 0 else g == pytest.approx(np.percentile(rep, q))


def test_session_resampling_is_wider_than_request_resampling():
    """Sessions at different levels: resampling requests as if independent would understate
    the uncertainty of a percentile; resampling sessions does not."""
    rng = np.random.default_rng(4)
    recs = _records(rng, 20, 10, 100.0, "a", spread=30.0)
    by_session = side_data(recs, window_s=1.0)
    by_request = side_data([{**r, "session_id": f"r{i}"} for i, r in enumerate(recs)], 1.0)
    width = {}
    for name, d in (("session", by_session), ("request", by_request)):
        m = compare(d, d, replicates=400, seed=0)["ttft_p50_ms"]
        width[name] = m["ci_high"] - m["ci_low"]
    assert width["session"] > 1.5 * width["request"]


def test_every_metric_is_reported():
    rng = np.random.default_rng(5)
    d = side_data(_records(rng, 10, 3, 100.0, "a"), window_s=1.0)
    m = compare(d, d, replicates=100, seed=0)
    assert set(m) == {x.name for x in METRICS}
    for v in m.values():
        assert {"a", "b", "diff", "ratio", "ci_low", "ci_high", "verdict"} <= set(v)


# ------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("ab") / "tr", sessions=30, turns=8, think=0.0,
                       out=20)


def _sim(tmp: Path, name: str, extra: list[str], base: list[str] = SIM):
    port = free_port()
    argv = [sys.executable, "-m", "agentx.sim", "--host", "127.0.0.1", "--port", str(port),
            *base, *extra]
    return start(argv, {}, base_url=f"http://127.0.0.1:{port}", workdir=tmp / name,
                 health_timeout_s=60)


def _ab(trace: Path, out: Path, a: str, b: str, *extra: str, rc: int = 0,
        progress: bool = False) -> dict:
    got = main(["ab", "--a", a, "--b", b, "--trace", str(trace), "--conc", "8",
                *([] if progress else ["--no-progress"]), "-o", str(out),
                "--scrape-interval", "1", "--bootstrap", "500", "--validate", "warn", *extra])
    assert got == rc
    return json.loads((out / "ab.json").read_text())


def test_offload_on_beats_off_and_both_sides_validate(tmp_path, trace):
    with _sim(tmp_path, "off", []) as off, _sim(tmp_path, "on", OFFLOAD) as on:
        doc = _ab(trace, tmp_path / "ab", off.base_url, on.base_url, "--duration", "8")
    m = doc["metrics"]
    assert m["ttft_p50_ms"]["verdict"] == "b_better", m["ttft_p50_ms"]
    assert m["hit_rate"]["verdict"] == "b_better"
    assert doc["a"]["validation"] == ["pass"] and doc["b"]["validation"] == ["pass"]
    # B passed against the tiered theory, with its hits from the offload tier
    b = json.loads((Path(doc["b"]["runs"][0]) / "summary.json").read_text())
    assert b["cache"]["offload_source"] == "vllm:simple_kv_offload_info"
    (check,) = [c for c in b["validation"]["checks"] if c["name"] == "prefix_hit_rate"]
    assert check["ok"] and check["tiers"]["offload"]["expected"] > 0.5
    # the tier's size is known (the server's info gauge): offload_hits runs without
    # --expect-offload, and the hits came back from the tier
    (offload,) = [c for c in b["validation"]["checks"] if c["name"] == "offload_hits"]
    assert offload["ok"] is True, offload
    a = json.loads((Path(doc["a"]["runs"][0]) / "summary.json").read_text())
    assert a["cache"]["working_set_exceeds_pool"] and not a["cache"]["offload_tokens"]
    # ab.json schema, the run directories and the plot
    for v in m.values():
        assert {"a", "b", "diff", "ratio", "ci_low", "ci_high", "verdict"} <= set(v)
        assert v["verdict"] in ("a_better", "b_better", "no_difference")
    assert doc["bootstrap"]["resampled"] == "sessions"
    assert len(doc["warnings"]) == 1 and "--repeats 3" in doc["warnings"][0]  # one run a side
    for side in ("a", "b"):
        assert (Path(doc[side]["runs"][0]) / "requests.jsonl").stat().st_size > 0
    png = Path(doc["plot"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.alone
def test_identical_configurations_are_no_difference(tmp_path, trace):
    """Two identical servers side by side (--parallel: both sides meet the same machine load),
    three runs a side, four seeds: TTFT p50 is called no different. It runs alone: its premise
    is that both servers meet the same machine, and beside two busy test workers (a vLLM server
    among them) one simulator process got less CPU than the other for whole runs (clean-clone
    CI, 2026-12-02: TTFT p50 per run A 26/22/25 ms vs B 41/50/32 ms, `a_better` in 2 of 4
    seeds; the A/B was right about what it measured). The servers are not
    saturated (default pool, no max_num_seqs): behind a saturated queue every request waits on
    the others and sessions are no longer independent draws (docs/ab.md). One run a side is not
    enough here: with zero think time each server falls into a batching pattern that lasts a
    short run, and identical servers were called different in 5 of 15 seeds with one run a
    side, 6 of 12 with three runs' sessions pooled, and 0 of 12 with runs resampled, then
    sessions (4 s runs, 2026-12-01, docs/ab.md). At half real time (--time-scale 0.5) the client
    and the two simulators ask for half the CPU: at real time, alone, CI still saw one side's
    TTFT p50 high in every run (2026-12-07: A 28/38/39 ms vs B 21/26/29 ms, `b_better` in 2
    of 4 seeds); at half real time with a busy loop on one of the two cores beside it, per-run
    TTFT p50 stayed within 17-38 ms against 15-85 ms at real time."""
    verdicts = []
    plain = ["--profile", "cpu-tiny", "--time-scale", "0.5", *OFFLOAD]
    with _sim(tmp_path, "s1", plain, base=[]) as s1, _sim(tmp_path, "s2", plain, base=[]) as s2:
        for seed in range(1, 5):
            doc = _ab(trace, tmp_path / f"ab{seed}", s1.base_url, s2.base_url, "--parallel",
                      "--duration", "3", "--repeats", "3", "--seed", str(seed), "--ramp-up", "1")
            verdicts.append(doc["metrics"]["ttft_p50_ms"]["verdict"])
    assert doc["bootstrap"]["resampled"] == "runs, then sessions" and doc["warnings"] == []
    for side in ("a", "b"):  # each repeat's own figures, for the run-to-run spread
        assert len(doc["per_run"][side]) == 3 and all(r["ttft_p50_ms"] > 0 for r in doc["per_run"][side])
    assert verdicts.count("no_difference") >= 3, verdicts


def test_recipe_sides_on_the_simulator(tmp_path, trace, capsys):
    """A recipe side is launched (here on the simulator with the recipe's sim_profile, the
    --sim-* flags given on top) and stopped with its process group when done. The recipe's own
    run options (tiny-cpu sets trace, duration, context scale, think cap) are set aside, and
    said so: both sides run the command's workload. Fewer sessions a side than --min-sessions:
    every verdict is insufficient, and the command exits 3 under --validate strict, as `run`
    does on an insufficient verdict (issue 29 point 4; warn keeps 0: test_verdicts)."""
    doc = _ab(trace, tmp_path / "ab", "tiny-cpu", "tiny-cpu", "--sim",
              "--sim-time-scale", "5", "--duration", "3", "--conc", "2", "--bootstrap", "200",
              "--min-sessions", "1000", "--a-label", "off", "--b-label", "on",
              "--validate", "strict", rc=3, progress=True)
    err = capsys.readouterr().err
    # the live progress lines (stderr is no terminal here) name their side
    lines = [ln for ln in err.splitlines() if "] measuring | left" in ln]
    assert lines and all(ln.startswith(("side off run 1: [", "side on run 1: [")) for ln in lines)
    assert {ln.split(":")[0] for ln in lines} == {"side off run 1", "side on run 1"}
    assert {m["verdict"] for m in doc["metrics"].values()} == {"insufficient"}
    assert "agentx ab: no metric has a verdict (every one insufficient)" in err
    assert "side a: tiny-cpu.yaml run options not used (" in err and "trace" in err
    for side in ("a", "b"):
        assert doc[side]["kind"] == "sim" and doc[side]["model"] == "tiny"
        assert doc[side]["completed"] > 0
        log = (tmp_path / "ab" / f"server-{side}" / "server.log").read_text()
        assert "profile cpu-tiny" in log and "time_scale 5" in log


def test_a_side_that_is_neither_url_nor_recipe_is_one_line_exit_2(tmp_path, trace, capsys):
    rc = main(["ab", "--a", "no-such-recipe", "--b", "http://127.0.0.1:9", "--trace", str(trace),
               "-o", str(tmp_path / "ab")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no-such-recipe" in err


def test_recipe_offload_tier_in_tokens():
    """Tier bytes over one token's KV across the TP group: cpu-tiny is 2 (K, V) x 8 layers x
    2 KV heads x 64 dims x 2 bytes = 4,096 bytes a token."""
    from agentx.recipe.load import load_recipe
    from agentx.targets.recipe import offload_tokens as recipe_offload_tokens

    recipe, _ = load_recipe("tiny-cpu")
    assert recipe_offload_tokens(recipe, 0, 4096 * 1000) == 1000
    assert recipe_offload_tokens(recipe, 0, None) is None
    assert recipe_offload_tokens(recipe.model_copy(update={"sim_profile": None}), 0, 4096) is None
