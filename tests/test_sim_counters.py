"""When the simulator's vLLM series move, step by step on the offline engine (virtual clock), as
vLLM 0.32 moves them: prefix-cache lookups at admission (vllm/v1/core/sched/scheduler.py
`record_prefix_cache_stats`), prompt tokens when a request's prefill ends
(vllm/v1/metrics/stats.py `IterationStats.update_from_output`), vllm:iteration_tokens_total as
generated plus just-prefilled computed tokens (vllm/v1/metrics/loggers.py), and the prefill KV
computed per request when it finishes."""
from __future__ import annotations

from agentx import vllm_names as vn
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.request import SimRequest

PROMPT = 20_000  # three chunks of the 8,192-token step budget


def _value(stats, name: str, **labels) -> float:
    return stats.registry.get_sample_value(name, {**stats.labels, **labels}) or 0.0


def test_prompt_tokens_count_when_the_prefill_ends_not_at_admission():
    eng = build_engine(SimConfig(profile="h200-qwen3-8b-bf16", max_model_len=131_072)).engine
    eng.use_virtual_clock()
    st = eng.stats
    first = SimRequest(rid="a", prompt_len=PROMPT, max_tokens=4,
                       block_hashes=[hash(("a", b)) for b in range(PROMPT // 16)])
    eng.submit(first)
    iters = []
    while not first.first_token_ns:
        assert eng.step_offline()
        iters.append(_value(st, vn.ITERATION_TOKENS + "_sum"))
        if not first.first_token_ns:  # admitted and part-way through its prefill
            assert _value(st, vn.PREFIX_QUERIES + "_total") == PROMPT
            assert _value(st, vn.PROMPT_TOKENS + "_total") == 0
    assert len(iters) == 3
    assert iters[:2] == [0, 0]  # chunks are not counted while the prefill runs
    assert iters[2] == PROMPT + 1  # its computed prompt tokens + the first token, in one step
    assert _value(st, vn.PROMPT_TOKENS + "_total") == PROMPT
    assert _value(st, vn.PROMPT_BY_SOURCE + "_total", source="local_compute") == PROMPT
    assert _value(st, vn.PREFILL_KV_COMPUTED + "_count") == 0  # observed at finish
    while eng.step_offline():
        pass
    assert first.finish == "length"
    assert _value(st, vn.PREFILL_KV_COMPUTED + "_sum") == PROMPT
    assert _value(st, vn.ITERATION_TOKENS + "_sum") == PROMPT + 4  # + the 3 decode tokens

    # the same prompt again: a prefix hit of all but the last block, counted at admission as a
    # hit and at the first token as cached prompt tokens; only the rest is computed
    again = SimRequest(rid="b", prompt_len=PROMPT, max_tokens=4, block_hashes=first.block_hashes)
    eng.submit(again)
    while eng.step_offline():
        pass
    hit = _value(st, vn.PREFIX_HITS + "_total")
    assert hit == PROMPT - 16  # vLLM recomputes the last token, so the last full block misses
    assert _value(st, vn.PROMPT_CACHED + "_total") == hit
    assert _value(st, vn.PROMPT_BY_SOURCE + "_total", source="local_cache_hit") == hit
    assert _value(st, vn.PROMPT_TOKENS + "_total") == 2 * PROMPT
    assert _value(st, vn.PREFILL_KV_COMPUTED + "_sum") == PROMPT + (PROMPT - hit)


def _tier_load_behind_a_cold_prompt():
    """An engine with a CPU tier holding a PROMPT-token prompt's blocks (none on the GPU), that
    prompt submitted behind a 1,000-token cold one: the first step computes the cold one and
    admits the other as a load (~0.8 s at the profile's copy rate)."""
    cfg = SimConfig(profile="h200-qwen3-8b-bf16", max_model_len=131_072, kv_offload="simple-cpu",
                    offload_gb=8)
    eng = build_engine(cfg).engine
    eng.use_virtual_clock()
    hashes = [hash(("t", b)) for b in range(PROMPT // 16)]
    eng.offload.store_many(hashes)
    req = SimRequest(rid="t", prompt_len=PROMPT, max_tokens=4, block_hashes=hashes)
    eng.submit(SimRequest(rid="c", prompt_len=1_000, max_tokens=4,
                          block_hashes=[hash(("c", b)) for b in range(62)]))
    eng.submit(req)
    return eng, req


def test_a_request_loading_from_the_tier_waits_deferred():
    """vllm:num_requests_waiting counts a request whose KV is being loaded from the CPU tier,
    and vllm:num_requests_waiting_by_reason puts it under `deferred`, not `capacity`."""
    eng, req = _tier_load_behind_a_cold_prompt()
    assert eng.step_offline()  # the cold one computes; the other is admitted as a load (~0.8 s)
    assert eng.loading == [req]
    eng.stats.render()
    st = eng.stats
    assert _value(st, vn.WAITING) == 1
    assert _value(st, vn.WAITING_BY_REASON, reason="deferred") == 1
    assert _value(st, vn.WAITING_BY_REASON, reason="capacity") == 0
    while eng.step_offline():
        pass
    assert req.finish == "length" and req.cached_host == PROMPT - 16
    eng.stats.render()
    assert _value(st, vn.WAITING) == 0 and _value(st, vn.WAITING_BY_REASON, reason="deferred") == 0


def test_kv_fetch_stages_follow_a_load():
    """vllm:num_requests_kv_fetch_by_stage (vLLM 0.32, with a loading connector): in_progress
    while the tier copies the request's blocks, nothing once it has run; without a tier the
    family is not exposed."""
    eng, req = _tier_load_behind_a_cold_prompt()
    st = eng.stats
    seen = []
    while eng.step_offline():
        st.render()
        seen.append(tuple(int(_value(st, vn.KV_FETCH_BY_STAGE, stage=s)) for s in vn.KV_FETCH_STAGES))
    assert (0, 1, 0) in seen  # loading
    assert seen[-1] == (0, 0, 0) and req.finish == "length"
    plain = build_engine(SimConfig(profile="h200-qwen3-8b-bf16")).engine.stats
    assert vn.KV_FETCH_BY_STAGE not in plain.render().decode()
