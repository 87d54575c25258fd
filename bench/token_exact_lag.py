#!/usr/bin/env python3
"""Client lag in token-exact mode (`--tokenizer`) against the embedded simulator.

Runs `agentx run` (the whole engine, in this process, one worker) on the built-in `swe` trace
with a local tokenizer (default: the tiny Qwen3-style one tests/vllm_env builds) at each
concurrency, and prints from the run's records and from a loop-lag sampler running on the
run's own event loop:
- dispatch lag (send - intended send) p50 / p99 / max of non-first requests (every request
  after its lane's first) and p50 / p99 of each lane's first request;
- event-loop lag p99 / max between the first request's send and the last request's end (the
  sampler wakes every 10 ms and records how late, with the time, so the start-up before the
  first send and the summary's computation after the run are left out);
- the machine's load average (other work on the cores shows up as lag too).
With --baseline each concurrency also runs without a tokenizer (server-side template, chat
messages), the client's cost without token-exact mode, on the same machine at the same time.
Targets (issue 12, 2 cores): non-first p99 <= 5 ms at 64 lanes and <= 20 ms at 256; loop lag
max <= 50 ms after the first request.

    python bench/token_exact_lag.py [--conc 64,256] [--duration 40] [--tokenizer DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agentx import aio
from agentx.config import RunConfig
from agentx.records import read_records
from agentx.run import run_async
from agentx.sim.embedded import start_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompt_build import default_tokenizer  # noqa: E402  (bench/ is not a package)


async def _sample_lag(out: list[tuple[int, float]], interval_s: float = 0.01) -> None:
    while True:
        t = time.perf_counter_ns()
        await asyncio.sleep(interval_s)
        now = time.perf_counter_ns()
        out.append((now, max(0.0, (now - t) / 1e6 - interval_s * 1e3)))


async def _run_sampled(cfg: RunConfig, base_url: str) -> tuple[dict, list[tuple[int, float]]]:
    lags: list[tuple[int, float]] = []
    task = asyncio.create_task(_sample_lag(lags))
    try:
        summary = await run_async(cfg, base_url, embedded=True)
    finally:
        task.cancel()
    return summary, lags


def _p(xs, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def one(conc: int, args: argparse.Namespace, tok_dir: str | None, out: Path) -> None:
    cfg = RunConfig(trace=args.trace, conc=conc, duration_s=args.duration, tokenizer=tok_dir,
                    context_scale=args.context_scale, max_think_s=args.max_think,
                    thinking="off", output_dir=str(out), overwrite=True, progress=False,
                    validation="off", drain_timeout_s=5.0, seed=args.seed)
    sim = start_in_process(cfg.sim.model_copy(update={"port": 0}))
    try:
        summary, lags = aio.run(_run_sampled(cfg, sim.base_url))
    finally:
        sim.stop()
    load = os.getloadavg()
    recs = [r for r in read_records(out / "requests.jsonl") if r.get("start_ns")]
    first_of_lane: dict[int, dict] = {}
    for r in sorted(recs, key=lambda r: r["intended_send_ns"]):
        first_of_lane.setdefault(r["lane"], r)
    first_ids = {id(r) for r in first_of_lane.values()}
    first = [r["dispatch_lag_ms"] for r in first_of_lane.values()]
    later = [r["dispatch_lag_ms"] for r in recs if id(r) not in first_ids]
    t_first = min(r["start_ns"] for r in recs) if recs else 0
    t_last = max(r["end_ns"] for r in recs) if recs else 0  # not the summary's work after it
    after = [lag for t, lag in lags if t_first < t <= t_last]
    build = summary["run"]["tokens"].get("build") or f"({summary['run']['tokens']['mode']})"
    exact = np.mean([r["isl"] == r["isl_intended"] for r in recs if r.get("isl")])
    print(f"{conc:>5} {len(recs):>6} {len(later):>6} {_p(later, 50):>8.2f} {_p(later, 99):>8.2f} "
          f"{max(later, default=float('nan')):>8.1f} {_p(first, 50):>9.1f} {_p(first, 99):>9.1f} "
          f"{_p(after, 99):>8.2f} {max(after, default=float('nan')):>8.1f} "
          f"{100 * exact:>6.1f}% {load[0]:>5.2f}  {build}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conc", default="64,256")
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--trace", default="swe")
    ap.add_argument("--context-scale", type=float, default=0.2)
    ap.add_argument("--max-think", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="HF tokenizer dir (default: the tiny test model's)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run each concurrency without a tokenizer, for comparison")
    args = ap.parse_args()
    tok_dir = args.tokenizer or default_tokenizer()
    print(f"token-exact lag: trace {args.trace}, context scale {args.context_scale}, max think "
          f"{args.max_think} s, {args.duration} s per run, tokenizer {tok_dir}, "
          f"{os.cpu_count()} cores")
    print(f"{'lanes':>5} {'reqs':>6} {'later':>6} {'lag p50':>8} {'p99':>8} {'max':>8} "
          f"{'first p50':>9} {'first p99':>9} {'loop p99':>8} {'loop max':>8} {'exact':>7} "
          f"{'load':>5}  build")
    with tempfile.TemporaryDirectory(prefix="agentx-lag-") as tmp:
        for conc in (int(c) for c in args.conc.split(",")):
            one(conc, args, tok_dir, Path(tmp) / f"c{conc}")
            if args.baseline:
                one(conc, args, None, Path(tmp) / f"c{conc}-chat")


if __name__ == "__main__":
    main()
