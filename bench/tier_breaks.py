#!/usr/bin/env python3
"""Where each request's prefix hit stops, and why: real SimpleCPUOffload runs against their replays.

On the small-pool offload runs almost every hit comes from the CPU tier, and the simulator finds a
whole previous prompt more often than the real server, which more often finds a prefix broken
inside the tier (docs/simulator-calibration-log.md, "Repeats at every tier size"). This counts, for each measured
request's first lookup, what became of the first block it did not find: "whole" (it found all it
may), "new content" (no request had computed it: everything before it was found), "cpu-evicted",
"gpu-evicted without a CPU copy" (the lazy walk did not store it before the allocator took it, or
its CPU copy had gone first), "store in flight", or "stored" (stored, and its eviction from the
tier was not seen).

Real: the `lookup` events bench/stepprobe writes with AGENTX_STEPLOG_FATES=1 (the probe follows
every block's content by its hash): the H200 runs probed without it print "not recorded"; the
runs of tests/data/h100-runs have them (on an H100: their replays price an H200's steps).
Simulated: the same run replayed closed-loop with the tier deciding (sim_calibration.replay) and
the tier following its blocks' content (`OffloadTier.fates`), the lookup classified as the probe
does. Beside the counts, the mean share of the prompt found before each stop, real and simulated.

Run: .venv/bin/python bench/tier_breaks.py [--runs h100-offb,off75b] [--replays N [--jitter-ms J]]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sim_calibration/: not installed
import sim_calibration.replay as rp  # noqa: E402
from sim_calibration.events import request_key, run_events  # noqa: E402
from sim_calibration.realruns import DATA, h100_runs, jittered, keys, runs  # noqa: E402

ORDER = ("whole", "new content", "cpu-evicted", "gpu-evicted without a CPU copy", "store in flight",
         "stored")


def events(name: str) -> list[dict]:
    """The probe's events of run `name` (tests/data/h*-runs*/steps/NAME-events.jsonl.gz)."""
    return run_events(DATA, name) or []


def real_stops(evs: list[dict]) -> dict[str, tuple[str, int]] | None:
    """record id -> (the stop of its first lookup, the prompt tokens it found before it on the
    GPU and in the tier), from a run's probe events; None if the run was probed without fates."""
    out: dict[str, tuple[str, int]] = {}
    for e in evs:
        if e.get("ev") == "lookup":
            out.setdefault(request_key(e["req"]), (e["stop"], e.get("gpu", 0) + e.get("hit", 0)))
    return out or None


def sim_stops(cfg, records: list[dict], ks: dict) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """Record id -> (the stop of its first lookup, the tokens found before it) in a closed-loop
    replay (the tier deciding), and record id -> the hit the replay reports (vLLM 0.24's: its
    latest admission before the first token)."""
    ids = [r["request_id"] for r in records if r.get("ok")]
    out: dict[str, tuple[str, int]] = {}

    def classify(eng, req) -> None:
        rid = ids[int(req.rid)]
        if rid in out or req.num_out:
            return
        tier, hashes = eng.offload, req.block_hashes
        limit = min((req.target_len - 1) // eng.bs, len(hashes))
        dev = eng.pool.match(hashes, limit)
        n = dev + tier.match(hashes[dev:], limit - dev, start=dev)
        out[rid] = ("whole" if n >= limit else tier.fates.get(hashes[n], "new content"), n * eng.bs)

    def follow(eng) -> None:
        eng.offload.fates = {}
        eng.before_lookup = lambda req: classify(eng, req)

    rows = rp.replay(cfg, records, keys=ks, setup=follow, closed_loop=True)
    return out, {rid: row["cached"] or 0 for rid, row in zip(ids, rows)}


def table(name: str, measured: list[dict], real: dict | None,
          sims: list[tuple[dict, dict]]) -> None:
    """Counts by stop, split by the reported hit's size (zero: under 5% of the prompt), and the
    share of the prompt found before the stop (mean over the class's requests; simulated: over
    every replay's)."""
    def count(stops: dict, hits: dict) -> Counter:
        return Counter((stops.get(r["request_id"], ("no lookup", 0))[0],
                        "zero" if hits[r["request_id"]] < 0.05 * r["isl"] else "hit")
                       for r in measured)

    def found(stops_list: list[dict], k: str) -> str:
        f = [stops[r["request_id"]][1] / r["isl"] for stops in stops_list for r in measured
             if stops.get(r["request_id"], ("",))[0] == k]
        return f"{sum(f) / len(f):.2f}" if f else "-"
    real_hits = {r["request_id"]: r["cached_tokens"] or 0 for r in measured}
    print(f"\n### {name} ({len(measured)} measured requests; simulated: "
          f"{'median of ' + str(len(sims)) + ' replays' if len(sims) > 1 else 'one replay'})\n")
    print("| first missing block | real: zero hit | real: a hit | simulated: zero hit | simulated: a hit "
          "| prompt found before it: real | simulated |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    sim_counts = [count(s, h) for s, h in sims]
    rc = count(real, real_hits) if real is not None else None
    keys_ = sorted({k[0] for c in sim_counts + ([rc] if rc else []) for k in c},
                   key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))
    for k in keys_:
        med = [sorted(c[(k, z)] for c in sim_counts)[len(sim_counts) // 2] for z in ("zero", "hit")]
        real_cells = [str(rc[(k, z)]) for z in ("zero", "hit")] if rc else ["not recorded"] * 2
        print(f"| {k} | {real_cells[0]} | {real_cells[1]} | {med[0]} | {med[1]} | "
              f"{found([real], k) if real is not None else '-'} | {found([s for s, _ in sims], k)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="comma-separated run names (default: every SimpleCPUOffload "
                                   "run with probe events)")
    ap.add_argument("--replays", type=int, default=1)
    ap.add_argument("--jitter-ms", type=float, default=2.0)
    args = ap.parse_args()
    want = set(args.runs.split(",")) if args.runs else None
    traces = None
    for run in runs(DATA) + h100_runs(DATA):
        if run.server.get("kv_offload") != "simple-cpu" or (want is not None and run.name not in want):
            continue
        evs = events(run.name)
        if not evs:
            continue
        cfg, recs, summ = run.load()
        if traces is None:
            from agentx.trace.load import load_traces

            traces = load_traces(summ["config"]["trace"])
        ks = keys(recs, summ, 16, traces)
        measured = rp.measured(recs)
        sims = [sim_stops(cfg, jittered(recs, args.jitter_ms, i), ks) for i in range(args.replays)]
        table(run.name if run.device == "H200" else f"{run.name} (real on an {run.device}, "
              f"replayed on the H200 profile)", measured, real_stops(evs), sims)


if __name__ == "__main__":
    main()
