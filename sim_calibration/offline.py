"""Offline runs of the engine model on a virtual clock: the timing anchors and the docs table.

The engine the served simulator runs, built by the same `build.build_engine` (scheduler, KV
cache, offload tier, roofline), but its steps advance a virtual clock instead of sleeping, so a
benchmark scenario (closed loop at fixed concurrency, like `vllm bench serve
--max-concurrency`) takes milliseconds and is deterministic.

    python -m sim_calibration.offline            # prints the table of docs/simulator.md §Timing
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import sys
from dataclasses import dataclass

from agentx.distribution import dist
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.profile import resolve
from agentx.sim.request import SimRequest
from agentx.sim.timing import StepTiming


@dataclass
class Scenario:
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int
    spec_k: int = 0
    al: float | None = None
    distinct: int = 0  # >0: request i sends prompt i % distinct (revisits), else every prompt is new
    measure_from: int = 0  # only requests issued from this index on are measured


def simulate(cfg: SimConfig, sc: Scenario, seed: int = 0) -> dict:
    """Closed loop: `concurrency` requests start at t=0, each finished one is replaced at once.

    The scenario sets speculative decoding (K, mean acceptance length) and `seed` replaces
    cfg.seed; time is modelled time (time_scale 1) and always the roofline (no fixed delays).
    Everything else, the offload tier and its store policy included, comes from cfg."""
    cfg = cfg.model_copy(update={"spec_k": sc.spec_k, "synthetic_al": sc.al, "synthetic_rates": None,
                                 "seed": seed, "time_scale": 1.0, "fixed_ttft_ms": None,
                                 "fixed_itl_ms": None})
    built = build_engine(cfg)
    r, eng = built.res, built.engine
    eng.use_virtual_clock()
    bs = r.block_size
    active: list[SimRequest] = []
    done: list[SimRequest] = []
    issued = 0

    def submit() -> None:
        nonlocal issued
        pid = issued % sc.distinct if sc.distinct else issued
        prng = random.Random(seed * 1_000_003 + pid)
        req = SimRequest(rid=str(issued), prompt_len=sc.prompt_tokens, max_tokens=sc.output_tokens,
                         block_hashes=[prng.getrandbits(62) for _ in range(sc.prompt_tokens // bs)],
                         arrival_ns=eng.virtual_ns)
        issued += 1
        eng.submit(req)
        active.append(req)

    for _ in range(min(sc.concurrency, sc.requests)):
        submit()
    while len(done) < sc.requests:
        if not eng.step_offline():
            raise RuntimeError(f"{sc}: requests left but none can run (prompt larger than the KV pool?)")
        finished = [q for q in active if q.finish is not None]
        if finished:
            active[:] = [q for q in active if q.finish is None]
            done.extend(finished)
            for _ in finished:
                if issued < sc.requests:
                    submit()
    wall = eng.virtual_ns / 1e9
    out = sum(q.num_out for q in done)
    n_done = len(done)
    done = [q for q in done if int(q.rid) >= sc.measure_from]
    ttft = [(q.first_token_ns - q.arrival_ns) / 1e6 for q in done]
    tpot = [(q.last_token_ns - q.first_token_ns) / 1e6 / (q.num_out - 1) for q in done if q.num_out > 1]
    gaps = sum(len(q.events) - 1 for q in done)
    itl = sum((q.last_token_ns - q.first_token_ns) / 1e6 for q in done) / gaps if gaps else 0.0
    ttft_d = dist(ttft)
    return {"ttft_mean_ms": ttft_d["mean"], "ttft_p50_ms": ttft_d["p50"],
            "tpot_mean_ms": dist(tpot)["mean"], "itl_mean_ms": itl, "output_tok_s": out / wall,
            "tok_s_per_gpu": (out + sc.prompt_tokens * n_done) / wall / r.tp,
            "cached_mean": statistics.fmean(q.cached_device + q.cached_host for q in done),
            "prefill_tok_s": sc.prompt_tokens / (ttft_d["mean"] / 1e3), "steps": eng.steps}


def decode_tpot_ms(profile: str, streams: int, ctx: int, spec_k: int = 0, al: float = 1.0) -> float:
    """Steady-state TPOT of `streams` decoding sequences (no prefill in the step): step time / AL."""
    r = resolve(SimConfig(profile=profile))
    t = StepTiming(r, spec_k)
    b = t.new_batch()
    for _ in range(streams):
        b.add_decode(None, ctx, 1 + spec_k)
    return t.step_seconds(b) * 1e3 / al


# Published figures the shipped profiles are compared with (docs/simulator.md cites them).
_F4 = "H200, vLLM 0.24 (docs/references.md §5)"
_IX = "InferenceX MiniMax-M3 day-0 blog, 2026-06-13"
ANCHORS: list[dict] = [
    dict(profile="h200-qwen3-8b-bf16", label="1 stream, 2000/256", sc=Scenario(1, 2000, 256, 4),
         metric="ttft_mean_ms", published=54.5, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="1 stream, 2000/256", sc=Scenario(1, 2000, 256, 4),
         metric="tpot_mean_ms", published=4.98, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="8 streams, 2000/256", sc=Scenario(8, 2000, 256, 32),
         metric="ttft_p50_ms", published=254, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="8 streams, 2000/256", sc=Scenario(8, 2000, 256, 32),
         metric="tpot_mean_ms", published=6.12, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="8 streams, steady decode step", decode=(8, 2128, 0, 1.0),
         metric="tpot_ms", published=6.12, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="8 streams, 2000/256", sc=Scenario(8, 2000, 256, 32),
         metric="output_tok_s", published=1109, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="EAGLE3 K=3 AL 2.5, 1 stream", sc=Scenario(1, 2000, 256, 4, 3, 2.5),
         metric="tpot_mean_ms", published=2.27, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="EAGLE3 K=3 AL 2.5, 8 streams", sc=Scenario(8, 2000, 256, 32, 3, 2.5),
         metric="tpot_mean_ms", published=2.99, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="EAGLE3 K=3 AL 2.5, 8 streams, steady decode step",
         decode=(8, 2128, 3, 2.5), metric="tpot_ms", published=2.99, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="EAGLE3 K=3 AL 2.5, 8 streams", sc=Scenario(8, 2000, 256, 32, 3, 2.5),
         metric="output_tok_s", published=1907, source=_F4),
    dict(profile="h200-qwen3-8b-bf16", label="SimpleCPUOffload 8 GB, revisits, 8 streams",
         sc=Scenario(8, 2000, 256, 48, distinct=16, measure_from=16),
         cfg=dict(kv_pool_tokens=16 * 1200, kv_offload="simple-cpu", offload_gb=8),
         metric="ttft_p50_ms", published=93, source=_F4),
    dict(profile="h200-minimaxm3-fp8", label="TP8, conc 4, 1024/1024", sc=Scenario(4, 1024, 1024, 16),
         metric="tpot_mean_ms", published=8.4, source=_IX),
    dict(profile="h200-minimaxm3-fp8", label="TP8, conc 4, 1024/1024", sc=Scenario(4, 1024, 1024, 16),
         metric="tok_s_per_gpu", published=113, source=_IX),
    dict(profile="b300-minimaxm3-fp4", label="conc 32, 8192/2048 (published: 8x B200 FP8)",
         sc=Scenario(32, 8192, 2048, 64), metric="itl_mean_ms", published=17.77,
         source="Lambda MiniMax-M3 model page (vLLM, HGX B200)"),
]


def table(out=sys.stdout) -> list[dict]:
    rows, cache = [], {}
    for a in ANCHORS:
        if "decode" in a:
            sim = decode_tpot_ms(a["profile"], *a["decode"])
        else:
            cfg = SimConfig(profile=a["profile"], **a.get("cfg", {}))
            key = (repr(cfg), dataclasses.astuple(a["sc"]))
            if key not in cache:
                cache[key] = simulate(cfg, a["sc"])
            sim = cache[key][a["metric"]]
        rows.append({**{k: a[k] for k in ("profile", "label", "metric", "published", "source")}, "simulated": sim,
                     "deviation": (sim - a["published"]) / a["published"]})
    print("| profile | scenario | metric | published | simulated | deviation | source |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r['profile']} | {r['label']} | {r['metric']} | {r['published']:g} | {r['simulated']:.2f} | "
              f"{100 * r['deviation']:+.1f}% | {r['source']} |", file=out)
    return rows


def single_stream(out=sys.stdout) -> None:
    """Single-stream TPOT and prefill throughput of every shipped profile."""
    from agentx.sim.profile import shipped

    print("| profile | TP | KV pool tokens | 1-stream TPOT (ms, 2k ctx) | 1-stream TPOT (ms, 100k ctx) | "
          "prefill tok/s (32k prompt) |", file=out)
    print("|---|---|---|---|---|---|", file=out)
    for name in shipped():
        cfg = SimConfig(profile=name)
        r = resolve(cfg)
        a = simulate(cfg, Scenario(1, 2000, 256, 2))
        b = simulate(cfg, Scenario(1, min(100_000, r.kv_pool_tokens // 2), 256, 1))
        c = simulate(cfg, Scenario(1, min(32_768, r.kv_pool_tokens // 2), 2, 1))
        print(f"| {name} | {r.tp} | {r.kv_pool_tokens:,} | {a['tpot_mean_ms']:.2f} | {b['tpot_mean_ms']:.2f} | "
              f"{c['prefill_tok_s']:,.0f} |", file=out)


if __name__ == "__main__":
    single_stream()
    print()
    table()
