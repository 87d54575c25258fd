#!/usr/bin/env python3
"""The API server and the engine core around each request, from the probed real runs' engine events.

For every run shipped with vLLM's engine events (tests/data/h*-runs*/steps/NAME-events.jsonl.gz,
written by bench/stepprobe) the client's records and the engine's events are put on one clock
(sim_calibration/events.py) and it prints, per run:
- how well the clocks line up (spread of client end - free above its floor);
- the share of requests the engine core received at the end of an engine call (it was busy);
- the front end's work, send -> add, fitted on the requests that met an idle engine core;
- the engine call that admits a request into an idle engine (host preparation and launch);
- how long after the engine call that returned it a stream's first token reached the client,
  against its second token;
then, per GPU, the front end fitted on all runs together, and how many front-end servers the
32-lane cold bursts would need with that work and with the profile's fitted work; and last, per
32-lane run, the order in which the engine core received the cold burst against the send order and
the profile's front end (its reads of long bodies, sim/frontend.py `reads`): each request's summed
distance from its real place, and where the longest prompt landed.

Run: .venv/bin/python bench/frontend_events.py   (docs/simulator-calibration-log.md, "The front end, measured")
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentx.sim.build import frontend  # noqa: E402
from agentx.sim.profile import load_profile  # noqa: E402
from sim_calibration.events import (  # noqa: E402
    arrivals,
    burst,
    burst_need,
    clock_offset,
    displacement,
    first_token_lags,
    fit_frontend,
    frontend_order,
    probed_runs,
)
from sim_calibration.realruns import DATA, PROFILE  # noqa: E402
from sim_calibration.steps import idle_admissions  # noqa: E402


def _q(xs, q: float) -> str:
    return f"{np.quantile(xs, q):.1f}" if len(xs) else "-"


def main(argv: list[str]) -> int:
    data = Path(argv[0]) if argv else DATA
    runs = probed_runs(data)
    print("| run | GPU | lanes | measured | clocks: spread p90 (ms) | added at a step end | front end, idle core "
          "| idle admission call p50 / mean (n) | 1st token after its call p50 | 2nd token p50 |")
    print("|---|---|---:|---:|---:|---:|---|---|---:|---:|")
    pooled: dict[str, list] = {}
    for run in runs:
        off, spread = clock_offset(run)
        arrs = arrivals(run, off)
        meas = [a for a in arrs if not a.warmup]
        pooled.setdefault(run.device, []).extend(arrs)
        a, b, rms, n = fit_frontend(arrs)
        fe = f"{a:.2f} ms + {b:.3f} us/token (n {n}, rms {rms:.1f})" if n >= 3 else f"- (n {n})"
        idle = idle_admissions(run.steps)
        adm = f"{np.median(idle):.1f} / {np.mean(idle):.1f} ({len(idle)})" if idle else "-"
        first, second = first_token_lags(run, off)
        at_end = sum(x.at_step_end for x in meas) / max(len(meas), 1)
        print(f"| {run.name} | {run.device} | {run.lanes} | {len(meas)} | {_q(spread, 0.9)} | {at_end:.0%} | {fe} "
              f"| {adm} | {_q(first, 0.5)} | {_q(second, 0.5)} |")
    cal = load_profile(PROFILE).calibration
    print()
    for device, arrs in pooled.items():
        a, b, rms, n = fit_frontend(arrs)
        print(f"{device}, all runs: front end {a:.2f} ms + {b:.3f} us/token over {n} requests that met an idle "
              f"engine core (rms {rms:.1f} ms)")
        for label, (fa, fb) in (("measured", (a, b)), (f"profile {PROFILE}",
                                                       (cal.frontend_ms, cal.frontend_us_per_prompt_token))):
            need = [x for x in (burst_need(r, fa, fb) for r in runs if r.device == device and r.lanes >= 32)
                    if x is not None]
            if need:
                print(f"  cold bursts at 32 lanes with the {label} work ({fa:.2f} ms + {fb:.3f} us/token): one "
                      f"server needs {min(need):.2f}..{max(need):.2f} x the time the engine took to receive them "
                      f"({sum(x > 1 for x in need)} of {len(need)} runs above 1)")
    print("\n| run | burst | summed distance from the real order: send order | profile's front end "
          "| longest prompt (tokens): sent / real / profile |")
    print("|---|---:|---:|---:|---|")
    for run in runs:
        sent, real = burst(run)
        if run.lanes < 32 or not sent:
            continue
        model = frontend_order(frontend(cal), sent)
        sent_ids = [r["request_id"] for r in sent]
        longest = max(sent, key=lambda r: r["isl"])["request_id"]
        isl = max(r["isl"] for r in sent)
        print(f"| {run.name} | {len(sent)} | {displacement(sent_ids, real)} | {displacement(model, real)} "
              f"| {isl:,}: {sent_ids.index(longest) + 1} / {real.index(longest) + 1} / {model.index(longest) + 1} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
