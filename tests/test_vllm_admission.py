"""The simulator's admission against vLLM's own KVCacheManager (the vLLM CPU venv): a waiting
request that does not fit leaves its prefix hits where they are in the GPU free queue.

vLLM checks the fit before it takes the hits (`allocate_slots` counts a hit block still in the
free queue as one to allocate; `allocate_new_computed_blocks` touches the hits only once the
request fits). Which blocks sit where in the free queue decides what the allocator evicts and what
SimpleCPUOffload's lazy walk reaches first, so the simulator (sim/sched.py `_lookup`) must leave
the queue as vLLM does. The vLLM side runs vLLM's KVCacheManager alone (no engine, no model)."""
from __future__ import annotations

import json
import subprocess

import pytest

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.request import SimRequest

pytestmark = pytest.mark.vllm

BS, POOL = 16, 64  # block size, usable blocks

VLLM_SCRIPT = r'''
import json
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

BS, POOL = %d, %d
init_none_hash(sha256)
hasher = get_request_block_hasher(BS, sha256)
spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
config = KVCacheConfig(num_blocks=POOL + 1, kv_cache_tensors=[],  # + vLLM's null block
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
mgr = KVCacheManager(config, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS)
labels = {}


def request(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, block_hasher=hasher)


def admit(r):
    hits, n = mgr.get_computed_blocks(r)[:2]
    return n, mgr.allocate_slots(r, r.num_tokens - n, n, hits, full_sequence_must_fit=True)


def finish(name, r):
    """Run a whole prompt and free it, as a finished request; name its cached blocks."""
    admit(r)
    r.num_computed_tokens = r.num_tokens
    labels.update({h: f"{name}{i}" for i, h in enumerate(r.block_hashes)})
    mgr.free(r)


def queue():
    """The free queue, eviction end first: each cached block's name, '-' for the others."""
    return [labels.get(get_block_hash(b.block_hash) if b.block_hash else None, "-")
            for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


finish("a", request("a", list(range(1000, 1000 + 8 * BS + 1))))
finish("c", request("c", list(range(5000, 5000 + 4 * BS + 1))))
before = queue()
# a's prompt and then more than the pool holds: a hit of 8 blocks, and it cannot be admitted
big = request("big", list(range(1000, 1000 + 8 * BS)) + list(range(9000, 9000 + POOL * BS - 8 * BS + 40)))
hit, blocks = admit(big)
print(json.dumps({"hit": hit, "admitted": blocks is not None, "before": before, "after": queue()}))
''' % (BS, POOL)


def _sim_queues() -> tuple[list[str], list[str], bool]:
    """The same three requests in the simulator: free queue before and after the failed lookup."""
    sched = build_engine(SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=POOL * BS)).engine
    pool = sched.pool
    labels: dict[int, str] = {}

    def finish(name: str, prompt: int) -> None:
        hashes = [hash((name, b)) for b in range(prompt // BS)]
        blocks = pool.allocate(-(-prompt // BS))
        for b, h in zip(blocks, hashes):
            pool.commit(b, h)
        labels.update({h: f"{name}{i}" for i, h in enumerate(hashes)})
        pool.release(blocks)

    def queue() -> list[str]:
        return [labels.get(pool.bhash[b], "-") for b in pool.free_blocks()]

    finish("a", 8 * BS + 1)
    finish("c", 4 * BS + 1)
    before = queue()
    big = SimRequest(rid="big", prompt_len=POOL * BS + 40, max_tokens=4,
                     block_hashes=[hash(("a", b)) for b in range(8)]
                     + [hash(("big", b)) for b in range(POOL - 8 + 2)])
    admitted = sched._lookup(big, 0.0, 8192)
    return before, queue(), admitted


def test_a_request_that_does_not_fit_leaves_the_free_queue_as_vllm_does(vllm_python):
    p = subprocess.run([str(vllm_python), "-c", VLLM_SCRIPT], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    real = json.loads(p.stdout.strip().splitlines()[-1])
    assert real["hit"] == 8 * BS and not real["admitted"]
    # vLLM: nothing moved; a's prefix (freed tail first) ahead of c's, which was freed after it
    assert real["after"] == real["before"]
    cached = [x for x in real["after"] if x != "-"]
    assert cached == [f"a{i}" for i in range(7, -1, -1)] + [f"c{i}" for i in range(3, -1, -1)]

    before, after, admitted = _sim_queues()
    assert not admitted and after == before
    assert [x for x in after if x != "-"] == cached  # the cached blocks in vLLM's order
