"""How many concurrent streams can the simulator serve in real time on one core?

The simulator runs as a separate process pinned to one CPU (`python -m agentx.sim`); this
process, pinned to another CPU, drives it over HTTP with a minimal raw aiohttp client (no
JSON parsing per chunk): N closed-loop streams, each sending streaming chat requests
(ignore_eos, fixed max_tokens) back to back. Over a measurement window it reports:
  intended ITL   the mean modelled step time (from the sim's agentx_sim_* counters),
  achieved ITL   the mean gap between chunks the client saw inside each response,
  chunk rate     chunks/s received, and the server's CPU use,
  late           wall time the sim's step loop fell behind its modelled schedule.
A level is "sustained" when late < 2% of the window and achieved ITL <= 1.05 x intended.

    .venv/bin/python bench/sim_throughput.py --streams 64,128,256,384,512
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentx.tokens.words import WORDS  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runq_wait_s(pid: int) -> float:
    """Time the server's main thread spent runnable but not running (CPU contention), Linux only."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def scrape(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("agentx_sim_") and "_created" not in line:
            name, v = line.rsplit(" ", 1)
            out[name] = float(v)
    return out


async def stream_loop(session, url, lane: int, prompt_words: int, max_tokens: int, stop: asyncio.Event,
                      gaps: list, counts: list, window: list) -> None:
    words = " ".join(WORDS[(lane * 31 + j * 7) % len(WORDS)] for j in range(prompt_words))
    turn = 0
    while not stop.is_set():
        body = {"messages": [{"role": "system", "content": f"lane {lane}"},
                             {"role": "user", "content": f"{words} turn {turn}"}],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "chat_template_kwargs": {"enable_thinking": False}}
        turn += 1
        last = None
        async with session.post(url, json=body) as r:
            async for data in r.content.iter_any():
                t = time.perf_counter()
                n = data.count(b"data: ")
                if window[0] <= t <= window[1]:
                    counts[0] += n
                    if last is not None:
                        gaps.append((t - last) / max(n, 1))
                last = t


async def measure(base: str, n: int, args, server: psutil.Process) -> dict:
    url = base + "/v1/chat/completions"
    stop = asyncio.Event()
    gaps: list[float] = []
    counts = [0]
    now = time.perf_counter()
    window = [now + args.warmup, now + args.warmup + args.duration]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s:
        tasks = [asyncio.create_task(stream_loop(s, url, i, args.prompt_words, args.max_tokens, stop, gaps,
                                                 counts, window)) for i in range(n)]
        await asyncio.sleep(args.warmup)
        async with s.get(base + "/metrics") as r:
            m0 = scrape(await r.text())
        c0, w0, q0 = server.cpu_times(), time.perf_counter(), runq_wait_s(server.pid)
        await asyncio.sleep(args.duration)
        c1, w1, q1 = server.cpu_times(), time.perf_counter(), runq_wait_s(server.pid)
        async with s.get(base + "/metrics") as r:
            m1 = scrape(await r.text())
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    d = {k: m1[k] - m0.get(k, 0.0) for k in m1}
    steps = d.get("agentx_sim_steps_total", 0.0)
    intended = d.get("agentx_sim_model_seconds_total", 0.0) / steps if steps else float("nan")
    achieved = statistics.fmean(gaps) if gaps else float("nan")
    late = d.get("agentx_sim_late_seconds_total", 0.0)
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return {"streams": n, "intended_itl_ms": intended * 1e3, "achieved_itl_ms": achieved * 1e3,
            "chunks_per_s": counts[0] / args.duration, "late_frac": late / args.duration,
            "server_cpu_pct": 100 * cpu / (w1 - w0), "cpu_us_per_chunk": 1e6 * cpu / max(counts[0], 1),
            "runq_wait_pct": 100 * (q1 - q0) / (w1 - w0),
            "sustained": late / args.duration < 0.02 and achieved <= 1.05 * intended}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200-minimaxm3-fp8")
    ap.add_argument("--streams", default="64,128,256,384,512")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--prompt-words", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help=">1 raises the chunk rate the sim must deliver, to find its CPU ceiling")
    ap.add_argument("--server-cpu", type=int, default=0, help="CPU to pin the simulator to (-1: no pinning)")
    ap.add_argument("--client-cpu", type=int, default=1, help="CPU to pin the client to (-1: no pinning)")
    args = ap.parse_args()
    if args.client_cpu >= 0:
        os.sched_setaffinity(0, {args.client_cpu})
    rows = []
    for n in [int(x) for x in args.streams.split(",")]:
        port = free_port()
        cmd = [sys.executable, "-m", "agentx.sim", "--port", str(port), "--profile", args.profile,
               "--max-num-seqs", str(max(1024, n)), "--time-scale", str(args.time_scale)]
        cpu = args.server_cpu
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL,
                                preexec_fn=(lambda c=cpu: os.sched_setaffinity(0, {c})) if cpu >= 0
                                else None)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    time.sleep(0.05)
            row = asyncio.run(measure(base, n, args, psutil.Process(proc.pid)))
        finally:
            proc.terminate()
            proc.wait(10)
        rows.append(row)
        print(f"{row['streams']:5d} streams  intended ITL {row['intended_itl_ms']:7.2f} ms  achieved "
              f"{row['achieved_itl_ms']:7.2f} ms  {row['chunks_per_s']:8.0f} chunks/s  late "
              f"{100 * row['late_frac']:5.1f}%  server CPU {row['server_cpu_pct']:5.0f}% "
              f"({row['cpu_us_per_chunk']:.0f} us/chunk, waited for a CPU {row['runq_wait_pct']:.0f}%)  "
              f"{'sustained' if row['sustained'] else 'NOT sustained'}", flush=True)
    ok = [r["streams"] for r in rows if r["sustained"]]
    what = "real time" if args.time_scale == 1 else f"{args.time_scale:g}x real time"
    print(f"max sustained streams at {args.profile} {what} on one core: {max(ok) if ok else 0}")
    cap = [1e6 / r["cpu_us_per_chunk"] for r in rows if r["cpu_us_per_chunk"] > 0]
    if cap:
        print(f"server CPU cost: {min(r['cpu_us_per_chunk'] for r in rows):.0f}-"
              f"{max(r['cpu_us_per_chunk'] for r in rows):.0f} us per chunk -> one core serves "
              f"~{min(cap):,.0f} chunks/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
