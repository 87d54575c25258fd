"""Timing model: the shipped profiles reproduce the published anchor figures (docs/simulator.md
§Timing), the served simulator keeps that timing in real time, and the scheduler preempts when
the KV pool runs out."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from agentx.sim.profile import resolve
from agentx.sim.timing import StepTiming
from agentx.tokens.tokenizer import BuiltinTokenizer
from agentx.tokens.words import WORDS
from helpers import post_stream
from sim_calibration.offline import ANCHORS, Scenario, decode_tpot_ms, simulate

# Per anchor, the deviation we accept (documented with the reason in docs/simulator.md)
TOLERANCE = {
    # TTFT: mfu is measured on vLLM's engine steps (2026-12-04), no longer fitted to this figure;
    # the published TTFT also holds the API server's time, which the offline model leaves out
    ("1 stream, 2000/256", "ttft_mean_ms"): 0.15,
    ("1 stream, 2000/256", "tpot_mean_ms"): 0.03,
    ("8 streams, steady decode step", "tpot_ms"): 0.03,
    ("EAGLE3 K=3 AL 2.5, 1 stream", "tpot_mean_ms"): 0.03,
    ("EAGLE3 K=3 AL 2.5, 8 streams, steady decode step", "tpot_ms"): 0.03,
    ("8 streams, 2000/256", "ttft_p50_ms"): 0.30,  # synchronised start: chunked-prefill order; as above
    ("8 streams, 2000/256", "tpot_mean_ms"): 0.15,
    ("8 streams, 2000/256", "output_tok_s"): 0.10,
    ("EAGLE3 K=3 AL 2.5, 8 streams", "tpot_mean_ms"): 0.40,
    ("EAGLE3 K=3 AL 2.5, 8 streams", "output_tok_s"): 0.15,
    ("SimpleCPUOffload 8 GB, revisits, 8 streams", "ttft_p50_ms"): 0.10,
    ("TP8, conc 4, 1024/1024", "tpot_mean_ms"): 0.03,
    ("TP8, conc 4, 1024/1024", "tok_s_per_gpu"): 0.10,
    ("conc 32, 8192/2048 (published: 8x B200 FP8)", "itl_mean_ms"): 0.25,  # other GPU and precision
}


def test_anchor_profile_kv_pool_matches_measurement():
    r = resolve(SimConfig(profile="h200-qwen3-8b-bf16"))
    assert r.kv_pool_tokens == 759_696  # docs/references.md §5: H200 KV pool at 0.85
    assert r.num_gpu_blocks * r.block_size == r.kv_pool_tokens


@pytest.mark.parametrize("anchor", ANCHORS, ids=lambda a: f"{a['profile']}:{a['label']}:{a['metric']}")
def test_simulated_figures_close_to_published(anchor):
    if "decode" in anchor:
        sim = decode_tpot_ms(anchor["profile"], *anchor["decode"])
    else:
        sim = simulate(SimConfig(profile=anchor["profile"], **anchor.get("cfg", {})), anchor["sc"])[anchor["metric"]]
    tol = TOLERANCE[(anchor["label"], anchor["metric"])]
    assert abs(sim - anchor["published"]) <= tol * anchor["published"], sim


def test_sparse_attention_keeps_decode_flat_with_context():
    dense = [decode_tpot_ms("h200-qwen3-8b-bf16", 1, ctx) for ctx in (2_000, 100_000)]
    sparse = [decode_tpot_ms("h200-minimaxm3-fp8", 1, ctx) for ctx in (2_000, 100_000)]
    assert dense[1] > 1.5 * dense[0]  # dense attention reads all KV
    assert sparse[1] < 1.02 * sparse[0]  # MSA reads a fixed 2,048-token budget


@pytest.mark.alone  # timing: the served TTFT held to the model within 10 ms (failed once beside 2 busy workers)
async def test_served_timing_is_real_time(tmp_path):
    """h200-qwen3-8b at time_scale 1: the wire shows the modelled TTFT and TPOT."""
    tok = BuiltinTokenizer(WORDS)
    words = " ".join(WORDS[(i * 11) % len(WORDS)] for i in range(1990))
    msgs = [{"role": "user", "content": words}]
    n_prompt = tok.count(tok.apply_chat_template(msgs))
    model = simulate(SimConfig(profile="h200-qwen3-8b-bf16"), Scenario(1, n_prompt, 96, 1))
    # served requests first spend the profile's front-end time (the offline model has none)
    front = StepTiming(resolve(SimConfig(profile="h200-qwen3-8b-bf16"))).frontend_seconds(n_prompt) * 1e3
    assert front > 10  # the H200 profile's fitted front end
    model["ttft_mean_ms"] += front
    log = tmp_path / "truth.jsonl"
    body = {"max_tokens": 96, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "chat_template_kwargs": {"enable_thinking": False}}
    with start_in_thread(SimConfig(profile="h200-qwen3-8b-bf16", truth_log=str(log))) as sim:
        async with aiohttp.ClientSession() as s:
            url = sim.base_url + "/v1/chat/completions"
            await post_stream(s, url, {**body, "max_tokens": 2, "messages": [{"role": "user", "content": "warm"}]})
            res = await post_stream(s, url, {**body, "messages": msgs}, {"X-Request-ID": "timed"})
    toks = res.token_chunks()
    assert sum(n for _, n in toks) == 96
    rec = next(r for r in map(orjson.loads, log.read_bytes().splitlines()) if r["request_id"] == "timed")
    # from the first bytes read: the front end's time counts from there
    server_ttft = (rec["first_chunk_ns"] - (rec["received_ns"] or rec["arrival_ns"])) / 1e6
    client_ttft = (toks[0][0] - res.sent_ns) / 1e6
    # the server side adds body parsing, tokenisation and a loop wake-up to the modelled prefill
    assert model["ttft_mean_ms"] <= server_ttft <= model["ttft_mean_ms"] + 10, server_ttft
    assert client_ttft >= server_ttft
    tpot = (toks[-1][0] - toks[0][0]) / 1e6 / 95
    assert abs(tpot - model["tpot_mean_ms"]) <= 0.1 * model["tpot_mean_ms"], (tpot, model["tpot_mean_ms"])


async def test_preemption_when_kv_pool_runs_out(tmp_path):
    # 8 requests of ~600 + 400 tokens need ~8000 KV tokens; the pool holds 4,096
    log = tmp_path / "truth.jsonl"
    # time_scale 10, not faster: all 8 requests must overlap even when a loaded machine spreads
    # their arrivals over tens of ms (at 200x a request finished in a few ms and none was preempted)
    cfg = SimConfig(profile="cpu-tiny", time_scale=10, kv_pool_tokens=4096, block_size=16, truth_log=str(log))
    body = {"max_tokens": 400, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with start_in_thread(cfg) as sim:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post_stream(
                s, sim.base_url + "/v1/chat/completions",
                {**body, "messages": [{"role": "user", "content": f"task {i} " + "word " * 590}]})
                for i in range(8)))
            async with s.get(sim.base_url + "/metrics") as r:
                text = await r.text()
    preempted = [float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("vllm:num_preemptions_total")]
    assert preempted and preempted[0] > 0
    for res in results:  # preempted requests are recomputed and still produce exactly max_tokens
        assert res.done and res.chunks[-1]["usage"]["completion_tokens"] == 400
    recs = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert sum(r["preemptions"] for r in recs) == preempted[0]


def _step_times(admit: bool) -> tuple[list[int], list[int], list[tuple[float, int]]]:
    """Per-step durations (ns) of one script on the H200 profile: `a` decodes alone; `c` (10,000
    prompt tokens: two chunks) arrives while it does; `d` arrives during c's second chunk; after
    a and c finish and the engine idles, `e` arrives. With `admit` False the host preparation
    constants are zeroed. Returns the durations, the steps that admitted a request and the
    `after_decode_s` and admitted tokens each of those saw."""
    from agentx.sim.build import build_engine
    from agentx.sim.request import SimRequest
    from sim_calibration.replay import timing_with

    built = build_engine(SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=196_608))
    eng = built.engine
    if not admit:
        eng.timing = timing_with(built, {"admit_host_ms": 0.0, "admit_host_us_per_token": 0.0})
    eng.use_virtual_clock()
    seen: list[tuple[int, float, int]] = []
    price = eng.timing.step_seconds

    def spy(b):
        if b.admitted_tokens:
            seen.append((len(dts), b.after_decode_s, b.admitted_tokens))
        return price(b)

    eng.timing.step_seconds = spy
    req = lambda rid, n, out: SimRequest(rid=rid, prompt_len=n, max_tokens=out,  # noqa: E731
                                         block_hashes=[hash((rid, j)) for j in range(n // 16)])
    script = {5: req("c", 10_000, 20), 7: req("d", 1_000, 2), 60: req("e", 500, 2)}
    eng.submit(req("a", 2_000, 30))
    dts: list[int] = []
    while len(dts) < 200:
        if len(dts) in script:
            eng.submit(script.pop(len(dts)))
        t0 = eng.virtual_ns
        if not eng.step_offline():
            if not script:
                break
            dts.append(0)  # idle: nothing to run until the next arrival
            continue
        dts.append(eng.virtual_ns - t0)
    return dts, [i for i, _, _ in seen], [(s, n) for _, s, n in seen]


def test_admitting_right_after_a_decode_step_adds_the_host_preparation_it_cannot_hide():
    """vLLM 0.24 prepares batch k+1 on the host while batch k runs (asynchronous scheduling): a
    request admitted after a ~11 ms decode-only step costs its preparation beyond that step
    (measured: ~17 ms + 1.9 ms per 1k admitted tokens, sim_calibration.fit `fit_admit_host`); one
    admitted after a long prefill step, or into an idle engine, costs nothing more."""
    with_cost, admitting, after = _step_times(admit=True)
    without, admitting0, _ = _step_times(admit=False)
    assert admitting == admitting0 and len(admitting) == 4  # a, c, d, e
    cal = resolve(SimConfig(profile="h200-qwen3-8b-bf16")).profile.calibration
    # c: admitted right after a decode step of a, which the step before it took
    i, (prev, n) = admitting[1], after[1]
    assert prev == pytest.approx(without[i - 1] / 1e9, rel=1e-6) and prev > 0
    assert n == 8191  # the step's budget beside a's decode token
    extra = (cal.admit_host_ms + cal.admit_host_us_per_token * n / 1e3) / 1e3 - prev
    assert extra > 0.01
    assert with_cost[i] - without[i] == pytest.approx(extra * 1e9, abs=2)
    # d: admitted beside c's second chunk, after c's first (a prefill step): nothing more
    assert after[2][0] == 0.0 and with_cost[admitting[2]] == without[admitting[2]]
    # e: into an idle engine (the schedule before it was empty): nothing more
    assert after[3][0] == 0.0 and with_cost[admitting[3]] == without[admitting[3]]
    # every other step is priced the same; a, first into an empty engine, too
    assert [x for j, x in enumerate(with_cost) if j != i] == [x for j, x in enumerate(without) if j != i]
