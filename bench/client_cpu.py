#!/usr/bin/env python3
"""Client CPU time per streamed chunk, through the full engine (synthesis, HTTP, records).

Starts `agentx serve-sim` in fixed-timing mode as a separate process (pinned to core 0 when
taskset exists), runs the client here (pinned to core 1) against a synthetic trace with no
think time, and prints the client's CPU time per chunk and per request at several lane
counts. Run: python bench/client_cpu.py [--conc 8,64,256] [--duration 15]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from agentx.records import read_records
from agentx.run import RunConfig, run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_trace(d: Path, sessions: int = 64, turns: int = 30, out: int = 256) -> Path:
    """Short agentic sessions: 2k-token context growing by 300 tokens a turn, no think time."""
    d.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        reqs, ids = [], list(range(1, 33))
        for i in range(turns):
            ids = ids + list(range(10_000 * (i + 1), 10_000 * (i + 1) + 5))
            reqs.append({"t": float(i), "type": "n", "in": len(ids) * 64, "out": out,
                         "hash_ids": list(ids), "think_time": 0.0})
        (d / f"s{s}.json").write_text(json.dumps(
            {"id": f"s{s}", "block_size": 64, "system_tokens": 500, "tool_tokens": 1000,
             "requests": reqs}))
    return d


def start_sim(port: int, ttft_ms: float, itl_ms: float) -> subprocess.Popen:
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") and os.cpu_count() > 1 else []
    cmd = pin + [sys.executable, "-m", "agentx.cli", "serve-sim", "--port", str(port),
                 "--profile", "cpu-tiny", "--fixed-ttft-ms", str(ttft_ms),
                 "--fixed-itl-ms", str(itl_ms), "--max-model-len", "1000000"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("simulator did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conc", default="8,64,256")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    args = ap.parse_args()
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    port = free_port()
    sim = start_sim(port, 50.0, args.itl_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = write_trace(Path(tmp) / "trace")
            print(f"{'lanes':>6} {'requests':>9} {'chunks':>9} {'cpu s':>7} "
                  f"{'us/chunk':>9} {'ms/request':>11} {'cpu util':>9}")
            for conc in (int(c) for c in args.conc.split(",")):
                out = Path(tmp) / f"c{conc}"
                cpu0 = time.process_time()
                s = run(RunConfig(trace=str(trace), conc=conc, duration_s=args.duration,
                                  base_url=f"http://127.0.0.1:{port}", output_dir=str(out),
                                  progress=False, scrape_interval_s=0, validation="off",
                                  drain_timeout_s=10))
                cpu = time.process_time() - cpu0
                recs = read_records(out / "requests.jsonl")
                chunks = sum(len(r["chunk_offsets_ns"]) for r in recs)
                print(f"{conc:>6} {len(recs):>9} {chunks:>9} {cpu:>7.2f} "
                      f"{1e6 * cpu / max(1, chunks):>9.1f} {1e3 * cpu / max(1, len(recs)):>11.2f} "
                      f"{s['client']['cpu_util'] or 0:>9.2f}")
    finally:
        sim.terminate()
        sim.wait(10)


if __name__ == "__main__":
    main()
