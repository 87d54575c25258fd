"""Speculative decoding: AL = 1 + Δaccepted/Δdrafts from /metrics matches --synthetic-al, and the
tokens per chunk a raw client sees agree with it."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from agentx.sim.specdec import rates_from_length
from helpers import post_stream


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("vllm:spec_decode"):
            for s in fam.samples:
                if s.name.endswith("_total"):
                    key = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
                    out[key] = out.get(key, 0.0) + s.value
    return out


def test_vllm_schedule_examples():
    # vLLM's minimum-variance schedule (its unit test values) and the H200 measurement at
    # L=2.5 (docs/references.md §5)
    assert rates_from_length(2.6, 3) == pytest.approx([1.0, 0.6, 0.0])
    assert rates_from_length(3.5, 4) == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert rates_from_length(2.5, 3) == pytest.approx([1.0, 0.5, 0.0])


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("al", [1.5, 2.78, 3.6])
async def test_acceptance_length_from_metrics_and_chunks(k, al):
    cfg = SimConfig(profile="cpu-tiny", time_scale=1000, spec_k=k, synthetic_al=al, seed=k)
    n_req, max_tokens = 24, 400
    with start_in_thread(cfg) as sim:
        async with aiohttp.ClientSession() as s:
            before = await scrape(s, sim.base_url)
            body = {"messages": [{"role": "user", "content": "write the parser " * 40}], "max_tokens": max_tokens,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            results = await asyncio.gather(*(post_stream(s, sim.base_url + "/v1/chat/completions", body)
                                             for _ in range(n_req)))
            after = await scrape(s, sim.base_url)
    d = {k_: after[k_] - before.get(k_, 0.0) for k_ in after}
    drafts = d["vllm:spec_decode_num_drafts_total"]
    accepted = d["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafts >= 2000
    assert d["vllm:spec_decode_num_draft_tokens_total"] == k * drafts
    assert sum(d[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(k)) == accepted
    al_metrics = 1 + accepted / drafts
    assert abs(al_metrics - al) <= 0.03, al_metrics
    # client side: every decode chunk carries 1 + accepted tokens; drop each request's first chunk
    # (prefill, 1 token) and last chunk (cut by max_tokens)
    sizes = []
    for res in results:
        assert res.done and res.chunks[-1]["usage"]["completion_tokens"] == max_tokens
        toks = [n for _, n in res.token_chunks()]
        assert toks[0] == 1 and sum(toks) == max_tokens
        sizes += toks[1:-1]
    lo, hi = int(al), min(k + 1, int(al) + 1)
    assert set(sizes) <= set(range(lo, hi + 1))  # minimum-variance schedule: only floor/ceil of L
    al_client = sum(sizes) / len(sizes)
    assert abs(al_client - al) <= 0.03, al_client
    assert abs(al_client - al_metrics) <= 0.03
