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
                                    [--baseline] [--stalls MS]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from agentx import aio
from agentx.config import RunConfig
from agentx.engine.self_measure import runqueue_wait_ns
from agentx.records import read_records
from agentx.run import run_async
from agentx.targets.base import Target
from agentx.targets.embedded import EmbeddedSim

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompt_build import default_tokenizer  # noqa: E402  (bench/ is not a package)


class StallWatch:
    """With --stalls MS: a thread samples, every 2 ms while the loop has not beaten for MS,
    where the loop's thread is (its innermost agentx frame); with the thread's run-queue wait
    and the gc pauses inside each stall, a loop-lag maximum can be traced to its cause."""

    def __init__(self, threshold_ms: float) -> None:
        self.threshold_ns = int(threshold_ms * 1e6)
        self.beat = time.perf_counter_ns()
        self.samples: list[str] = []  # where the loop was, sampled during the current stall
        self.wait0: int | None = None
        self.stalls: list[tuple[int, float, float, float, list[str]]] = []
        self.gc: list[tuple[int, float, int]] = []  # (end ns, pause ms, generation)
        self._gc_t0 = 0
        self._main = threading.get_ident()
        self._tid = threading.get_native_id()
        self._done = threading.Event()

    def _wait_ns(self) -> int:
        return runqueue_wait_ns(self._tid) or 0

    def _gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._gc_t0 = now
        else:
            self.gc.append((now, (now - self._gc_t0) / 1e6, info["generation"]))

    def _watch(self) -> None:
        while not self._done.wait(0.002):
            if time.perf_counter_ns() - self.beat > self.threshold_ns:
                if self.wait0 is None:
                    self.wait0 = self._wait_ns()
                frame = sys._current_frames().get(self._main)
                stack = traceback.extract_stack(frame) if frame else []
                ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack
                        if "agentx" in f.filename][-2:]
                if ours == ["aio.py:40 run"]:  # in the loop itself or a library's callback
                    ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack[-2:]]
                self.samples.append(" < ".join(reversed(ours)))

    def on_beat(self, now: int) -> None:
        if self.samples:
            wait = (self._wait_ns() - self.wait0) / 1e6 if self.wait0 is not None else 0.0
            gc_ms = sum(ms for t, ms, _ in self.gc[-50:] if t > self.beat)
            self.stalls.append((now, (now - self.beat) / 1e6, wait, gc_ms, self.samples))
            self.samples, self.wait0 = [], None
        self.beat = now

    def start(self) -> None:
        gc.callbacks.append(self._gc)
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self._done.set()
        gc.callbacks.remove(self._gc)

    def report(self, t0: int, t1: int) -> None:
        gcs = [(ms, g) for t, ms, g in self.gc if t0 < t <= t1]
        by_gen = {g: (sum(1 for _, x in gcs if x == g), max((m for m, x in gcs if x == g), default=0))
                  for g in (0, 1, 2)}
        print("      gc in window (count, max ms) by generation: "
              + ", ".join(f"gen{g} {n} / {m:.1f}" for g, (n, m) in by_gen.items())
              + f"; tracked objects now {len(gc.get_objects())}")
        stalls = sorted((s for s in self.stalls if t0 < s[0] <= t1), key=lambda s: -s[1])
        print(f"      "
              f"{len(stalls)} beats later than {self.threshold_ns / 1e6:g} ms, longest first "
              "(gap, of it waiting for a core, in gc; where the loop was, 2 ms samples):")
        for _, ms, wait, gc_ms, samples in stalls[:12]:
            top = collections.Counter(samples).most_common(3)
            print(f"      {ms:6.1f} ms  wait {wait:5.1f}  gc {gc_ms:5.1f}  "
                  + "; ".join(f"{n}x {w}" for w, n in top))


async def _sample_lag(out: list[tuple[int, float]], interval_s: float = 0.01,
                      watch: StallWatch | None = None) -> None:
    while True:
        t = time.perf_counter_ns()
        await asyncio.sleep(interval_s)
        now = time.perf_counter_ns()
        if watch:
            watch.on_beat(now)
        out.append((now, max(0.0, (now - t) / 1e6 - interval_s * 1e3)))


async def _run_sampled(cfg: RunConfig, target: Target,
                       watch: StallWatch | None) -> tuple[dict, list[tuple[int, float]]]:
    lags: list[tuple[int, float]] = []
    task = asyncio.create_task(_sample_lag(lags, watch=watch))
    try:
        summary = await run_async(cfg, target)
    finally:
        task.cancel()
    return summary, lags


def _p(xs, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def one(conc: int, args: argparse.Namespace, tok_dir: str | None, out: Path) -> None:
    cfg = RunConfig(trace=args.trace, conc=conc, duration_s=args.duration, tokenizer=tok_dir,
                    context_scale=args.context_scale, max_think_s=args.max_think,
                    thinking="off", output_dir=str(out), overwrite=True, progress=False,
                    validation="off", drain_timeout_s=5.0, seed=args.seed,
                    scrape_interval_s=args.scrape_interval)
    sim = EmbeddedSim(api_key=cfg.secret_key(), pin=cfg.golden_al)
    target = sim.start()
    watch = StallWatch(args.stalls) if args.stalls else None
    if watch:
        watch.start()
    try:
        summary, lags = aio.run(_run_sampled(cfg, target, watch))
    finally:
        sim.stop()
        if watch:
            watch.stop()
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
    if watch:
        watch.report(t_first, t_last)


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
    ap.add_argument("--scrape-interval", type=float, default=5.0,
                    help="the run's /metrics period in s (0: no scraping), as agentx run's")
    ap.add_argument("--keep", metavar="DIR", help="keep the runs' output directories in DIR")
    ap.add_argument("--stalls", type=float, metavar="MS",
                    help="print where the loop was when it stalled longer than MS, and gc pauses")
    args = ap.parse_args()
    tok_dir = args.tokenizer or default_tokenizer()
    print(f"token-exact lag: trace {args.trace}, context scale {args.context_scale}, max think "
          f"{args.max_think} s, {args.duration} s per run, tokenizer {tok_dir}, "
          f"{os.cpu_count()} cores")
    print(f"{'lanes':>5} {'reqs':>6} {'later':>6} {'lag p50':>8} {'p99':>8} {'max':>8} "
          f"{'first p50':>9} {'first p99':>9} {'loop p99':>8} {'loop max':>8} {'exact':>7} "
          f"{'load':>5}  build")
    with tempfile.TemporaryDirectory(prefix="agentx-lag-") as tmp:
        tmp = args.keep or tmp
        for conc in (int(c) for c in args.conc.split(",")):
            one(conc, args, tok_dir, Path(tmp) / f"c{conc}")
            if args.baseline:
                one(conc, args, None, Path(tmp) / f"c{conc}-chat")


if __name__ == "__main__":
    main()
