"""One builder for the simulated engine (sim/build.py): the offline calibration runs the
engine the server runs, the offload tier and its store policy included."""
from __future__ import annotations

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.offline import Scenario, simulate
from agentx.sim.request import SimRequest

# 16 prompts of 125 blocks revisited in turn: more than a GPU pool of 1200 blocks and a 2 GB CPU
# tier (847 blocks) hold, less than an 8 GB one (3,390 blocks)
REVISITS = Scenario(8, 2000, 256, 48, distinct=16, measure_from=16)


def _cfg(store: str | None, gb: float = 2) -> SimConfig:
    return SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=16 * 1200,
                     kv_offload="simple-cpu", offload_gb=gb, offload_store=store)


def test_server_and_offline_runs_get_the_same_store_policy():
    assert build_engine(_cfg("eager")).engine.offload.eager
    assert not build_engine(_cfg("lazy")).engine.offload.eager
    assert not build_engine(_cfg(None)).engine.offload.eager  # simple-cpu: lazy, as in vLLM


def test_offline_runs_honour_the_offload_store():
    """vLLM's lazy store (SimpleCPUOffload `_prepare_lazy_store_specs`) walks the GPU free queue
    after every schedule and copies what the tier lacks, so a request's blocks reach the tier
    once it has freed them; an eager store copies each block as soon as it is computed. With a
    tier that holds every prompt both bring the revisits back; with one that does not, the walk
    stores every freed block and churns the tier just as the eager store does."""
    default, eager, lazy = (simulate(_cfg(s, gb=8), REVISITS) for s in (None, "eager", "lazy"))
    assert default == lazy
    assert lazy["cached_mean"] > 0 and eager["cached_mean"] > 0
    small = [simulate(_cfg(s), REVISITS) for s in ("eager", "lazy")]
    assert [r["cached_mean"] for r in small] == [0, 0]

    for store in ("eager", "lazy"):
        eng = build_engine(_cfg(store, gb=8)).engine
        eng.use_virtual_clock()
        req = SimRequest(rid="0", prompt_len=2000, max_tokens=3, block_hashes=list(range(1, 126)))
        eng.submit(req)
        while req.num_out == 0:
            assert eng.step_offline()
        # prefilled and decoding: only the eager store has copied its blocks
        assert (eng.offload.stored_blocks > 0) == (store == "eager")
        while req.finish is None:
            assert eng.step_offline()
        for _ in range(4):  # idle schedules: the walk reaches the freed blocks (1,024 a step
            eng.step_offline()  # past ~1,075 never-used ones), copies them; then the poll
            eng.virtual_ns += 10**9
        assert all(h in eng.offload.blocks for h in req.block_hashes), store
