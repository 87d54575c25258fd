"""The prefix-cache model (agentx.prefix_cache) predicts a real vLLM's hits token for token.

A CPU vLLM serves a pool too small for the working set (`--num-gpu-blocks-override`, 32-token
blocks, prefix caching on); interleaved conversations that grow turn by turn and share a
system prefix are sent one at a time as token ids. The model, fed the same prompts, must
give each response's `cached_tokens` and the server's Δ`vllm:prefix_cache_hits_total`
exactly: vLLM's scheduling of one request at a time is deterministic.

Run: `.venv/bin/python -m pytest tests/test_vllm_cache.py -q -m vllm`.
"""
from __future__ import annotations

import json
import random
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentx.prefix_cache import PrefixCache

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_group("cache")]  # its own server settings

BLOCK = 32
POOL_BLOCKS = 24  # vLLM keeps one as its null block: 23 usable, 736 tokens
MAX_MODEL_LEN = 512


def _post_json(base_url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _counter(base_url: str, name: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=60) as resp:
        text = resp.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == name)


def _prompts() -> list[list[int]]:
    """Three conversations sharing a 3-block system prefix, each turn extending the last by
    40-70 tokens, sent round-robin; every length is off the block grid so the last prompt
    token never falls on a block boundary."""
    rng = random.Random(7)
    system = [rng.randrange(300, 8000) for _ in range(3 * BLOCK)]
    convs = [list(system) + [rng.randrange(300, 8000) for _ in range(30)] for _ in range(3)]
    out = []
    for _turn in range(6):
        for c in convs:
            c += [rng.randrange(300, 8000) for _ in range(rng.randrange(40, 71))]
            if len(c) % BLOCK == 0:
                c.append(rng.randrange(300, 8000))
            out.append(list(c))
    return out


def _predict(cache: PrefixCache, ids: list[int]) -> int:
    """Hit tokens the model expects for one request run alone (max_tokens=1: no decode
    blocks). A full block's key is the whole prefix up to it, as vLLM's chained hash."""
    keys = [tuple(ids[:end]) for end in range(BLOCK, len(ids) + 1, BLOCK)]
    partial = -(-len(ids) // BLOCK) - len(keys)
    hits = cache.acquire(keys, limit=(len(ids) - 1) // BLOCK, uncached=partial)
    cache.release(keys, uncached=partial)
    return hits * BLOCK


def test_model_predicts_vllm_prefix_cache_hits(vllm_servers):
    server = vllm_servers.get(
        "plain", max_model_len=MAX_MODEL_LEN,
        extra_args=("--num-gpu-blocks-override", str(POOL_BLOCKS), "--block-size", str(BLOCK),
                    "--enable-prefix-caching"))
    prompts = _prompts()
    assert max(map(len, prompts)) < MAX_MODEL_LEN
    url = server.base_url
    hits0 = _counter(url, "vllm:prefix_cache_hits_total")
    queries0 = _counter(url, "vllm:prefix_cache_queries_total")
    model = PrefixCache(POOL_BLOCKS - 1)
    got, want = [], []
    for ids in prompts:
        want.append(_predict(model, ids))
        res = _post_json(url, "/v1/completions", {"model": server.model, "prompt": ids,
                                                  "max_tokens": 1, "temperature": 0.0})
        assert res["usage"]["prompt_tokens"] == len(ids)
        got.append(res["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert got == want
    # the working set did not fit: the model evicted, and hits were partial, not all-or-none
    assert model.evictions > 20
    assert any(0 < w < len(p) - BLOCK for w, p in zip(want, prompts))
    # the server's counters, once its last step's stats are published
    total_q = sum(map(len, prompts))
    deadline = time.monotonic() + 10
    while (_counter(url, "vllm:prefix_cache_queries_total") - queries0 < total_q
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert _counter(url, "vllm:prefix_cache_queries_total") - queries0 == total_q
    assert _counter(url, "vllm:prefix_cache_hits_total") - hits0 == sum(want)
