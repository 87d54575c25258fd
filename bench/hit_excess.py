#!/usr/bin/env python3
"""Where a replay's tier finds more than the real SimpleCPUOffload run, request by request.

bench/sim_vs_real.py shows the simulated tier finding a few points more prefix hit than the real
server on most SimpleCPUOffload runs. This splits that excess by what the real server gave each
measured request: no hit (under 5 % of its prompt) or a hit. Per run, over N closed-loop replays
with the tier deciding (sim_calibration.replay; replay 0 at the recorded send times, the others
jittered as bench/sim_vs_real.py does):
- the hit rate, real and the replays' median;
- the excess (simulated minus real cached tokens, over the measured prompt tokens, each request's
  simulated hit the median over the replays) carried by the real zero-hit requests and by the
  others;
- the zero-hit requests: real, each replay's count, how many of those are the real ones, and the
  share of the prompt the replay found for the real zero-hit requests it served a hit;
- the hit by prompt size: the measured requests in thirds by prompt length, each third's cached
  share of its prompt tokens, real and the replays' (median and range); for a run probed with
  bench/stepprobe, each third's share split by where the hit came from, the GPU's prefix cache
  or the tier (the probe's `load` events; `real_tier`);
- for a run probed with bench/stepprobe, the lazy walk's totals, real against the replays'
  median: blocks stored, walks that stored any, walks started at the free queue's head, blocks
  lost from the GPU without a CPU copy, blocks evicted from the CPU tier.

The H100 runs (tests/data/h100-runs, h100-runs-3) are replayed with the profile's memory-bound
parts at an H100's bandwidth, as bench/sim_vs_real.py --device H100 does
(sim_calibration.realruns.device_calib). `--calib KEY=VALUE` replaces a calibration constant of
the profile for every run's replays on top of that.

Run: .venv/bin/python bench/hit_excess.py [--runs offb,offbp4] [--replays N] [--calib KEY=VALUE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sim_calibration/: not installed
from agentx.sim.profile import Calibration  # noqa: E402
from sim_calibration.events import request_key, run_events  # noqa: E402
from sim_calibration.realruns import DATA, h100_timed, jittered, keys, runs  # noqa: E402
from sim_calibration.replay import measured, replay  # noqa: E402
from sim_calibration.steps import load_steps  # noqa: E402

ZERO = 0.05  # a hit under this share of the prompt counts as none
WALK = (("stored", "store_blocks"), ("walks", None), ("walk_restarts", "walk_head"),
        ("gpu_evicted_unstored", "gpu_evicted_unstored"), ("cpu_evicted", "cpu_evicted"))


def real_walk(name: str) -> dict[str, int | None] | None:
    """The probe's lazy-walk totals of run `name` (tests/data/h*-runs*/steps/NAME.jsonl.gz), keyed
    as the replay's `stats`: None for a run probed without steps, and for a counter the probe did
    not have yet (the eviction and head counters came with h200-runs-9)."""
    for path in sorted(DATA.glob(f"h*-runs*/steps/{name}.jsonl.gz")):
        steps = load_steps(path.parent, name, Path())
        out: dict[str, int | None] = {
            k: sum(s.get(field, 0) for s in steps) if any(field in s for s in steps) else None
            for k, field in WALK if field}
        out["walks"] = sum(1 for s in steps if s.get("store_blocks"))
        return out
    return None


def real_tier(name: str) -> dict[str, int] | None:
    """Per request of run `name` (request_id -> tokens), what the tier gave its latest admission
    before its first token: the `ext` tokens of its last `load` event (the probe's events,
    tests/data/h*-runs*/steps/NAME-events.jsonl.gz) before any preemption after an output token.
    None for a run probed without events. An admission after a preemption that took only GPU
    hits leaves no event, so the caller caps this at the request's reported hit."""
    evs = run_events(DATA, name)
    if evs is None:
        return None
    tier: dict[str, int] = {}
    decoded: set[str] = set()  # preempted after an output token: later loads come after it
    for e in evs:
        if e["ev"] == "load" and (rid := request_key(e["req"])) not in decoded:
            tier[rid] = e["ext"]
        elif e["ev"] == "preempt" and e.get("out"):
            decoded.add(request_key(e["req"]))
    return tier


def split(recs: list[dict], sims: list[list[dict]], tier: dict[str, int] | None = None) -> dict:
    """The excess of run `recs`'s replays `sims` (each replay's rows in `replay`'s order), in
    points of the measured prompt tokens: `total`, on the real zero-hit requests (`zero`: their
    ids) and on the others; each request's simulated hit is the median over the replays. Also the
    replays' hit rates (`rates`) and, per replay, its zero-hit requests (`sim_zero`) and the share
    of the prompt it found for the real zero-hit requests it served a hit (`served`). Given the
    real run's tier hits (`tier`, `real_tier`), `by_source` has each third's GPU and tier shares,
    real and per replay."""
    ok = [r for r in recs if r.get("ok")]
    index = {r["request_id"]: i for i, r in enumerate(ok)}
    meas = measured(recs)
    prompt = sum(r["isl"] for r in meas)
    real = {r["request_id"]: r["cached_tokens"] or 0 for r in meas}
    zero = {r["request_id"] for r in meas if real[r["request_id"]] < ZERO * r["isl"]}
    hits = [{i: s[index[i]]["cached"] or 0 for i in real} for s in sims]  # per replay
    sim = {i: statistics.median(h[i] for h in hits) for i in real}

    def excess(ids) -> float:
        return 100 * sum(sim[i] - real[i] for i in ids) / prompt

    sim_zero, served = [], []
    for h in hits:
        z = {r["request_id"] for r in meas if h[r["request_id"]] < ZERO * r["isl"]}
        sim_zero.append(z)
        served.append([h[i] / ok[index[i]]["isl"] for i in zero - z])
    order = sorted(real, key=lambda i: ok[index[i]]["isl"])
    k = len(order) // 3
    thirds = [order[:k], order[k:2 * k], order[2 * k:]]

    def share(hit: dict, ids: list) -> float:
        return 100 * sum(hit[i] for i in ids) / max(1, sum(ok[index[i]]["isl"] for i in ids))

    by_size = {"real": [share(real, t) for t in thirds],
               "sims": [[share(h, t) for t in thirds] for h in hits]}
    by_source = None
    if tier is not None:
        real_t = {i: min(tier.get(i, 0), real[i]) for i in real}
        sim_t = [{i: s[index[i]]["cached_tier"] for i in real} for s in sims]

        def sources(hit: dict, from_tier: dict) -> list[tuple[float, float]]:
            gpu = {i: hit[i] - from_tier[i] for i in real}
            return [(share(gpu, t), share(from_tier, t)) for t in thirds]

        by_source = {"real": sources(real, real_t), "sims": [sources(h, t) for h, t in zip(hits, sim_t)]}
    return {"real_rate": 100 * sum(real.values()) / prompt, "measured": len(meas), "by_size": by_size,
            "by_source": by_source,
            "rates": [100 * sum(h.values()) / prompt for h in hits],
            "total": excess(real), "zero": zero, "on_zero": excess(zero),
            "on_others": excess(set(real) - zero), "sim_zero": sim_zero, "served": served}


def report(name: str, recs: list[dict], sims: list[list[dict]], walks: list[dict]) -> None:
    """Print run `name`'s split (`split`) and, if it was probed, its walk totals against the
    replays' (`walks`: each replay's `stats`)."""
    f = split(recs, sims, real_tier(name))
    rates, zero = f["rates"], f["zero"]
    print(f"\n### {name} ({f['measured']} measured requests, {len(sims)} replays)\n")
    print(f"- hit rate: real {f['real_rate']:.1f} %, replays' median {statistics.median(rates):.1f} % "
          f"({min(rates):.1f}-{max(rates):.1f})")
    print(f"- excess {f['total']:+.1f} points: on the {len(zero)} real zero-hit requests "
          f"{f['on_zero']:+.1f}, on the {f['measured'] - len(zero)} others {f['on_others']:+.1f}")
    rows = [f"{len(z)} ({len(z & zero)} of them real zero-hit" +
            (f"; the other real zero-hit ones found {100 * statistics.mean(v):.0f} % of their prompt)"
             if v else ")") for z, v in zip(f["sim_zero"], f["served"])]
    print(f"- zero-hit requests: real {len(zero)}; per replay " + ", ".join(rows))
    size = f["by_size"]
    cells = []
    for j, part in enumerate(("shortest", "middle", "longest")):
        v = [s[j] for s in size["sims"]]
        cells.append(f"{part} third real {size['real'][j]:.1f} %, replays {statistics.median(v):.1f} % "
                     f"({min(v):.1f}-{max(v):.1f})")
    print("- hit by prompt size: " + "; ".join(cells))
    if f["by_source"] is not None:
        src = f["by_source"]
        cells = []
        for j, part in enumerate(("shortest", "middle", "longest")):
            gpu, tier = (statistics.median(s[j][k] for s in src["sims"]) for k in (0, 1))
            cells.append(f"{part} real {src['real'][j][0]:.1f} / {src['real'][j][1]:.1f}, "
                         f"replays {gpu:.1f} / {tier:.1f}")
        print("- the same by source, GPU / tier % (replays' medians): " + "; ".join(cells))
    real = real_walk(name)
    if real is not None and walks:
        cells = [f"{k} {'not recorded' if real[k] is None else f'{real[k]:,}'} / "
                 f"{statistics.median(w[k] for w in walks):,.0f}" for k, _ in WALK]
        print("- lazy walk, real / replays' median: " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="comma-separated run names (default: every SimpleCPUOffload run)")
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--jitter-ms", type=float, default=2.0)
    ap.add_argument("--calib", action="append", default=[], metavar="KEY=VALUE",
                    help="a numeric calibration constant of the profile for the replays")
    args = ap.parse_args()
    calib = {}
    for item in args.calib:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--calib {item!r}: expected KEY=VALUE")
        field = Calibration.model_fields.get(key)
        if field is None or field.annotation not in (float, int, float | None):
            ap.error(f"--calib {item!r}: {key!r} is not a numeric calibration constant of the profile")
        try:
            calib[key] = float(value)
        except ValueError:
            ap.error(f"--calib {item!r}: {value!r} is not a number")
    tiered = [r for r in runs(DATA) + h100_timed(DATA) if r.server.get("kv_offload") == "simple-cpu"]
    want = set(args.runs.split(",")) if args.runs else {r.name for r in tiered}
    if unknown := want - {r.name for r in tiered}:
        ap.error(f"--runs: no SimpleCPUOffload run named {', '.join(sorted(unknown))} "
                 f"(there are: {', '.join(r.name for r in tiered)})")
    if args.replays < 1:
        ap.error("--replays: at least 1")
    traces = None
    for run in (r for r in tiered if r.name in want):
        cfg, recs, summ = run.load()
        if traces is None:
            from agentx.trace.load import load_traces

            traces = load_traces(summ["config"]["trace"])
        ks = keys(recs, summ, 16, traces)
        sims, walks = [], []
        run_calib = {**run.calib, **calib} or None  # reads the profile: once per run
        for i in range(args.replays):
            stats: dict = {}
            sims.append(replay(cfg, jittered(recs, args.jitter_ms, i), calib=run_calib, keys=ks, stats=stats,
                               closed_loop=True))
            walks.append(stats)
        report(run.name, recs, sims, walks)


if __name__ == "__main__":
    main()
