#!/usr/bin/env python3
"""Does a 64-lane run reach its steady state, and does it say so?

Runs `agentx run` as a user would, on the embedded simulator with the H200 Qwen3-8B profile
and the workload of the H200 runs (built-in `swe` trace, --context-scale 0.2, --max-think 20),
at 64 lanes for --duration 60 with the defaults for that many lanes (--ramp-up auto: 8 s;
--warmup auto: the window opens when every lane has finished its first request and the
duration counts from there). Prints the measurement window, the steady-state flag, and the
window's throughput next to the server's own over the whole run (from /metrics).

    python bench/steady_state.py                    # ~2 minutes
    python bench/steady_state.py --conc 64 --duration 60 --extra "--ramp-up 0"
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conc", type=int, default=64)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--profile", default="h200-qwen3-8b-bf16")
    p.add_argument("--extra", default="", help="more `agentx run` arguments")
    p.add_argument("--out", default=None, help="result directory (default: a temporary one)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="agentx-steady-")) / "run"
    cmd = [sys.executable, "-m", "agentx.cli", "run", "--trace", "swe", "--conc", str(args.conc),
           "--duration", str(args.duration), "--context-scale", "0.2", "--max-think", "20",
           "--sim-profile", args.profile, "--no-progress", "--validate", "warn",
           "--output-dir", str(out), "--overwrite", *args.extra.split()]
    load = os.getloadavg()[0]
    print(f"steady state: {' '.join(cmd[3:])}\nload average {load:.2f}", flush=True)
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t
    if not (out / "summary.json").exists():
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return 1
    s = json.loads((out / "summary.json").read_text())
    win, th = s["window"], s["throughput"]
    print(f"run: {wall:.0f} s wall, stop {s['stop_reason']}, exit {proc.returncode}")
    print(f"ramp-up {win['ramp_up_s']:g} s, warm-up {win['warmup']}; every lane's first request "
          f"done at +{_f(win['all_lanes_first_done_s'])} s")
    print(f"window: +{_f(win['start_s'])} to +{_f(win['end_s'])} s ({_f(th['window_s'])} s); "
          f"steady_state: {str(s['steady_state']).lower()}")
    print(f"requests: {s['completed']} measured, {s['warmup_requests']} warm-up, "
          f"{s['failed']} failed, {s['cancelled']} cancelled")
    print(f"throughput, window (measured requests): {_f(th['total_tok_s'], 0)} tok/s total, "
          f"{_f(th['output_tok_s'], 0)} output tok/s")
    print(f"throughput, delivered in the window (all completions from its start to the stop): "
          f"{_f(th['delivered_total_tok_s'], 0)} tok/s total over {_f(th['delivered_window_s'])} s")
    print(f"throughput, server (/metrics, whole run): {_f(th['server_total_tok_s'], 0)} tok/s "
          f"total, {_f(th['server_output_tok_s'], 0)} output tok/s over "
          f"{_f(th['server_window_s'])} s")
    ttft = s.get("ttft_ms") or {}
    print(f"TTFT p50 / p90 ms (window): {_f(ttft.get('p50'))} / {_f(ttft.get('p90'))}")
    print("console said:")
    for line in proc.stdout.splitlines():
        if line.startswith(("window:", "delivered", "server (", "run ended", "the window")):
            print("  " + line)
    print(f"load average now {os.getloadavg()[0]:.2f}; results in {out}")
    return 0 if s["steady_state"] else 3


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


if __name__ == "__main__":
    sys.exit(main())
