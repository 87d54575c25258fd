"""KV-offload connectors as a registry: each connector's recipe options, rendering, DRAM rule,
store policy, server signals and simulator families come from its class, and LMCache
(LMCacheConnectorV1) works end to end as one more class: a recipe point renders its vLLM
command, the simulator models its chunked tier, and the tier model reads its store policy."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentx import offload
from agentx.cache_theory.tiers import offload_tier
from agentx.errors import InputError
from agentx.offload import LMCache, Mooncake, SimpleCPU, dram
from agentx.recipe.load import load_recipe
from agentx.recipe.render import render
from agentx.recipe.schema import Recipe
from agentx.recipe.simargs import sim_options
from agentx.scrape import server_metrics
from agentx.scrape.prom import parse_metrics
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.offload import OffloadTier

HOST_MIB = 1_471_356  # InferenceX's H200 node (free -m)


def _recipe(kv_offload: dict | str, points: list[dict] | None = None) -> Recipe:
    return Recipe.model_validate({
        "model": "m", "precision": "bf16", "hardware": "h200", "gpus": 8,
        "kv_offload": kv_offload, "points": points or [{"tp": 8, "conc": [1]}],
        "sim_profile": "h200-qwen3-8b-bf16"})


# ------------------------------------------------------------------ the registry

def test_registry_lists_each_connector_once_with_its_vllm_name():
    assert offload.KINDS == ("none", "simple-cpu", "mooncake", "lmcache")
    names = [c.vllm_name for c in offload.CONNECTORS]
    assert names == ["", "SimpleCPUOffloadConnector", "MooncakeStoreConnector",
                     "LMCacheConnectorV1"]
    assert offload.by_vllm_name("LMCacheConnectorV1") is LMCache
    assert offload.by_vllm_name("native") is None
    with pytest.raises(KeyError, match="known: none, simple-cpu, mooncake, lmcache"):
        offload.connector("lmcache2")


def test_no_switch_on_the_none_kind_outside_the_registry():
    """Whether a tier exists is the connector's `enabled`, its InferenceX name its
    `inferencex_name`: no module outside agentx/offload/ compares a kind with "none"."""
    root = Path(offload.__file__).parents[1]
    switch = re.compile(r"""(offload\w*|kind)\s*[!=]=\s*["']none["']|["']none["']\s*[!=]=\s*\w*(offload|kind)""")
    found = [f"{f.relative_to(root.parent)}:{n}: {line.strip()}"
             for f in sorted(root.rglob("*.py")) if "offload" not in f.relative_to(root).parts[:1]
             for n, line in enumerate(f.read_text().splitlines(), 1) if switch.search(line)]
    assert not found, "\n".join(found)
    assert [c.enabled for c in offload.CONNECTORS] == [False, True, True, True]
    assert [c.inferencex_name for c in offload.CONNECTORS[1:]] == ["vllm-simple", "mooncake", "lmcache"]


def test_store_policies_are_the_connectors():
    assert offload.connector("mooncake").store.eager
    assert not offload.connector("simple-cpu").store.eager  # the recipes' lazy_offload
    assert SimpleCPU(lazy_offload=False).store_policy().eager
    assert LMCache().store_policy() == offload.StorePolicy(eager=True, chunk_tokens=256)
    assert LMCache(chunk_size=512).store_policy().chunk_tokens == 512


def test_server_signals_come_from_each_class():
    keys = [s.key for c in offload.CONNECTORS for s in c.loads + c.stores]
    assert keys == ["simple_kv_offload_blocks_loaded", "simple_kv_offload_blocks_stored",
                    "mooncake_keys_loaded", "mooncake_keys_saved", "mooncake_failed_keys"]
    text = ('# TYPE vllm:mooncake_store_operation_keys_total counter\n'
            'vllm:mooncake_store_operation_keys_total{operation="load_get",status="ok"} {n}\n')
    first, last = (parse_metrics(text.replace("{n}", str(n)), t=t) for t, n in ((0, 5), (1, 12)))
    off = server_metrics.compute(first, last)["offload"]
    assert off["loads"]["mooncake_keys_loaded"] == 7 and off["hits_observed"] is True
    assert off["loads"]["simple_kv_offload_blocks_loaded"] is None  # not exposed here


def test_point_kind_takes_the_recipes_section_or_the_connectors_defaults():
    r = _recipe({"kind": "mooncake", "host_dram_mib": HOST_MIB, "page_cache_reserve_gib": 414},
                [{"tp": 8, "conc": [1]}, {"tp": 8, "kv_offload": "mooncake", "conc": [1]},
                 {"tp": 8, "kv_offload": "lmcache", "conc": [1]},
                 {"tp": 8, "kv_offload": {"kind": "simple-cpu", "cpu_bytes": 10**9}, "conc": [1]}])
    p0, p1, p2, p3 = (r.offload(p) for p in r.points)
    assert p0 is r.kv_offload and p1 is r.kv_offload
    # LMCache shares the DRAM budget and the page-cache reserve, not Mooncake's buffer
    assert isinstance(p2, LMCache) and (p2.host_dram_mib, p2.page_cache_reserve_gib) == (HOST_MIB, 414)
    assert isinstance(p3, SimpleCPU) and p3.cpu_bytes == 10**9 and p3.host_dram_mib == HOST_MIB


# ------------------------------------------------------------------ LMCache

def test_lmcache_dram_rule_per_rank_in_gib():
    """1234 GB -> 1149 GiB; (1149 - 414) // 8 = 91 GiB pinned per rank (no local buffer)."""
    t = LMCache(host_dram_mib=HOST_MIB, page_cache_reserve_gib=414).plan(8)
    assert (t.per_rank_gib, t.total_bytes, t.allocated_gb) == (91, 91 * 2**30 * 8, 1234)
    assert "LMCACHE_MAX_LOCAL_CPU_SIZE=91 (LMCache reads GB as 2^30 bytes" in t.budget.steps[-1]
    with pytest.raises(dram.BudgetError, match="per rank is -3 GiB"):
        LMCache(host_dram_mib=HOST_MIB, page_cache_reserve_gib=1173).plan(8)


def test_lmcache_point_renders_connector_and_environment(tmp_path):
    r = _recipe({"kind": "lmcache", "host_dram_mib": HOST_MIB, "page_cache_reserve_gib": 414,
                 "chunk_size": 512})
    out = render(r, 0, workdir=tmp_path)
    i = out.argv.index("--kv-transfer-config")
    assert json.loads(out.argv[i + 1]) == {"kv_connector": "LMCacheConnectorV1",
                                           "kv_role": "kv_both"}
    assert out.env == {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_LOCAL_CPU": "True",
                       "LMCACHE_MAX_LOCAL_CPU_SIZE": "91"}
    assert (out.kv_offload, out.allocated_dram_gb, out.files, out.sidecars) == \
        ("lmcache", 1234, {}, [])
    script = out.script()
    assert "export LMCACHE_MAX_LOCAL_CPU_SIZE=91" in script
    assert "DRAM budget for the lmcache KV tier" in script


def test_shipped_lmcache_point_and_its_simulator_options():
    recipe, path = load_recipe("qwen3-8b-dummy-h200")
    [idx] = [i for i, p in enumerate(recipe.points) if p.name == "lmcache"]
    out = render(recipe, idx, recipe_dir=path.parent, environ={})
    assert out.env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "8" and out.offload_bytes == 8 * 2**30
    opts = sim_options(recipe, idx, recipe_dir=path.parent)
    assert (opts["kv_offload"], opts["offload_gb"], opts["offload_chunk_tokens"]) == \
        ("lmcache", 8 * 2**30 / 1e9, 256)


def test_lmcache_tier_hits_end_on_chunk_boundaries():
    tier = OffloadTier(1000, block_size=16, eager=True, chunk_tokens=256)
    tier.store_many(range(40))  # 640 tokens
    assert tier.match(list(range(40)), 40) == 32  # 2 whole chunks of 16 blocks
    assert tier.match(list(range(5, 40)), 35, start=5) == 27  # ends at block 32 all the same
    assert tier.match(list(range(20, 40)), 20, start=20) == 12
    assert tier.match(list(range(3)), 3) == 0  # less than a chunk: no hit
    plain = OffloadTier(1000, block_size=16, eager=True)
    plain.store_many(range(40))
    assert plain.match(list(range(40)), 40) == 40


def test_simulator_models_lmcache_and_validation_reads_its_tier():
    eng = build_engine(SimConfig(profile="cpu-tiny", kv_offload="lmcache", offload_gb=1))
    tier = eng.engine.offload
    assert tier.eager and tier.chunk_tokens == 256
    text = eng.stats.render().decode()
    assert 'kv_offloading_backend="LMCacheConnectorV1"' in text
    assert "vllm:simple_kv_offload" not in text and "vllm:mooncake" not in text
    seen = offload_tier(parse_metrics(text))
    assert seen["offload_tokens"] == eng.res.offload_blocks * eng.res.block_size
    assert seen["offload_eager"] is True and seen["offload_source"] == "vllm:cache_config_info"
    chunked = build_engine(SimConfig(profile="cpu-tiny", kv_offload="lmcache", offload_gb=1,
                                     offload_chunk_tokens=64))
    assert chunked.engine.offload.chunk_tokens == 64


def test_simulator_emits_each_connectors_own_families():
    for kind, family in (("simple-cpu", "vllm:simple_kv_offload_info"),
                         ("mooncake", "vllm:mooncake_store_operation_keys_total")):
        eng = build_engine(SimConfig(profile="cpu-tiny", kv_offload=kind, offload_gb=1))
        assert family in eng.stats.render().decode(), kind
    assert offload.connector("lmcache").load_gbps == 20.0


def test_unknown_connector_kind_is_refused():
    with pytest.raises(InputError, match="kind must be one of"):
        from agentx.yamlconf import load_model
        load_model("model: m\nprecision: bf16\nhardware: h200\ngpus: 1\n"
                   "kv_offload: {kind: lmcash}\npoints: [{conc: [1]}]\n", Recipe, "r.yaml")
    assert Mooncake().vllm_name == "MooncakeStoreConnector"


def test_mooncake_render_unchanged(tmp_path):
    """The Mooncake config, side process and environment, as InferenceX's scripts."""
    r = _recipe({"kind": "mooncake", "host_dram_mib": HOST_MIB, "page_cache_reserve_gib": 414})
    out = render(r, 0, port=8000, workdir=tmp_path)
    cfg = json.loads(out.files[str(tmp_path / "mooncake_config.json")])
    assert cfg["global_segment_size"] == "87GB" and cfg["master_server_address"].endswith(":20000")
    assert out.sidecars[0][:3] == ["mooncake_master", "--port", "20000"]
    assert out.env == {"MOONCAKE_CONFIG_PATH": str(Path(tmp_path) / "mooncake_config.json"),
                       "PYTHONHASHSEED": "0"}


def test_validation_takes_an_lmcache_tiers_store_mode_from_its_connector():
    """vLLM 0.32 with LMCache names no connector on /metrics (kv_offloading_backend "native",
    num_cpu_blocks "None"): the size comes from the recipe, the store mode from the connector
    the recipe launched; what the server says wins."""
    from agentx.cache_theory.tiers import resolve
    real = parse_metrics('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{'
                         'block_size="16",engine="0",kv_offloading_backend="native",'
                         'num_cpu_blocks="None",num_gpu_blocks="1000"} 1.0\n')
    assert resolve(500_000, real, connector="lmcache") == {
        "offload_tokens": 500_000, "offload_eager": True, "offload_source": "--offload-tokens"}
    assert resolve(500_000, real, connector="simple-cpu")["offload_eager"] is False
    assert resolve(500_000, real)["offload_eager"] is False  # unknown: the recipes' lazy
    simple_lazy = parse_metrics(
        '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",'
        'engine="0"} 1.0\n# TYPE vllm:simple_kv_offload_info gauge\n'
        'vllm:simple_kv_offload_info{capacity_blocks="10",engine="0",lazy_offload="true"} 1.0\n')
    assert resolve(None, simple_lazy, connector="lmcache")["offload_eager"] is False


def test_requests_waiting_for_kv_loads_by_stage():
    """A series the reader did not read: vLLM 0.32's num_requests_kv_fetch_by_stage (a
    connector that loads KV registers it), time-weighted per stage; absent: None."""
    def scrape(t: float, waiting: int, loading: int):
        return parse_metrics(
            "# TYPE vllm:num_requests_kv_fetch_by_stage gauge\n" + "".join(
                f'vllm:num_requests_kv_fetch_by_stage{{engine="{e}",model_name="m",'
                f'stage="{stage}"}} {n}\n' for e in (0, 1)
                for stage, n in (("waiting_to_start", waiting), ("in_progress", loading),
                                 ("completed_waiting", 0))), t=t)
    snaps = [scrape(0, 0, 2), scrape(1, 2, 4), scrape(2, 0, 0)]
    got = server_metrics.compute(snaps[0], snaps[-1], snaps)["kv_fetch_waiting"]
    assert sorted(got) == ["completed_waiting", "in_progress", "waiting_to_start"]
    assert (got["in_progress"]["mean"], got["in_progress"]["max"]) == (5.0, 8)  # 2 engines
    assert got["completed_waiting"]["max"] == 0
    assert server_metrics.compute(parse_metrics("", t=0), parse_metrics("", t=1))[
        "kv_fetch_waiting"] is None
