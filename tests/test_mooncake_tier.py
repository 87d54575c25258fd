"""Mooncake as the H200 runs showed it (tests/data/h200-runs-4; their replay through the tier
model: tests/test_tier_replay.py): the tier the master keeps filled, a URL run learning the
connector from /metrics, and a verdict that names a connector that stores but never loads."""
from __future__ import annotations

import pytest

from agentx import offload
from agentx.cache_theory import tiers
from agentx.offload import Mooncake
from agentx.scrape.prom import parse_metrics
from agentx.verdict.validate import Expectations, validate

SEGMENT_TOKENS = 429_616  # "59GB" = 63,350,767,616 bytes over 147,456 bytes a token


def test_held_fraction_is_the_masters_eviction_band():
    m = Mooncake()
    assert m.held_fraction() == pytest.approx(0.80 * 0.95)
    tier = Mooncake(gpus_per_node=1).plan(ranks=1, host_mib=81920)  # the recipe of the runs
    assert tier.total_bytes == 59 * 2**30
    assert tier.held_bytes == int(59 * 2**30 * 0.76)
    assert any("held in steady state: x 0.76" in s for s in tier.budget.steps)
    wide = Mooncake(eviction_high_watermark_ratio=0.95, eviction_ratio=0.05)
    assert wide.held_fraction() == pytest.approx(0.95 * 0.975)


def test_lookup_async_is_rendered_only_when_asked():
    assert Mooncake().extra_config() == {"load_async": True}
    assert Mooncake(lookup_async=True).extra_config() == {"load_async": True,
                                                          "lookup_async": True}


# A start-up page of vLLM 0.24 with Mooncake: the connector's families are declared (HELP and
# TYPE) before the first operation gives them a sample.
START_PAGE = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_cpu_blocks="None"} 1.0
# HELP vllm:mooncake_store_operation_keys_total Keys touched by Mooncake store operations.
# TYPE vllm:mooncake_store_operation_keys_total counter
"""


def test_a_url_run_learns_the_store_policy_from_the_declared_families():
    snap = parse_metrics(START_PAGE)
    assert offload.by_families(snap.families) is Mooncake
    tier = tiers.resolve(SEGMENT_TOKENS, snap)
    assert tier["offload_eager"] is True and tier["offload_tokens"] == SEGMENT_TOKENS
    plain = parse_metrics(START_PAGE.split("# HELP vllm:mooncake")[0])
    assert offload.by_families(plain.families) is None
    assert tiers.resolve(SEGMENT_TOKENS, plain)["offload_eager"] is False  # lazy: SimpleCPU's


def _summary(stored: float, theory_offload: float) -> tuple[dict, Expectations]:
    sm = {"available": True, "offload": {
        "hits_observed": False,
        "loads": {"external_prefix_cache_hits": 0.0, "mooncake_keys_loaded": 0.0},
        "stores": {"mooncake_keys_saved": stored, "mooncake_failed_keys": 0.0}}}
    exp = Expectations(offload_expected=True, working_set_exceeds_pool=True,
                       tier_hit_rates={"gpu": 0.0, "offload": theory_offload},
                       required_families=[], require_complete_window=False, min_samples=0)
    return {"server_metrics": sm}, exp


def test_stores_but_never_loads_fails_when_the_theory_expects_loads():
    summary, exp = _summary(131_609, 0.30)
    v = validate(summary, exp)
    assert v["verdict"] == "fail"
    assert any("stored 131,609 blocks and loaded none (stores but never loads)" in r
               for r in v["reasons"])


def test_stores_but_never_loads_is_named_but_passes_when_the_tier_turns_over():
    """The real 32-lane Mooncake run: the eager model predicts no tier hits, so a server that
    stores and never loads is doing what its tier size allows; the verdict says so in one line."""
    summary, exp = _summary(131_609, 0.0)
    v = validate(summary, exp)
    check = next(c for c in v["checks"] if c["name"] == "offload_hits")
    assert check["ok"] is True and v["verdict"] == "pass"
    [note] = [w for w in v["warnings"] if w.startswith("offload:")]
    assert "stored 131,609 blocks and loaded none" in note and "0.0%" in note


def test_nothing_stored_and_nothing_loaded():
    """Where the theory expects tier hits this fails as before; where it expects none (blocks
    left the pool and were not asked for again) no load is required."""
    summary, exp = _summary(0.0, 0.30)
    v = validate(summary, exp)
    assert v["verdict"] == "fail"
    assert any("nothing came back from offload" in r for r in v["reasons"])
    summary, exp = _summary(0.0, 0.0)
    v = validate(summary, exp)
    assert v["verdict"] == "pass"
    assert any(r.startswith("offload_hits: the pool-aware theory expects no hits")
               for r in v["skipped"])


def test_a_run_whose_mooncake_tier_turns_over_says_so_in_one_line(tmp_path, capsys):
    """The embedded simulator with a Mooncake tier far smaller than the lanes cycle through
    (8 lanes of ~5,000-token sessions, a 16,384-token pool, a 4,900-token tier): every computed
    block is put and overwritten before its session returns. The run passes (the eager theory
    expects 0.0% from the tier) and names the store that never loaded in one line."""
    import json

    from agentx.cli import main
    from helpers import write_trace

    trace = write_trace(tmp_path / "tr", sessions=30, turns=8, think=0.0, out=20)
    out = tmp_path / "out"
    rc = main(["run", "--trace", str(trace), "--conc", "8", "--duration", "6", "--drain-timeout",
               "20", "--no-progress", "-o", str(out), "--sim-profile", "cpu-tiny",
               "--sim-kv-pool-tokens", "16384", "--sim-kv-offload", "mooncake",
               "--sim-offload-gb", "0.02", "--sim-time-scale", "2"])
    s = json.loads((out / "summary.json").read_text())
    off = s["server_metrics"]["offload"]
    assert off["stores"]["mooncake_keys_saved"] > 0 and off["loads"]["mooncake_keys_loaded"] == 0
    assert s["cache"]["offload_eager"] is True
    assert rc == 0 and s["validation"]["verdict"] == "pass", s["validation"]["reasons"]
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if x.startswith("agentx: warning: offload:")]
    assert "blocks and loaded none, as the tier theory predicts (0.0% from the tier)" in line


def test_render_keeps_the_segment_and_sizes_the_theory_by_what_is_held(tmp_path):
    """vLLM reads the segment as rendered (tests/vllm_env/check_recipe_configs.py checks its
    bytes); the tier the theory and a recipe side's `--offload-tokens` use is the held share."""
    from agentx.recipe.load import load_recipe
    from agentx.recipe.render import render

    recipe, path = load_recipe("minimaxm3-fp8-h200")
    r = render(recipe, 0, workdir=tmp_path, recipe_dir=path.parent)
    assert r.kv_offload == "mooncake"
    assert r.offload_held_bytes == int(r.offload_bytes * Mooncake().held_fraction())
