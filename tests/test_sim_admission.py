"""Admission as vLLM v1 does it (sim/sched.py), on the offline engine (virtual clock): a long
cold prompt under chunked prefill, `long_prefill_token_threshold` / `max_num_partial_prefills`,
and `scheduler_reserve_full_isl` with a pool far smaller than the working set."""
from __future__ import annotations

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.request import SimRequest


def _run(cfg: SimConfig, prompts: list[tuple[int, int, int]]) -> list[SimRequest]:
    """Submit (at_ms, prompt tokens, output tokens) requests on the virtual clock; run to the end."""
    eng = build_engine(cfg).engine
    eng.use_virtual_clock()
    reqs = [SimRequest(rid=str(i), prompt_len=p, max_tokens=o, arrival_ns=int(at * 1e6),
                       block_hashes=[hash((i, b)) for b in range(p // 16)])
            for i, (at, p, o) in enumerate(prompts)]
    todo = sorted(reqs, key=lambda r: r.arrival_ns)
    while True:
        while todo and todo[0].arrival_ns <= eng.virtual_ns:
            eng.submit(todo.pop(0))
        if eng.step_offline():
            continue
        if not todo:
            return reqs
        eng.virtual_ns = todo[0].arrival_ns


def test_long_prefill_takes_the_step_budget_unless_capped():
    """vLLM v1 schedules running requests first: a 64k-token cold prefill takes all 8,192 tokens
    of every step, so a short request arriving 1 ms later waits for the whole prefill (vLLM's
    default); with long_prefill_token_threshold 2048 (or max_num_partial_prefills 2, which sets
    it to 4% of max_model_len) the short one shares the steps and gets its first token first."""
    work = [(0.0, 65_536, 4), (1.0, 1_000, 4)]
    base = SimConfig(profile="h200-qwen3-8b-bf16", max_model_len=131_072)
    long, short = _run(base, work)
    assert short.first_token_ns > long.first_token_ns - 200_000_000  # waited behind the prefill
    for cfg in (base.model_copy(update={"long_prefill_token_threshold": 2048}),
                base.model_copy(update={"max_num_partial_prefills": 2})):
        long, short = _run(cfg, work)
        assert short.first_token_ns < long.first_token_ns / 4


def test_pool_smaller_than_working_set_preempts_only_without_full_isl_reservation():
    """8 prompts of 6,000 tokens on an 8,192-token pool: with vLLM 0.32's full-sequence admission
    (default) nobody is preempted and every request finishes; admitting on the first chunk only
    (older vLLM) over-admits, preempts (recompute) and still finishes them all."""
    work = [(0.0, 6_000, 64)] * 8
    small = SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=8_192, max_num_batched_tokens=2_048)
    full = _run(small, work)
    chunk = _run(small.model_copy(update={"reserve_full_isl": False}), work)
    assert all(r.finish == "length" for r in full + chunk)
    assert sum(r.preemptions for r in full) == 0
    assert sum(r.preemptions for r in chunk) > 0


def test_hit_of_a_resumption_kept_apart_for_vllm_024s_report():
    """A request preempted mid-prefill finds its own computed blocks again when it is re-admitted.
    vLLM 0.32 (the served simulator's reference) reports the hit of its first admission; vLLM 0.24
    overwrites it at each admission until the first token (docs/server-metrics.md;
    tests/data/h200-runs-7: 13 offbp3 requests report 8,176-24,576 cached tokens having started
    cold), which the replays of those 0.24 runs compare with (`hit_last_admission`). Every prompt
    here is distinct, so a non-zero hit can only be such a self-hit."""
    small = SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=8_192, max_num_batched_tokens=2_048,
                      reserve_full_isl=False)
    reqs = _run(small, [(0.0, 6_000, 64)] * 8)
    assert all(r.cached_device == r.cached_host == 0 for r in reqs)  # 0.32: the first admission's
    assert all(r.hit_last_admission == 0 for r in reqs if not r.preemptions)
    self_hits = [r for r in reqs if r.preemptions and r.hit_last_admission]
    assert self_hits and all(r.hit_last_admission < r.prompt_len for r in self_hits)


def test_a_request_that_does_not_fit_leaves_its_gpu_hits_in_the_free_queue():
    """vLLM checks that a waiting request fits before it takes its prefix hits
    (`KVCacheManager.allocate_slots`: a hit block still in the free queue counts as one to
    allocate; `allocate_new_computed_blocks` touches the hits only once the request fits). So
    while the head of the queue waits for room, its cached prefix keeps its place in the free
    queue, where the allocator can evict it; it is not moved to the queue's tail at every retry.
    Once the request fits, its hits are referenced (out of the free queue) before new blocks are
    allocated, so the allocation cannot evict them."""
    cfg = SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=64 * 16)
    sched = build_engine(cfg).engine
    pool = sched.pool
    prefix = [hash(("a", b)) for b in range(8)]
    blocks = pool.allocate(8)
    for b, h in zip(blocks, prefix):
        pool.commit(b, h)
    pool.release(blocks)  # an earlier turn's prompt, cached and free
    later = pool.allocate(4)  # then another request's, freed after it: behind it in the queue
    for b in later:
        pool.commit(b, hash(("c", b)))
    pool.release(later)
    order = pool.free_blocks()
    assert pool.num_free == 64 and order[-12:] == blocks[::-1] + later[::-1]

    # 40 tokens more than the pool once its own hits are counted: it cannot be admitted
    big = SimRequest(rid="big", prompt_len=64 * 16 + 40, max_tokens=4,
                     block_hashes=prefix + [hash(("b", b)) for b in range(58)])
    assert not sched._lookup(big, 0.0, 8192)
    assert big.blocks == [] and pool.free_blocks() == order  # nothing moved, nothing held

    # a request that fits: its hits are held first, then 2 new blocks come from the head
    small = SimRequest(rid="small", prompt_len=8 * 16 + 20, max_tokens=4,
                       block_hashes=prefix)
    assert sched._lookup(small, 0.0, 8192)
    assert small.blocks == blocks and small.num_computed == 8 * 16
    assert pool.num_free == 64 - 8 and all(pool.ref[b] == 1 for b in blocks)
    assert sched._grow(small, small.target_len) and pool.num_free == 64 - 10
    assert all(pool.cached[h] == b for h, b in zip(prefix, blocks))  # the hits were not evicted
