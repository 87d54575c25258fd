"""KV offload tier: a working set larger than the GPU pool but smaller than the CPU tier comes back
from host memory (host-source hits > 0) and so gets a lower TTFT p50 than with offload off."""
from __future__ import annotations

import statistics

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentx.prompt.words import WORDS
from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from helpers import post_stream

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


@pytest.mark.parametrize("backend", ["simple-cpu", "mooncake"])
async def test_offload_hits_host_and_lowers_ttft(backend):
    off_ttft, off_fams = await run("none")
    on_ttft, on_fams = await run(backend)
    # without offload the cyclic working set thrashes the GPU pool: no hits at all
    assert value(off_fams, "vllm:prompt_tokens_cached") == 0
    host = value(on_fams, "vllm:prompt_tokens_cached_by_source", source="host")
    assert host > 0 and value(on_fams, "vllm:external_prefix_cache_hits") == host
    assert value(on_fams, "vllm:prompt_tokens_cached") >= host
    # every revisit (rounds 2..4) came back from the CPU tier, block aligned
    assert host >= (ROUNDS - 1) * N_PROMPTS * 960
    assert statistics.median(on_ttft) < statistics.median(off_ttft)
    if backend == "mooncake":
        assert value(on_fams, "vllm:mooncake_store_operation", operation="load_get") > 0
        assert value(on_fams, "vllm:mooncake_store_operation", operation="save_put") > 0
    else:
        assert not any(n.startswith("vllm:mooncake") for n in on_fams)
        loaded = value(on_fams, "vllm:simple_kv_offload_load_blocks", phase="completed")
        assert loaded * 16 == host  # every host-hit block was loaded once
        assert value(on_fams, "vllm:simple_kv_offload_save_outcomes", outcome="stored") > 0
