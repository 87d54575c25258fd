"""Prefix-cache accounting: the simulator's hits equal the client's model of vLLM's cache.

The reference is agentx.prefix_cache (content keys, vLLM's eviction order), which
tests/test_vllm_cache.py checks against a real vLLM; the simulator keeps block ids, ref counts
and a hash map, as vLLM's BlockPool does.
1. In-process: the simulator's block manager is fed the real traces' hash_ids (interleaved
   sessions, pool much smaller than the working set so eviction matters); the model with the
   same capacity must report the same hit tokens. (They could differ where a recomputed last
   block's content is also cached: the pool keeps the old copy in place, the model refreshes
   it; it does not happen in this slice.)
2. Over HTTP: prompts built with the builtin tokenizer; `cached_tokens` per request must equal
   the model's prediction from the token ids, with cache_salt isolating tenants.
"""
from __future__ import annotations

import json
import tarfile

import aiohttp
import pytest

from agentx.prefix_cache import PrefixCache
from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from agentx.sim.kvcache import BlockPool
from agentx.tokens.tokenizer import BuiltinTokenizer
from agentx.tokens.words import WORDS
from conftest import REAL_TRACES as TRACES
from helpers import post_stream


def chain_keys(keys: list, salt: str) -> list[int]:
    """Chained block hashes from per-block content keys, as the simulator's block_hashes."""
    out, h = [], hash(("agentx-root", salt))
    for k in keys:
        h = hash((h, k))
        out.append(h)
    return out


def pool_request(pool: BlockPool, hashes: list[int], prompt_len: int) -> int:
    """One request through the simulator's pool, alone: hits, new blocks, commit, free."""
    bs = pool.block_size
    hit = pool.match(hashes, (prompt_len - 1) // bs)
    blocks = pool.touch(hashes[:hit]) + pool.allocate(-(-prompt_len // bs) - hit)
    for i in range(hit, min(len(hashes), prompt_len // bs)):
        pool.commit(blocks[i], hashes[i])
    pool.release(blocks)
    return hit * bs


def model_request(model: PrefixCache, keys: list, prompt_len: int, bs: int) -> int:
    """The same request through the client's model: full blocks are keys, the partial last
    block holds a slot only while the request runs."""
    partial = -(-prompt_len // bs) - len(keys)
    hits = model.acquire(keys, limit=(prompt_len - 1) // bs, uncached=partial)
    model.release(keys, uncached=partial)
    return hits * bs


def load_sessions(n: int, max_turns: int) -> list[tuple[str, list[dict]]]:
    out = []
    with tarfile.open(TRACES) as tar:
        for m in tar:
            if not m.isfile() or not m.name.endswith(".json"):
                continue
            d = json.load(tar.extractfile(m))
            reqs = [r for r in d["requests"] if r.get("type", "n") != "subagent" and r.get("hash_ids")]
            if len(reqs) >= 10:
                out.append((d["id"], reqs[:max_turns]))
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("pool_fraction", [0.55, 0.75])
def test_block_manager_hits_equal_the_model_on_real_traces(pool_fraction):
    sessions = load_sessions(n=12, max_turns=40)
    bs = 64
    # interleave sessions round-robin, like concurrent lanes of a replay
    order = []
    for i in range(max(len(r) for _, r in sessions)):
        for sid, reqs in sessions:
            if i < len(reqs):
                order.append((sid, reqs[i]))
    # pool: a fraction of the sessions' largest contexts together, so LRU eviction decides hits
    live = sum(max(-(-r["in"] // bs) for r in reqs) for _, reqs in sessions)
    capacity = int(live * pool_fraction)
    pool, model = BlockPool(capacity, bs), PrefixCache(capacity)
    sim_hits = ref_hits = queries = 0
    for sid, r in order:
        n = r["in"]
        hashes = chain_keys(r["hash_ids"][: n // bs], salt=sid)
        sim_hits += pool_request(pool, hashes, n)
        ref_hits += model_request(model, hashes, n, bs)
        queries += n
    assert queries > 1_000_000 and pool.evictions > 1000  # a real slice, with eviction pressure
    assert ref_hits > 0.05 * queries
    assert sim_hits == ref_hits


async def test_http_cached_tokens_equal_the_model():
    tok = BuiltinTokenizer(WORDS)
    bs, pool_tokens = 16, 16 * 200
    system = " ".join(WORDS[(i * 3) % len(WORDS)] for i in range(900))
    prompts = []
    for turn in range(12):
        user = " ".join(WORDS[(turn * 31 + i * 5) % len(WORDS)] for i in range(40 + 30 * (turn % 4)))
        salt = "tenant-a" if turn % 3 else "tenant-b"
        prompts.append(([{"role": "system", "content": system + f" session {turn % 2}"},
                         {"role": "user", "content": user}], salt))
    model = PrefixCache(pool_tokens // bs)  # the simulator keeps no null block
    cfg = SimConfig(profile="cpu-tiny", time_scale=50, kv_pool_tokens=pool_tokens, block_size=bs)
    with start_in_thread(cfg) as sim:
        async with aiohttp.ClientSession() as s:
            got, want = [], []
            for msgs, salt in prompts:
                ids = tok.encode(tok.apply_chat_template(msgs))
                keys = [(salt, tuple(ids[:end])) for end in range(bs, len(ids) + 1, bs)]
                want.append(model_request(model, keys, len(ids), bs))
                res = await post_stream(s, sim.base_url + "/v1/chat/completions",
                                        {"messages": msgs, "max_tokens": 1, "ignore_eos": True, "stream": True,
                                         "cache_salt": salt, "stream_options": {"include_usage": True}})
                usage = res.chunks[-1]["usage"]
                assert usage["prompt_tokens"] == len(ids)
                got.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert got == want
    assert sum(got) > 0 and 0 in got[1:]  # hits happen, and salts/eviction also produce misses
