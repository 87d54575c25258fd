"""One builder for the simulated engine (sim/build.py): the offline calibration runs the
engine the server runs, the offload tier and its store policy included."""
from __future__ import annotations

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from sim_calibration.offline import Scenario, simulate

# 16 prompts of 125 blocks revisited in turn; a GPU pool of 1200 blocks and a 2 GB CPU tier
# (847 blocks) hold them all only if the tier keeps just what the GPU evicted
REVISITS = Scenario(8, 2000, 256, 48, distinct=16, measure_from=16)


def _cfg(store: str | None) -> SimConfig:
    return SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=16 * 1200,
                     kv_offload="simple-cpu", offload_gb=2, offload_store=store)


def test_server_and_offline_runs_get_the_same_store_policy():
    assert build_engine(_cfg("eager")).engine.offload.eager
    assert not build_engine(_cfg("lazy")).engine.offload.eager
    assert not build_engine(_cfg(None)).engine.offload.eager  # simple-cpu: lazy, as in vLLM


def test_offline_runs_honour_the_offload_store():
    """An eager store puts every computed block in the tier, so the cyclic working set churns
    it and no revisit hits; a lazy one stores GPU evictions only and revisits hit the host."""
    default, eager, lazy = (simulate(_cfg(s), REVISITS) for s in (None, "eager", "lazy"))
    assert eager["cached_mean"] == 0
    assert lazy["cached_mean"] > 0 and lazy["ttft_p50_ms"] < eager["ttft_p50_ms"]
    assert default == lazy
