"""Prefix-cache accounting: the simulator's hits equal an independent LRU reference.

1. In-process: the simulator's block manager is fed the real traces' hash_ids (interleaved
   sessions, pool much smaller than the working set so eviction matters); a plain LRU over
   block hashes written here, with the same capacity, must report the same hit tokens (<1%).
2. Over HTTP: prompts built with the builtin tokenizer; `cached_tokens` per request must equal
   the same reference computed from the token ids, with cache_salt isolating tenants.
"""
from __future__ import annotations

import hashlib
import json
import tarfile
from collections import OrderedDict

import aiohttp
import pytest

from agentx.prompt.tokenizer import BuiltinTokenizer
from agentx.prompt.words import WORDS
from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from agentx.sim.kvcache import PrefixCacheModel, chain_keys
from agentx.sim.rawclient import post_stream

from conftest import REAL_TRACES as TRACES


class ReferenceLRU:
    """Plain LRU of chained block digests. A request's blocks become most recent in reverse order
    (its first block most recent), which is the order in which vLLM frees a finished request."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.cap, self.bs = capacity, block_size
        self.lru: OrderedDict[bytes, None] = OrderedDict()
        self.n_unique = 0

    def request(self, block_keys: list, prompt_len: int, salt: str) -> int:
        digests, h = [], hashlib.blake2b(salt.encode(), digest_size=16).digest()
        for k in block_keys[: prompt_len // self.bs]:
            h = hashlib.blake2b(h + repr(k).encode(), digest_size=16).digest()
            digests.append(h)
        limit = (prompt_len - 1) // self.bs
        hit = 0
        while hit < min(limit, len(digests)) and digests[hit] in self.lru:
            hit += 1
        # every block of the prompt occupies the pool; the partial tail block is not hashable
        n_blocks = -(-prompt_len // self.bs)
        entries = digests + [b"unique%d" % (self.n_unique + i) for i in range(n_blocks - len(digests))]
        self.n_unique += n_blocks - len(digests)
        for d in reversed(entries):
            self.lru[d] = None
            self.lru.move_to_end(d)
        while len(self.lru) > self.cap:
            self.lru.popitem(last=False)
        return hit * self.bs


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


@pytest.mark.skipif(not TRACES.exists(), reason="real traces not available beside the checkout")
@pytest.mark.parametrize("pool_fraction", [0.55, 0.75])
def test_block_manager_hits_equal_reference_lru_on_real_traces(pool_fraction):
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
    sim = PrefixCacheModel(capacity, bs)
    ref = ReferenceLRU(capacity, bs)
    sim_hits = ref_hits = queries = 0
    for sid, r in order:
        n = r["in"]
        full = r["hash_ids"][: n // bs]
        sim_hits += sim.run(chain_keys(full, salt=sid), n)
        ref_hits += ref.request(full, n, sid)
        queries += n
    assert queries > 1_000_000 and sim.pool.evictions > 1000  # a real slice, with eviction pressure
    assert ref_hits > 0.05 * queries
    assert abs(sim_hits - ref_hits) <= 0.01 * ref_hits, (sim_hits, ref_hits)


async def test_http_cached_tokens_equal_reference():
    tok = BuiltinTokenizer(WORDS)
    bs, pool_tokens = 16, 16 * 200
    system = " ".join(WORDS[(i * 3) % len(WORDS)] for i in range(900))
    prompts = []
    for turn in range(12):
        user = " ".join(WORDS[(turn * 31 + i * 5) % len(WORDS)] for i in range(40 + 30 * (turn % 4)))
        salt = "tenant-a" if turn % 3 else "tenant-b"
        prompts.append(([{"role": "system", "content": system + f" session {turn % 2}"},
                         {"role": "user", "content": user}], salt))
    ref = ReferenceLRU(pool_tokens // bs, bs)
    cfg = SimConfig(profile="cpu-tiny", time_scale=50, kv_pool_tokens=pool_tokens, block_size=bs)
    with start_in_thread(cfg) as sim:
        async with aiohttp.ClientSession() as s:
            got, want = [], []
            for msgs, salt in prompts:
                ids = tok.encode(tok.apply_chat_template(msgs))
                keys = [tuple(ids[i:i + bs]) for i in range(0, len(ids) // bs * bs, bs)]
                want.append(ref.request(keys, len(ids), salt))
                res = await post_stream(s, sim.base_url + "/v1/chat/completions",
                                        {"messages": msgs, "max_tokens": 1, "ignore_eos": True, "stream": True,
                                         "cache_salt": salt, "stream_options": {"include_usage": True}})
                usage = res.chunks[-1]["usage"]
                assert usage["prompt_tokens"] == len(ids)
                got.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert got == want
    assert sum(got) > 0 and 0 in got[1:]  # hits happen, and salts/eviction also produce misses
