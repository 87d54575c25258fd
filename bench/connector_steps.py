#!/usr/bin/env python3
"""What a KV connector adds to each engine step of real vLLM, and the simulator constants for it.

The data: per-step timings of real vLLM 0.24.0 on one H200 (written by
bench/stepprobe/sitecustomize.py inside the server: each engine step's time and the batch it ran —
scheduled tokens, requests, decode requests, the context they had — plus the blocks or tokens the
connector's metadata moved), in two sets, each with its own no-connector baseline on the same
capped pool (12,288 blocks of 16 tokens) and the `swe` trace:

    h200-runs-5 (16 lanes; h200-runs-5/README.md)
    cap     no connector                              the baseline
    ab0-a   SimpleCPUOffload 60 GiB lazy              (a first A/B's side A)
    ab-a    SimpleCPUOffload 60 GiB lazy              (the A/B's side A)
    ab-b    MooncakeStoreConnector 59 GB              fitted: mooncake
    o32     SimpleCPUOffload 60 GiB lazy, 32 lanes

    h200-runs-7 (32 lanes; the probe also logs each step's prefill chunks apart: h200-runs-7/README.md)
    cap32p, cap32p2   no connector                    the baseline (both runs)
    offbp3            SimpleCPUOffload 60 GiB lazy    fitted: simple-cpu

    h200-runs-8, h200-runs-9 (shown against h200-runs-7's baseline, not fitted)
    off54, off68, off68b, off75, off54b, off54c, off68c, off75b, offbp4
                      SimpleCPUOffload, offbp3's configuration with a 54-75 GB tier and repeats

SimpleCPUOffload is fitted on h200-runs-7: its steps' prefill is known exactly (h200-runs-5 knew
only the longest context of a step), and 32 lanes is the load of the offb runs the simulator is
judged on; the 16-lane runs are shown (they gave factor 1.0 and no stalls: fewer preemptions and
loads a step), and so are the nine later 32-lane runs (their baseline was measured on another day,
so their stall_ms can come out negative where their factor overprices their prefill steps).

Each set ends with its runs' steps by class, against the baseline and normalised by the baseline
runs' own ratio per class: steps with prompt tokens, and decode-only steps (median ratio / summed
time ratio). Under SimpleCPUOffload at 32 lanes the prefill steps take the baseline's time (summed
0.96-0.99 on all ten runs, the baseline runs' own 0.99) and the decode-only steps carry the
connector's extra time (1.16-1.35, the baseline runs' own 1.04-1.05), so one factor on every step
overprices the prefill steps (docs/simulator-calibration-log.md, "SimpleCPUOffload's cost by step
class"). What the decode-only steps carry is the host's launch of the step's copies (the worker's
`get_finished` launches its loads and stores after the model; a long step hides it): so for
SimpleCPUOffload (`LAUNCH_KINDS`) the fit is the launch, ms per 1,000 loaded and stored blocks,
and the set's table by class is printed again with each step priced max(baseline, launch).
h200-runs-5's split is rough: without the chunks logged apart its baseline prices a prefill step
from the step's longest context, so its prefill column is not comparable with h200-runs-7's.

Method:
1. Baseline step model, fitted by least squares on the set's baseline (no connector):
       t = c0 + c1 x requests + c2 x context (k tokens) + c3 x prefill tokens (k)
           + c4 x prefill tokens x (prefill context + prefill tokens / 2) (M)
   (h200-runs-7: decode context and the prefill chunks' own token pairs `pre_attn`; h200-runs-5:
   all context, and the longest context as the prefill's)
   vLLM 0.24 runs with a batch queue of 2 (async scheduling): the time of engine call i+1 is
   spent finishing the batch scheduled by call i, so each batch is paired with the next call's
   time (`--shift`, default 1; the fit is better at 1: the baseline's R2 is printed).
2. For each connector run, every step's ratio real / baseline. `factor` = the run's median ratio
   over the baseline run's own (so the baseline's fit error cancels). A step stalls when it
   exceeds factor x baseline by more than the baseline run's own 99th percentile of that excess;
   `stall_fraction` = the share of stalled steps beyond the baseline's 1 %, and `stall_ms` what
   makes the run's busy time whole: its total time beyond factor x baseline, less what the
   simulator already adds for the run's admissions right after a decode-only step (the profile's
   admit_host_ms and admit_host_us_per_token; `admit s`), over the stalled steps (so the
   modelled mean step, hence mean TPOT, is the measured one). The excess is also
   regressed per 2-s window on the tokens loaded and stored in
   it, to show whether it follows the blocks moved (R2 printed).
3. SimpleCPUOffload instead: a step takes max(its baseline price, a x loaded + b x stored blocks /
   1,000), a and b by least squares over the fitted run's steps that move blocks (a grid of 1 ms,
   then 0.1 ms); written with factor 1 and no stalls (sim/timing.py prices it so).
4. The connector's load rate is the copy rate vLLM 0.24's own SimpleCPUOffload path measured on
   the same H200 (tests/data/h200-runs-5/copyrate.json: the median load GB/s of batches of 16+
   blocks with a GEMM loop on another stream).

5. Not written: with the measured copy rate in place of the profile's effective 3.5 GB/s (and
   a fixed load latency bisected so that the anchor measurement, docs/references.md §5, still
   holds), bench/sim_vs_real.py fell from 6/7 to 4/7 on the offb group: the effective rate stands
   in for what the simulator lacks there (docs/simulator.md, "Connector step costs").

With `--write` the constants go into the profile (default h200-qwen3-8b-bf16, the measured
model shape): calibration.offload_step_cost, per connector kind, pooled over its fitted runs.

Run: .venv/bin/python bench/connector_steps.py [--write] [--shift 0|1]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # sim_calibration/: not installed
from agentx.sim.profile import load_profile  # noqa: E402
from sim_calibration.steps import admitting_after_decode, load_steps, paired  # noqa: E402

DATA = ROOT / "tests" / "data"


@dataclass
class StepSet:
    folder: str  # under DATA
    runs: dict[str, str]  # run -> connector kind ("none": a baseline run)
    fitted: tuple[str, ...]  # the runs whose constants are written
    exact: bool  # the probe logged the prefill chunks apart (pre_tokens, pre_ctx, pre_attn)
    shown: tuple[tuple[str, str, str], ...] = ()  # (run, folder, kind) elsewhere, shown against this baseline


# the other probed SimpleCPUOffload runs at 32 lanes with their prefill chunks logged apart (offbp3's
# configuration at 54, 68 and 75 GB of tier and repeats), shown against h200-runs-7's baseline
SHOWN_32 = tuple((run, folder, "simple-cpu")
                 for folder, names in (("h200-runs-8", ("off54", "off68", "off68b", "off75")),
                                       ("h200-runs-9", ("off54b", "off54c", "off68c", "off75b", "offbp4")))
                 for run in names)
SETS = (StepSet("h200-runs-5", {"cap": "none", "ab0-a": "simple-cpu", "ab-a": "simple-cpu",
                                "ab-b": "mooncake", "o32": "simple-cpu"}, ("ab-b",), False),
        StepSet("h200-runs-7", {"cap32p": "none", "cap32p2": "none", "offbp3": "simple-cpu"},
                ("offbp3",), True, SHOWN_32))


def features(s: dict, exact: bool) -> list[float]:
    if exact:
        return [1.0, s.get("reqs", 0), (s.get("ctx", 0) - s.get("pre_ctx", 0)) / 1e3,
                s.get("pre_tokens", 0) / 1e3, s.get("pre_attn", 0) / 1e6]
    decode = s.get("decode", 0)
    prefill = s.get("tokens", 0) - decode
    ctx_p = s.get("ctx_max", 0) if prefill else 0  # the prefilling request: the longest context
    return [1.0, s.get("reqs", 0), s.get("ctx", 0) / 1e3, prefill / 1e3,
            prefill * (ctx_p + prefill / 2) / 1e6]


def aligned(steps: list[dict], shift: int, exact: bool) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Batch i's features with call i+shift's time (the batch queue's pairing)."""
    batches, times = paired(steps, shift)
    return np.array([features(s, exact) for s in batches]), np.array(times), batches


def moved(s: dict) -> tuple[float, float]:
    """Tokens the step's connector metadata loads and stores."""
    return (s.get("load_blocks", 0) * 16 + s.get("load_tokens", 0),
            s.get("store_blocks", 0) * 16 + s.get("store_tokens", 0))


def copy_rate() -> float:
    rows = json.loads((DATA / "h200-runs-5" / "copyrate.json").read_text())
    return statistics.median(r["GBps"] for r in rows
                             if r["op"] == "load" and r["loaded"] and r["blocks"] >= 16)


def admissions(steps: list[dict], decode_ms: np.ndarray, admit: tuple[float, float]) -> float:
    """The time (s) the simulator already adds for admitting requests after decode-only batches
    (agentx/sim/timing.py: the next batch's host preparation beyond the decode step's time, with
    the profile's admit_host_ms, admit_host_us_per_token), so the stalls do not count it twice."""
    a, b = admit
    return sum(max(0.0, a + b * n / 1e3 - decode_ms[i]) for i, n in admitting_after_decode(steps)) / 1e3


def by_class(batches: list[dict], real: np.ndarray, model: np.ndarray) -> dict[str, tuple[int, float, float]]:
    """Steps with prefill tokens and decode-only steps apart: (steps, median real/model, summed
    real over summed model); `model` is the baseline's price scaled by its own median ratio."""
    pre = np.array([s.get("tokens", 0) > s.get("decode", 0) for s in batches])
    return {c: (int(m.sum()), float(np.median(real[m] / model[m])), float(real[m].sum() / model[m].sum()))
            for c, m in (("prefill", pre), ("decode-only", ~pre)) if m.any()}


# connectors whose cost is priced as the host's launch of each step's copies (the rest: factor
# and stalls); SimpleCPUOffload launches its loads and stores in `get_finished`, after the model
LAUNCH_KINDS = ("simple-cpu",)


def blocks(batches: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Thousands of blocks each batch's connector metadata loads and stores."""
    return (np.array([s.get("load_blocks", 0) for s in batches]) / 1e3,
            np.array([s.get("store_blocks", 0) for s in batches]) / 1e3)


def launch_model(pred: np.ndarray, load_k: np.ndarray, store_k: np.ndarray, c: tuple[float, float]) -> np.ndarray:
    """A step's time with the copies it launches: the host's launch (`c` ms per 1,000 loaded and
    stored blocks) hides behind a longer step and sets a shorter one (sim/timing.py)."""
    return np.maximum(pred, c[0] * load_k + c[1] * store_k)


def fit_launch(y: np.ndarray, pred: np.ndarray, load_k: np.ndarray, store_k: np.ndarray) -> tuple[float, float]:
    """Least squares of `launch_model` on a run's steps: a grid of 1 ms, then of 0.1 ms around it."""
    moved = (load_k + store_k) > 0
    y, pred, load_k, store_k = y[moved], pred[moved], load_k[moved], store_k[moved]
    best = (0.0, 0.0)
    for step, span in ((1.0, (0.0, 150.0, 0.0, 150.0)), (0.1, None)):
        if span is None:
            span = (best[0] - 1, best[0] + 1, best[1] - 1, best[1] + 1)
        ls = np.arange(max(0.0, span[0]), span[1] + step / 2, step)
        ss = np.arange(max(0.0, span[2]), span[3] + step / 2, step)
        sse = [[float(np.sum((y - launch_model(pred, load_k, store_k, (a, b))) ** 2)) for b in ss] for a in ls]
        i, j = np.unravel_index(int(np.argmin(sse)), (len(ls), len(ss)))
        best = (float(ls[i]), float(ss[j]))
    return round(best[0], 1), round(best[1], 1)


def print_by_class(classes: list[tuple[str, str, dict]]) -> None:
    """Each run's steps by class against the baseline, each class normalised by the baseline
    runs' own median ratio for that class (the baseline runs are printed too): where a
    connector's extra time falls. Shown, not fitted."""
    base = [c for _, k, c in classes if k == "none"]
    norm = {c: statistics.median(b[c][1] for b in base) for c in ("prefill", "decode-only")}
    print(f"\n{'run':7s} {'connector':11s} | by step class against the baseline (median ratio / summed time ratio)")
    for name, kind, c in classes:
        cells = [f"{k} {c[k][0]:5d} steps {c[k][1] / norm[k]:.3f} / {c[k][2] / norm[k]:.3f}" for k in norm if k in c]
        print(f"{name:7s} {kind:11s} | " + " | ".join(cells))


def fit_set(st: StepSet, shift: int, per_kind: dict, admit: tuple[float, float]) -> None:
    """One set: its baseline model, then every run against it (printed); the fitted runs'
    constants are added to per_kind. `admit`: the profile's (admit_host_ms,
    admit_host_us_per_token), whose cost the stalls leave out (`admissions`)."""
    kinds = {**st.runs, **{name: kind for name, _, kind in st.shown}}
    folders = {**dict.fromkeys(st.runs, st.folder), **{name: folder for name, folder, _ in st.shown}}
    runs = {name: load_steps(DATA, name, Path(folders[name]) / "steps") for name in kinds}
    paired_runs = {name: aligned(runs[name], shift, st.exact) for name in kinds}  # once per run
    base = [paired_runs[n][:2] for n, k in st.runs.items() if k == "none"]
    X, y = np.vstack([b[0] for b in base]), np.concatenate([b[1] for b in base])
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    pred = X @ coef
    r2 = 1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)
    base_ratio = float(np.median(y / pred))
    base_excess = y - base_ratio * pred
    threshold = float(np.quantile(base_excess, 0.99))
    names = "+".join(n for n, k in st.runs.items() if k == "none")
    print(f"\n{st.folder}: baseline ({names}, no connector, {len(y)} steps, shift {shift}): "
          f"t = {coef[0]:.3f} + {coef[1]:.4f} x reqs + {coef[2]:.4f} x ctx_k + {coef[3]:.3f} x prefill_k "
          f"+ {coef[4]:.5f} x prefill x ctx (M) ms; R2 {r2:.3f}; median real/model "
          f"{base_ratio:.3f}; stall threshold (p99 excess) {threshold:.1f} ms")
    print(f"\n{'run':7s} {'connector':11s} {'steps':>6s} {'busy s':>7s} {'real/model':>10s} "
          f"{'factor':>7s} {'stall %':>8s} {'stall ms':>9s} {'excess s':>9s} {'admit s':>8s} "
          f"{'k tok loaded':>12s} {'k tok stored':>12s} {'window R2':>9s} {'sched conn ms/step':>18s} "
          f"{'reqs/step':>9s} {'tok/step':>10s}")
    classes = []  # per run: (name, kind, ratios and times by step class)
    launch = {}  # kind -> (load, store) ms per 1,000 blocks, from the set's fitted runs
    for name in st.fitted:
        if kinds[name] in LAUNCH_KINDS:
            X, y, batches = paired_runs[name]
            launch[kinds[name]] = fit_launch(y, base_ratio * (X @ coef), *blocks(batches))
    priced = []  # per run of a launch kind: (name, kind, by class with the launch model)
    for name, kind in kinds.items():
        X, y, batches = paired_runs[name]
        pred = X @ coef
        factor = float(np.median(y / pred)) / base_ratio
        excess = y - factor * base_ratio * pred
        stalled = excess > threshold
        share = max(0.0, float(stalled.mean()) - 0.01)
        adm = admissions(runs[name], factor * base_ratio * pred, admit)
        stall_ms = float((excess.sum() - adm * 1e3) / (share * len(y))) if share else 0.0
        lt = np.array([moved(s) for s in batches])
        t = np.array([s["t"] for s in batches])
        w = ((t - t[0]) // 2).astype(int)
        n = int(w.max()) + 1
        E = np.bincount(w, y - base_ratio * pred, n)
        A = np.c_[np.bincount(w, lt[:, 0], n), np.bincount(w, lt[:, 1], n)] / 1e3
        busy = np.bincount(w, y, n) > 200
        wr2 = float("nan")
        if kind != "none" and A[busy].any():
            c = np.linalg.lstsq(A[busy], E[busy], rcond=None)[0]
            wr2 = 1 - np.sum((E[busy] - A[busy] @ c) ** 2) / np.sum((E[busy] - E[busy].mean()) ** 2)
        sched = np.mean([s.get("conn_sched", 0.0) for s in batches]) * 1e3
        mreqs = float(np.mean([s.get("reqs", 0) for s in batches]))
        mtok = float(np.mean([s.get("tokens", 0) for s in batches]))
        if kind == "none":
            share = stall_ms = 0.0
        print(f"{name:7s} {kind:11s} {len(y):6d} {y.sum() / 1e3:7.1f} {y.sum() / (base_ratio * pred.sum()):10.3f} "
              f"{factor:7.3f} {100 * share:8.2f} {stall_ms:9.1f} {float(np.sum(y - base_ratio * pred)) / 1e3:9.1f} "
              f"{adm:8.1f} "
              f"{lt[:, 0].sum() / 1e3:12.0f} {lt[:, 1].sum() / 1e3:12.0f} {wr2:9.2f} {sched:18.3f} "
              f"{mreqs:9.2f} {mtok:10.0f}{'' if name in st.fitted or kind == 'none' else '  (not fitted)'}")
        classes.append((name, kind, by_class(batches, y, base_ratio * pred)))
        if kind == "none" or kind in launch:
            c = launch.get(kind, (0.0, 0.0))
            priced.append((name, kind, by_class(batches, y, launch_model(base_ratio * pred, *blocks(batches), c))))
        if name in st.fitted:
            per_kind.setdefault(kind, []).append((len(y), factor, share, stall_ms, launch.get(kind)))
    print_by_class(classes)
    for kind, c in launch.items():
        print(f"\n{kind}: the host's launch of each step's copies, fitted on {', '.join(st.fitted)}: "
              f"{c[0]:.1f} ms per 1,000 loaded blocks, {c[1]:.1f} ms per 1,000 stored blocks; each run "
              f"priced with it (a step takes the longer of its baseline time and its launch; no factor, "
              f"no stalls):")
        print_by_class(priced)


def fit(shift: int, profile: str = "h200-qwen3-8b-bf16") -> dict:
    cal = load_profile(profile).calibration
    admit = (cal.admit_host_ms, cal.admit_host_us_per_token)
    print(f"admissions after a decode-only batch, as the simulator prices them ({profile}): "
          f"{admit[0]:.2f} ms + {admit[1]:.3f} ms per 1k admitted tokens beyond the decode step")
    per_kind: dict[str, list] = {}
    for st in SETS:
        fit_set(st, shift, per_kind, admit)
    out = {}
    for kind, rows in per_kind.items():
        n = sum(r[0] for r in rows)
        f = sum(r[0] * r[1] for r in rows) / n
        q = sum(r[0] * r[2] for r in rows) / n
        ms = sum(r[0] * r[2] * r[3] for r in rows) / (q * n) if q else 0.0
        out[kind] = {"factor": round(f, 3), "stall_fraction": round(q, 4), "stall_ms": round(ms, 1)}
        if kind in LAUNCH_KINDS:  # the launch model replaces the factor and the stalls
            load, store = rows[0][4]  # fitted on the set's run (offbp3)
            out[kind] = {"factor": 1.0, "stall_fraction": 0.0, "stall_ms": 0.0,
                         "load_ms_per_kblock": load, "store_ms_per_kblock": store}
    rate = copy_rate()
    fitted = ", ".join(n for st in SETS for n in st.fitted)
    print(f"\nper connector (pooled over {fitted}, by steps): {out}")
    print(f"simple-cpu copy rate measured: {rate:.1f} GB/s (copyrate.json, median of loads of "
          f"16+ blocks under a GEMM loop); the profile's effective load rate is kept (docstring, 5.)")
    return {"offload_step_cost": out}


def write(path: Path, consts: dict) -> None:
    """Set each calibration key's one-line flow mapping, keeping the rest of the file."""
    text = path.read_text(encoding="utf-8")
    for key, value in consts.items():
        flow = json.dumps(value, separators=(", ", ": ")).replace('"', "")
        line = f"  {key}: {flow}  # written by bench/connector_steps.py --write"
        pat = re.compile(rf"^  {key}:.*$", re.M)
        text = pat.sub(line, text) if pat.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    path.write_text(text, encoding="utf-8")
    print(f"written: {path}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the constants into the profile")
    ap.add_argument("--shift", type=int, default=1, choices=(0, 1),
                    help="pair batch i with call i+shift's time (1: vLLM's batch queue)")
    ap.add_argument("--profile", default="h200-qwen3-8b-bf16", help="profile to write into")
    a = ap.parse_args(argv)
    consts = fit(a.shift, a.profile)
    if a.write:
        write(Path(str(resources.files("agentx.sim") / "profiles" / f"{a.profile}.yaml")), consts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
