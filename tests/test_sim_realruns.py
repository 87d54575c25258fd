"""The real runs the simulator is compared with (sim_calibration/realruns.py): where they are found, the
send-time jitter of an ensemble of replays (bench/sim_vs_real.py --replays), and the group rule
(bench/sim_vs_real.py judges a simulated figure against the real runs of its configuration)."""
from __future__ import annotations

import copy
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sim_calibration.realruns import DATA, jittered, runs

REPO = Path(__file__).resolve().parents[1]


def test_runs_found_from_any_working_directory(tmp_path, monkeypatch):
    """`python -m sim_calibration.fit` and bench/sim_vs_real.py find the runs wherever they start."""
    monkeypatch.chdir(tmp_path)
    assert {r.name for r in runs(DATA)} == {"base", "spec", "offA", "offB", "spec32", "offb",
                                           "offb-r1", "offb-r2", "o32", "offbp", "offbp2",
                                           "offbp3", "offbp4", "cap32", "cap32p", "cap32p2", "off54",
                                           "off54b", "off54c", "off68", "off68b", "off68c", "off75",
                                           "off75b"}


def test_jitter_is_seeded_bounded_and_leaves_replay_0_alone():
    recs = [{"request_id": str(i), "start_ns": 10**12 + i * 7_000_000, "isl": 100 + i} for i in range(500)]
    recs.append({"request_id": "failed", "start_ns": None})
    before = copy.deepcopy(recs)
    assert jittered(recs, 2.0, 0) == recs  # replay 0: the recorded send times
    one = jittered(recs, 2.0, 1)
    assert recs == before  # the records themselves are not touched
    assert one == jittered(recs, 2.0, 1)  # seeded by the replay index
    assert one != jittered(recs, 2.0, 2)
    shifts = [j["start_ns"] - r["start_ns"] for r, j in zip(recs[:-1], one[:-1])]
    assert max(abs(s) for s in shifts) <= 2_000_000  # within +-J ms
    assert max(shifts) > 1_800_000 and min(shifts) < -1_800_000  # and spread over all of it
    assert one[-1] == recs[-1]  # a record that was never sent stays unsent
    # only the send time moves
    assert [{**j, "start_ns": r["start_ns"]} for r, j in zip(recs, one)] == recs
    assert max(abs(j["start_ns"] - r["start_ns"]) for r, j in zip(recs[:-1], jittered(recs, 0.5, 3))) <= 500_000


def _bench(name: str):
    """bench/NAME.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_offb_repeats_are_one_group():
    groups = {r.name: r.group for r in runs(DATA)}
    assert {n for n, g in groups.items() if g == "offb"} == {"offb", "offb-r1", "offb-r2", "o32",
                                                             "offbp", "offbp2", "offbp3", "offbp4"}
    assert {n for n, g in groups.items() if g == "cap32"} == {"cap32", "cap32p", "cap32p2"}
    # each tier size of h200-runs-8 with its repeats of h200-runs-9
    assert {n for n, g in groups.items() if g == "off54"} == {"off54", "off54b", "off54c"}
    assert {n for n, g in groups.items() if g == "off68"} == {"off68", "off68b", "off68c"}
    assert {n for n, g in groups.items() if g == "off75"} == {"off75", "off75b"}
    assert len({groups[n] for n in ("base", "spec", "offA", "offB", "spec32", "offb", "cap32")}) == 7


def test_h100_runs_are_priced_at_an_h100s_memory_bandwidth():
    """bench/sim_vs_real.py --device H100: every H100 run, the profile's weight and KV reads at an
    H100's HBM bandwidth (3.35 against the profile's 4.8 TB/s) and nothing else changed; base8's
    two runs and off75's two are groups; the H200 runs keep the profile as it is."""
    from agentx.sim.profile import load_profile
    from sim_calibration.realruns import PROFILE, device_calib, h100_timed

    cal = load_profile(PROFILE).calibration
    assert device_calib("H200") == {} and all(r.calib == {} for r in runs(DATA))
    assert device_calib("H100") == pytest.approx({"mbu": cal.mbu * 3.35 / 4.8, "attn_mbu": cal.attn_mbu * 3.35 / 4.8})
    h100 = {r.name: r for r in h100_timed(DATA)}
    assert set(h100) == {"h100-base8", "h100-base8b", "h100-spec8", "h100-cap32", "h100-spec32", "h100-offA",
                         "h100-offB", "h100-spec32b", "h100-offb", "h100-off75", "h100-off75b"}
    assert all(r.device == "H100" and r.calib == device_calib("H100") for r in h100.values())
    assert h100["h100-base8b"].group == "h100-base8" and h100["h100-off75b"].group == "h100-off75"
    assert len({r.group for r in h100.values()}) == 9
    # the cold starts (warm-up 0) of offA's and offB's servers, as the H200's offA and offB
    for name, h200 in (("h100-offA", "offA"), ("h100-offB", "offB")):
        cfg, _, summ = h100[name].load()
        want = next(r for r in runs(DATA) if r.name == h200).load()[0]
        assert cfg == want and summ["config"]["warmup_s"] == 0
    # the judge replays with them: a decode-bound run is slower on the H100 than on the H200
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_vs_real.py"), "--device", "H100",
                        "--runs", "h100-base8"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "### h100-base8 (8 lanes, group of 2 real runs)" in p.stdout
    svr = _bench("sim_vs_real")
    from sim_calibration.replay import replay

    cfg, recs, summ = h100["h100-base8"].load()
    on_h200 = svr.sim_figures(recs, summ, replay(cfg, recs, closed_loop=True), True)
    assert float(_cells(p.stdout, "TPOT p50 (ms)")[3]) > 1.2 * on_h200["tpot"]["p50"]


def test_simple_cpu_offload_runs_are_replayed_with_vllm_024s_lazy_walk():
    """The SimpleCPUOffload servers (vLLM 0.24.0, lazy_offload) held the blocks their lazy store
    copied (sim/offload.py `OffloadTier.walk`); the replay models that, the other runs have no tier."""
    off = [r for r in runs(DATA) if r.server.get("kv_offload") == "simple-cpu"]
    assert {r.name for r in off} == {"offB", "offb", "offb-r1", "offb-r2", "o32", "offbp", "offbp2",
                                     "offbp3", "offbp4", "off54", "off54b", "off54c", "off68", "off68b",
                                     "off68c", "off75", "off75b"}
    for r in off:
        cfg = r.load()[0]
        assert cfg.offload_store_walk and cfg.offload_store == "lazy"
        # the tier the server had: its cpu_bytes (h200-runs-8 and -9 READMEs) in GB, 60 GiB for the rest
        gb = {"off54": 54.0, "off68": 68.0, "off75": 75.0}.get(r.group, 64.424509440)
        assert cfg.offload_gb == pytest.approx(gb)


def test_group_rule_widens_the_bound_by_the_real_spread():
    svr = _bench("sim_vs_real")
    reals = [8.29, 8.57, 10.18]  # TTFT p50 (s) of offb-r1, offb, offb-r2
    lo, hi = svr.group_window(reals, 0.15)
    assert lo == pytest.approx(8.29 * 0.85) and hi == pytest.approx(10.18 * 1.15)
    # +27% against offb-r1 alone, but inside what the same configuration gave on another run
    assert svr.within_group(10.5, reals, 0.15) and abs(10.5 / 8.29 - 1) > 0.15
    assert svr.within_group(hi, reals, 0.15) and not svr.within_group(hi * 1.001, reals, 0.15)
    assert svr.within_group(lo, reals, 0.15) and not svr.within_group(lo * 0.999, reals, 0.15)
    # a run alone in its group: within +-bound of it, the rule before groups
    assert svr.within_group(1.15, [1.0], 0.15) and not svr.within_group(1.151, [1.0], 0.15)
    assert svr.spread([1.0]) == "(one run)"
    assert svr.spread([8.0, 9.0, 10.0]) == "8.00..10.00 (22%)"


def test_rank_interval_covers_the_true_quantile_about_95_percent_of_runs():
    """A run alone in its group prints where its p50 / p90 could lie (`rank_interval`). Over
    2,000 samples of 134 draws (spec32's measured requests) from a known distribution the
    interval holds the true quantile in about 95 % of them, and spec32's own TTFT p90 (a figure
    between a steady state and a start-up tail) spans two orders of magnitude."""
    import random

    from agentx.distribution import rank_interval

    svr = _bench("sim_vs_real")
    rng = random.Random(7)
    for q in (0.5, 0.9):
        truth = -math.log(1 - q)  # the exponential distribution's q-quantile
        hits = 0
        for _ in range(2000):
            lo, hi = rank_interval([rng.expovariate(1.0) for _ in range(134)], q)
            hits += lo <= truth <= hi
        assert 0.93 <= hits / 2000 <= 0.985, (q, hits)
    assert rank_interval(list(range(1, 101)), 0.5) == (41, 60)  # Conover's ranks for n=100
    run = next(r for r in runs(DATA) if r.name == "spec32")
    real = svr.real_figures(*run.load()[1:])
    lo, hi = real["ranks"]["ttft"]["p90"]
    assert lo < real["ttft"]["p90"] < hi and hi / lo > 50
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_vs_real.py"), "--runs", "spec32"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert _cells(p.stdout, "TTFT p90 (ms)")[2] == f"(one run; 95%: {lo:,.2f}..{hi:,.2f})"


def _cells(out: str, label: str) -> list[str]:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"| {label} ")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_cli_judges_a_run_against_its_group():
    """One replay of offb-r2: its table shows the group's real range of every bounded figure
    (computed here from the three runs' records) and judges the simulated median by it."""
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sim_vs_real.py"),
                        "--runs", "offb-r2"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "### offb-r2 (32 lanes, group of 8 real runs)" in out
    svr = _bench("sim_vs_real")
    group = {r.name: r for r in runs(DATA) if r.group == "offb"}
    assert set(group) == {"offb", "offb-r1", "offb-r2", "o32", "offbp", "offbp2", "offbp3", "offbp4"}
    reals = {n: svr.real_figures(*r.load()[1:]) for n, r in group.items()}
    for label, k, q in svr.ROWS:
        if k == "itl" or q not in svr.BOUNDS:
            continue
        vals = [f[k][q] for f in reals.values()]
        _, real, rng, sim, _, verdict = _cells(out, f"{label} (ms)")
        assert real == f"{reals['offb-r2'][k][q]:,.2f}"
        assert rng.startswith(f"{min(vals):,.2f}..{max(vals):,.2f} (")
        ok = svr.within_group(float(sim.replace(",", "")), vals, svr.BOUNDS[q])
        assert verdict.startswith("ok" if ok else "OUT"), (label, sim, vals)
    assert "| offb-r2 | offb | 32 |" in out


def test_recorded_hits_give_every_request_exactly_its_real_hit():
    """`replay(..., recorded_hits=True)` keeps the simulated cache and tier but makes each lookup
    find the hit the real run recorded: every request's reported hit (vLLM 0.24's: the latest
    admission before the first token) is its record's, while the tier's own decision differs."""
    from agentx.trace.load import load_traces
    from sim_calibration.realruns import keys
    from sim_calibration.replay import replay

    run = next(r for r in runs(DATA) if r.name == "off68")
    cfg, recs, summ = run.load()
    ks = keys(recs, summ, 16, load_traces(summ["config"]["trace"]))
    ok = [r for r in recs if r.get("ok")]
    imposed = replay(cfg, recs, keys=ks, recorded_hits=True)
    assert [s["cached"] for s in imposed] == [r["cached_tokens"] for r in ok]
    assert sum(r["cached_tokens"] for r in ok) > 0
    decided = replay(cfg, recs, keys=ks)
    assert [s["cached"] for s in decided] != [r["cached_tokens"] for r in ok]


def test_the_lazy_walk_loses_as_many_blocks_as_the_real_server():
    """offbp4's probe counted, as vLLM 0.24 ran, the cached GPU blocks its allocator evicted
    (207,702), those of them the CPU tier held no copy of (31,525: the lazy walk had not reached
    them), the blocks its walks stored (107,805), the walks that stored any (257) and those that
    started at the free queue's head (210: no cursor, or it was taken). A replay with the tier
    deciding the hits (sim/offload.py `OffloadTier.walk`) gives the same quantities: the amount of
    content the walk saves and loses is modelled; which requests then find a whole prefix is what
    differs (docs/simulator-calibration-log.md)."""
    from agentx.trace.load import load_traces
    from sim_calibration.realruns import keys
    from sim_calibration.replay import replay
    from sim_calibration.steps import load_steps

    run = next(r for r in runs(DATA) if r.name == "offbp4")
    cfg, recs, summ = run.load()
    steps = load_steps(DATA, "offbp4", Path("h200-runs-9") / "steps")
    real = {k: sum(r.get(k, 0) for r in steps)
            for k in ("gpu_evicted", "gpu_evicted_unstored", "store_blocks", "walk_head")}
    real["walks"] = sum(1 for r in steps if r.get("store_blocks"))
    assert real == {"gpu_evicted": 207_702, "gpu_evicted_unstored": 31_525, "store_blocks": 107_805,
                    "walk_head": 210, "walks": 257}
    stats: dict = {}
    replay(cfg, recs, keys=keys(recs, summ, 16, load_traces(summ["config"]["trace"])), stats=stats)
    assert stats["gpu_evicted"] == pytest.approx(real["gpu_evicted"], rel=0.05)
    assert stats["gpu_evicted_unstored"] == pytest.approx(real["gpu_evicted_unstored"], rel=0.25)
    assert stats["stored"] == pytest.approx(real["store_blocks"], rel=0.2)
    assert stats["walks"] == pytest.approx(real["walks"], rel=0.2)
    assert stats["walk_restarts"] == pytest.approx(real["walk_head"], rel=0.25)


def test_tier_breaks_counts_every_measured_request_of_a_replay():
    """bench/tier_breaks.py on offbp4 (probed before AGENTX_STEPLOG_FATES existed): the real
    columns say so, and the simulated ones classify each of the 105 measured requests' first
    lookup once, most hits stopping at content no request had computed."""
    p = subprocess.run([sys.executable, str(REPO / "bench" / "tier_breaks.py"), "--runs", "offbp4"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "### offbp4 (105 measured requests; simulated: one replay)" in p.stdout
    rows = {c[0]: c[1:] for c in (_cells(p.stdout, label) for label in
                                  ("new content", "cpu-evicted", "gpu-evicted without a CPU copy"))}
    assert all(c[:2] == ["not recorded", "not recorded"] for c in rows.values())
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    sim = [[int(x) for x in ln.strip("|").split("|")[3:5]] for ln in lines]
    assert sum(map(sum, sim)) == 105
    assert rows["new content"][3] != "0" and int(rows["new content"][2]) == 0


def test_hit_excess_splits_a_replays_extra_hits_by_the_real_zero_hit_requests(capsys):
    """bench/hit_excess.py: the probe's lazy-walk totals of offbp4 (what the test above sums),
    and a counter the probe did not have yet (off68) not recorded rather than zero; the excess of
    one closed-loop replay over the real hits is the sum of its parts on the requests the real
    server served no hit and on the others, and the zero-hit sets are measured requests; each
    third by prompt size splits into the GPU's and the tier's hit, real (the probe's loads) and
    replayed."""
    from agentx.trace.load import load_traces
    from sim_calibration.realruns import keys
    from sim_calibration.replay import replay

    mod = _bench("hit_excess")
    assert mod.real_walk("offbp4") == {"stored": 107_805, "walks": 257, "walk_restarts": 210,
                                       "gpu_evicted_unstored": 31_525, "cpu_evicted": 80_500}
    assert mod.real_walk("off68")["walk_restarts"] is None and mod.real_walk("offb") is None
    run = next(r for r in runs(DATA) if r.name == "offbp4")
    cfg, recs, summ = run.load()
    stats: dict = {}
    sims = [replay(cfg, recs, keys=keys(recs, summ, 16, load_traces(summ["config"]["trace"])),
                   stats=stats, closed_loop=True)]
    f = mod.split(recs, sims)
    ids = {r["request_id"] for r in recs if r.get("ok") and not r.get("warmup")}
    assert f["measured"] == len(ids) == 105 and f["zero"] <= ids and f["sim_zero"][0] <= ids
    assert f["real_rate"] == pytest.approx(35.5, abs=0.05)
    assert f["total"] == pytest.approx(f["on_zero"] + f["on_others"])
    assert f["total"] == pytest.approx(f["rates"][0] - f["real_rate"])
    assert all(0 < x <= 1 for x in f["served"][0])
    assert stats["walks"] > 0 and stats["walk_restarts"] > 0
    # the thirds by prompt size, weighted by their prompt tokens, give back the whole rate
    ok = {r["request_id"]: r for r in recs if r.get("ok")}
    order = sorted(ids, key=lambda i: ok[i]["isl"])
    k = len(order) // 3
    weights = [sum(ok[i]["isl"] for i in t) for t in (order[:k], order[k:2 * k], order[2 * k:])]
    for got, want in ((f["by_size"]["real"], f["real_rate"]), (f["by_size"]["sims"][0], f["rates"][0])):
        assert sum(g * w for g, w in zip(got, weights)) / sum(weights) == pytest.approx(want)
    # with the probe's loads, each third's hit splits into the GPU's and the tier's parts: every
    # real hit of offbp4 came from the tier (66 loads, none past the reported hit)
    tier = mod.real_tier("offbp4")
    assert len(tier) >= 66 and mod.real_tier("offb") is None
    hit = {r["request_id"] for r in recs if r.get("ok") and not r.get("warmup") and r["cached_tokens"]}
    assert all(0 < tier[i] == ok[i]["cached_tokens"] for i in hit)
    f = mod.split(recs, sims, tier)
    for src, size in ((f["by_source"]["real"], f["by_size"]["real"]),
                      (f["by_source"]["sims"][0], f["by_size"]["sims"][0])):
        assert [gpu + tr for gpu, tr in src] == pytest.approx(size)
    assert [gpu for gpu, _ in f["by_source"]["real"]] == [0, 0, 0]
    assert sum(x["cached_tier"] for x in sims[0]) > 0
    assert all(0 <= x["cached_tier"] <= x["cached"] for x in sims[0])
    # the report prints the size split, for this probed run by source, and the walk totals
    mod.report("offbp4", recs, sims, [stats])
    out = capsys.readouterr().out
    assert "- hit by prompt size: shortest third real 66.9 %" in out
    assert "- the same by source, GPU / tier % (replays' medians): shortest real 0.0 / 66.9, " in out
    assert "- lazy walk, real / replays' median: stored 107,805 / " in out


def test_closed_loop_sends_each_lanes_next_request_its_recorded_gap_after_the_simulated_end():
    """`replay(..., closed_loop=True)`: within the warm-up and within the measured window, a lane's
    request leaves the client the recorded gap (think time and the client's own work) after the
    simulator finished the lane's previous one; warm-up requests that start a lane and each lane's
    first measured request keep their recorded send times, as every request does in open loop."""
    from sim_calibration.replay import replay

    run = next(r for r in runs(DATA) if r.name == "base")
    cfg, recs, _ = run.load()
    ok = [r for r in recs if r.get("ok")]
    t0 = min(r["start_ns"] for r in ok)

    def sent(rows):
        return [round(x["end_ns"] - x["e2e_ms"] * 1e6) for x in rows]

    assert all(abs(s - r["start_ns"]) < 1_000 for s, r in zip(sent(replay(cfg, recs)), ok))
    rows = replay(cfg, recs, closed_loop=True)
    at = dict(zip((r["request_id"] for r in ok), zip(sent(rows), rows)))
    lanes: dict = {}
    for r in sorted(ok, key=lambda r: r["start_ns"]):
        lanes.setdefault(r["lane"], []).append(r)
    chained = 0
    for chain in lanes.values():
        assert abs(at[chain[0]["request_id"]][0] - chain[0]["start_ns"]) < 1_000
        for a, b in zip(chain, chain[1:]):
            got = at[b["request_id"]][0]
            if bool(a.get("warmup")) != bool(b.get("warmup")):
                assert abs(got - b["start_ns"]) < 1_000  # the measured window starts as recorded
                continue
            want = at[a["request_id"]][1]["end_ns"] + (b["start_ns"] - a["end_ns"])
            assert abs(got - want) < 1_000, (b["request_id"], (got - t0) / 1e9, (want - t0) / 1e9)
            chained += 1
    assert chained > len(ok) // 2
    assert any(abs(s - r["start_ns"]) > 1e6 for s, r in zip(sent(rows), ok))


def test_closed_loop_throughput_scales_the_window_by_the_lanes_summed_stretch():
    """In closed loop the simulated throughput is the measured tokens over the real window scaled
    by the lanes' summed stretch (`lane_stretch`), not shifted by the last end alone: one lane
    finishing late no longer judges the server. Open loop keeps the last-end shift."""
    svr = _bench("sim_vs_real")

    def rec(lane, start, end, isl=100):
        return {"ok": True, "lane": lane, "start_ns": start, "end_ns": end, "isl": isl, "osl": 10,
                "ttft_ms": 1.0, "e2e_ms": 1.0, "tpot_ms": None, "cached_tokens": 0}

    def row(end):
        return {"end_ns": end, "ttft_ms": 1.0, "e2e_ms": 1.0, "tpot_ms": None, "itl": [], "cached": 0,
                "queue_ms": 0.0, "prefill_ms": 0.0, "frontend_ms": 0.0, "preemptions": 0}

    s = 10**9
    # lane 0 spans 10 s real, 8 s simulated; lane 1 spans 10 s real, 14 s simulated
    recs = [rec(0, 0, 4 * s), rec(0, 5 * s, 10 * s), rec(1, 0, 5 * s), rec(1, 6 * s, 10 * s)]
    rows = [row(3 * s), row(8 * s), row(6 * s), row(14 * s)]
    assert svr.lane_stretch(list(zip(recs, rows))) == pytest.approx(22 / 20)
    summ = {"throughput": {"window_s": 10.0}}
    tokens = 4 * 110
    closed = svr.sim_figures(recs, summ, rows, closed_loop=True)["tok_s"]
    assert closed == pytest.approx(tokens / (10.0 * 22 / 20))
    # open loop: the window stretched by how much later the last request ended (4 s)
    assert svr.sim_figures(recs, summ, rows)["tok_s"] == pytest.approx(tokens / 14.0)


def test_tier_breaks_reads_the_real_fates_of_a_probed_run():
    """bench/tier_breaks.py on h100-offb (probed with AGENTX_STEPLOG_FATES=1): the real columns
    count each of the 99 measured requests' first lookup by the stop the probe logged (counted
    here from the events file itself), and the share of the prompt found before a stop is the
    probe's GPU + tier tokens over the prompt."""
    import gzip
    import json
    from collections import Counter

    p = subprocess.run([sys.executable, str(REPO / "bench" / "tier_breaks.py"), "--runs", "h100-offb"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "### h100-offb (real on an H100, replayed on the H200 profile) (99 measured requests" in p.stdout
    from sim_calibration.realruns import h100_runs

    (run,) = [r for r in h100_runs(DATA) if r.name == "h100-offb"]
    _, recs, _ = run.load()
    measured = {r["request_id"]: r for r in recs if r.get("ok") and not r.get("warmup")}
    first: dict = {}
    with gzip.open(DATA / "h100-runs" / "steps" / "h100-offb-events.jsonl.gz", "rt") as f:
        for e in map(json.loads, f):
            if e.get("ev") == "lookup":
                first.setdefault(e["req"].removeprefix("cmpl-").rsplit("-", 2)[0], e)
    want = Counter((first[i]["stop"], "zero" if (r["cached_tokens"] or 0) < 0.05 * r["isl"] else "hit")
                   for i, r in measured.items())
    assert sum(want.values()) == 99
    for label in ("new content", "cpu-evicted", "gpu-evicted without a CPU copy"):
        cells = _cells(p.stdout, label)
        assert [int(cells[1]), int(cells[2])] == [want[(label, "zero")], want[(label, "hit")]]
        shares = [(first[i]["gpu"] + first[i]["hit"]) / r["isl"] for i, r in measured.items()
                  if first[i]["stop"] == label]
        assert cells[5] == f"{sum(shares) / len(shares):.2f}"
    assert float(_cells(p.stdout, "new content")[5]) > 0.9  # a whole previous prompt found
