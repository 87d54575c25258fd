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
