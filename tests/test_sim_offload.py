"""KV offload tier: a working set larger than the GPU pool but smaller than the CPU tier comes back
from host memory (host-source hits > 0) and so gets a lower TTFT p50 than with offload off; a
run whose prompts come back from the tier near the pool size keeps serving; the tier's hits
equal the client's model of it (agentx.prefix_cache.TieredCache) request by request."""
from __future__ import annotations

import json
import statistics

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agentx.cli import main
from agentx.prefix_cache import TieredCache
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from agentx.sim.engine import SimEngine
from agentx.sim.offload import OffloadTier
from agentx.sim.request import SimRequest
from agentx.tokens.words import WORDS
from helpers import post_stream, write_trace

POOL_TOKENS = 4096  # GPU pool: 256 blocks of 16
N_PROMPTS, ROUNDS = 8, 4  # 8 prompts x ~1000 tokens = 2x the GPU pool, a tiny part of the CPU tier


def prompt(i: int) -> list[dict]:
    words = " ".join(WORDS[(i * 97 + j * 13) % len(WORDS)] for j in range(990))
    return [{"role": "user", "content": f"file{i} " + words}]


async def run(offload: str) -> tuple[list[float], dict]:
    cfg = SimConfig(profile="cpu-tiny", time_scale=2, kv_pool_tokens=POOL_TOKENS, block_size=16,
                    kv_offload=offload, offload_gb=1 if offload != "none" else None)
    ttfts = []
    with start_in_thread(cfg) as sim:
        assert offload == "none" or sim.sim.res.offload_blocks * 16 > N_PROMPTS * 1000
        async with aiohttp.ClientSession() as s:
            for _ in range(ROUNDS):
                for i in range(N_PROMPTS):
                    res = await post_stream(s, sim.base_url + "/v1/chat/completions",
                                            {"messages": prompt(i), "max_tokens": 4, "ignore_eos": True,
                                             "stream": True, "stream_options": {"include_usage": True}})
                    first_tok = next(t for t, c, _ in res.events
                                     if c["choices"] and c["choices"][0]["delta"].get("content"))
                    ttfts.append((first_tok - res.sent_ns) / 1e6)
            async with s.get(sim.base_url + "/metrics") as r:
                fams = {f.name: f for f in text_string_to_metric_families(await r.text())}
    return ttfts, fams


def value(fams: dict, name: str, **labels) -> float:
    return sum(s.value for s in fams[name].samples
               if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("backend", ["simple-cpu", "mooncake", "lmcache"])
async def test_offload_hits_host_and_lowers_ttft(backend):
    off_ttft, off_fams = await run("none")
    on_ttft, on_fams = await run(backend)
    # without offload the cyclic working set thrashes the GPU pool: no hits at all
    assert value(off_fams, "vllm:prompt_tokens_cached") == 0
    host = value(on_fams, "vllm:prompt_tokens_cached_by_source", source="host")
    assert host > 0 and value(on_fams, "vllm:external_prefix_cache_hits") == host
    assert value(on_fams, "vllm:prompt_tokens_cached") >= host
    # every revisit (rounds 2..4) came back from the CPU tier, block aligned; LMCache's in
    # whole 256-token chunks (3 of a ~1,000-token prompt)
    per_revisit = 768 if backend == "lmcache" else 960
    assert host >= (ROUNDS - 1) * N_PROMPTS * per_revisit
    assert statistics.median(on_ttft) < statistics.median(off_ttft)
    if backend == "lmcache":
        assert host % 256 == 0
        assert not any(n.startswith(("vllm:mooncake", "vllm:simple_kv")) for n in on_fams)
    elif backend == "mooncake":
        assert value(on_fams, "vllm:mooncake_store_operation", operation="load_get") > 0
        assert value(on_fams, "vllm:mooncake_store_operation", operation="save_put") > 0
    else:
        assert not any(n.startswith("vllm:mooncake") for n in on_fams)
        loaded = value(on_fams, "vllm:simple_kv_offload_load_blocks", phase="completed")
        assert loaded * 16 == host  # every host-hit block was loaded once
        assert value(on_fams, "vllm:simple_kv_offload_save_outcomes", outcome="stored") > 0


def test_run_near_the_pool_size_keeps_serving(tmp_path):
    """8 lanes of sessions growing to ~5,000 tokens on a 16,384-token pool with a CPU tier:
    revisits come back from the tier, and requests whose load finished hold their blocks while
    they wait. The simulator used to stop serving for good here (a new request at the queue's
    head could not fit, the loaded ones behind it held the pool, nothing ran), and the run
    cancelled its in-flight requests at the drain timeout."""
    trace = write_trace(tmp_path / "tr", sessions=30, turns=8, think=0.0, out=20)
    out = tmp_path / "out"
    rc = main(["run", "--trace", str(trace), "--conc", "8", "--duration", "6", "--drain-timeout", "20",
               "--no-progress", "-o", str(out), "--validate", "warn", "--sim-profile", "cpu-tiny",
               "--sim-kv-pool-tokens", "16384", "--sim-kv-offload", "simple-cpu", "--sim-offload-gb", "1",
               "--sim-time-scale", "2"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["cancelled"] == 0 and s["failed"] == 0, s["errors"]
    assert s["completed"] + s["warmup_requests"] >= 60
    assert s["server_metrics"]["tokens_by_source"]["host"] > 0  # the tier was used


def test_tier_keeps_a_stored_block_in_place_and_pinned_hits_stay():
    t = OffloadTier(3, 16, eager=False)
    for h in (1, 2, 3):
        t.store(h)
    t.store(1)  # already there: skipped, not refreshed (vLLM's ALREADY_CACHED)
    t.store(4)
    assert list(t.blocks) == [2, 3, 4] and t.stored_blocks == 4
    t.pin([2])  # a lookup hit it: most recent, and not evictable until its load is done
    t.store_many([5, 6])
    assert list(t.blocks) == [2, 5, 6]
    t.pin([5])
    t.pin([6])
    t.store(7)  # every block pinned: the copy finds no CPU block and is dropped
    assert list(t.blocks) == [2, 5, 6] and t.stored_blocks == 6
    for h in (2, 5, 6):
        t.unpin([h])
    t.store(7)
    assert list(t.blocks) == [5, 6, 7]


BS = 16


def _sessions(seed: int, n: int = 40, longest: int = 20) -> list[list[int]]:
    """Six session slots growing by 1-5 blocks a turn, interleaved at random; a session that
    would pass `longest` blocks ends and a new one starts in its slot."""
    rng = np.random.default_rng(seed)
    ctx: dict[int, list[int]] = {s: [] for s in range(6)}
    out, fresh = [], 0
    for _ in range(n):
        s = int(rng.integers(0, 6))
        grow = int(rng.integers(1, 6))
        if len(ctx[s]) + grow > longest:
            ctx[s], fresh = [], fresh + 1
        base = (fresh * 10 + s) * 10_000
        ctx[s] = ctx[s] + [base + len(ctx[s]) + j for j in range(grow)]
        out.append(list(ctx[s]))
    return out


def _engine_hits(prompts: list[list[int]], gpu: int, tier: int, eager: bool) -> list[tuple[int, int]]:
    """The simulator's engine (scheduler, pool, tier) on its virtual clock, one request at a time:
    (GPU hit blocks, tier hit blocks) of each."""
    cfg = SimConfig(profile="cpu-tiny", kv_pool_tokens=gpu * BS, block_size=BS)
    b = build_engine(cfg)
    eng = SimEngine(num_blocks=gpu, block_size=BS, max_num_seqs=4, max_batched_tokens=8192, timing=b.timing,
                 stats=b.stats, offload=OffloadTier(tier, BS, eager))
    eng.use_virtual_clock()
    out = []
    for i, hashes in enumerate(prompts):
        req = SimRequest(rid=str(i), prompt_len=len(hashes) * BS, max_tokens=1, block_hashes=hashes)
        eng.submit(req)
        while req.finish is None:
            assert eng.step_offline()
        out.append((req.cached_device // BS, req.cached_host // BS))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_tier_hits_equal_the_client_model(seed, eager):
    """Per request, the engine's GPU and tier hits equal TieredCache's, with a tier that evicts
    (40 blocks against ~100 live): blocks stored again keep their place, and a request's tier
    hits survive the stores its own GPU evictions cause. The tier holds at least two of the
    longest prompts: when one request's own stores exceed the rest of the tier, the simulator
    keeps its pinned hits as vLLM does and TieredCache (which touches them first) does not."""
    prompts = _sessions(seed)
    model = TieredCache(24, 40, eager=eager)
    want = []
    for keys in prompts:
        total = model.acquire(keys, limit=len(keys) - 1)  # vLLM recomputes the last token
        model.release(keys)
        want.append((total - model.last_tier_hits, model.last_tier_hits))
    got = _engine_hits(prompts, 24, 40, eager)
    assert got == want
    assert sum(h for _, h in got) > 0
