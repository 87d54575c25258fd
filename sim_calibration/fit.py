"""Fit the h200-qwen3-8b-bf16 profile's engine and front-end constants to the real H200 runs, and
write them into the profile YAML.

    python -m sim_calibration.fit            # fit, print residuals, leave the YAML alone
    python -m sim_calibration.fit --write    # ... and write the constants into the shipped profile
    python -m sim_calibration.fit --data DIR # the runs under DIR (default: the repository's tests/data)

1. Decode (`attn_mbu`, `per_seq_overhead_us`): the KV-read efficiency measured on real engine
   steps (`fit_attn_mbu`: the decode-only steps of h200-runs-5's `cap` run, no connector), and
   the per-sequence overhead that keeps the 8-stream steady step at its anchor
   (replay.per_seq_for_anchor; docs/simulator.md §Calibration).
   Prefill (`mfu`, `attn_mfu`): the FLOP efficiencies of the dense layers and of attention,
   measured on the steps with a prefill chunk of h200-runs-7's `cap32p` and `cap32p2` (no
   connector; `fit_prefill`).
   Admission (`admit_host_ms`, `admit_host_us_per_token`): the host preparation of a batch that
   admits a request, measured on the decode-only steps before one (`cap`, `cap32p`, `cap32p2`;
   `fit_admit_host`).
2. Front end (`frontend_ms`, `frontend_us_per_prompt_token`, `frontend_servers`): for each
   capacity in SERVERS, the per-request work a + b x prompt is fitted by least squares to what
   the engine model leaves unexplained (measured TTFT - modelled TTFT outside the front end -
   modelled waiting inside it), iterated because the waiting depends on the work; requests whose
   unexplained part is outside [0, 1 s] (start-up bursts the engine queue dominates) are left
   out of that regression. The capacity kept is the one whose replay matches TTFT p50 and p90
   of the fitted runs best (sum of squared relative errors).
Fitted on the runs whose pool holds the working set (recorded hits replayed exactly): base and
spec (8 lanes) and spec32 (32 lanes); the pool-limited runs are only compared (bench/sim_vs_real.py).
"""
from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path

import numpy as np

from agentx.errors import InputError
from agentx.options import StrictModel, add_arguments, from_args, opt
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.yamlconf import config_flags

from .realruns import DATA, runs
from .replay import (
    DECODE_ANCHOR,
    figures,
    measured,
    per_seq_for_anchor,
    replay,
    replay_figures,
    timing_with,
)
from .steps import STEPS, before_admissions, decode_only, load_steps, paired

SERVERS = (0.0, 1.0, 2.0, 4.0, 8.0)  # 0 = unlimited (independent holds)
FIT_RUNS = ("base", "spec", "spec32")
STEP_RUN = "cap"  # engine steps of vLLM 0.24 on the offload runs' capped pool, no connector
STALLS = 0.95  # decode steps slower than this quantile are left out (stalls, not KV reads)
# engine steps with the prefill chunks apart (the probe's pre_* fields), no connector, 32 lanes
PREFILL_RUNS = ("cap32p", "cap32p2")
PREFILL_STEPS = Path("h200-runs-7") / "steps"
MIN_CHUNK = 4096  # prefill tokens a step needs to be priced by its FLOPs (the roofline's max)
PREFILL_STALLS = 0.97  # ... and steps slower than this quantile are left out


def _fit_below(x: np.ndarray, y: np.ndarray, quantile: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Least squares of y on x over the rows with y at most its `quantile` (stalls left out):
    (coefficients, the rows kept, R2, rms residual) over the kept rows."""
    keep = y <= np.quantile(y, quantile)
    coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
    res = y[keep] - x[keep] @ coef
    r2 = 1 - np.sum(res ** 2) / np.sum((y[keep] - y[keep].mean()) ** 2)
    return coef, keep, float(r2), float(np.sqrt(np.mean(res ** 2)))


def fit_attn_mbu(data_dir: Path, cfg: SimConfig, out=sys.stdout) -> float:
    """The KV-read efficiency of decode steps, measured: over the decode-only engine steps of
    STEP_RUN (each batch with its own compute time, steps.paired), least squares of the time
    on (1, requests, context tokens); the context slope is the time to read one token's KV, and
    `attn_mbu` = that token's KV bytes / HBM bandwidth / the slope. Its contexts reach 193k
    tokens a step, where the 8-lane runs' ~13k-token contexts left the KV reads to a fit of
    TPOT (it gave 0.984, against 0.853 measured here)."""
    batches, ms = paired(load_steps(data_dir, STEP_RUN))
    rows = [(s, t) for s, t in zip(batches, ms) if decode_only(s)]
    y = np.array([t for _, t in rows])
    x = np.array([[1.0, s["reqs"], s.get("ctx", 0)] for s, _ in rows])
    coef, keep, r2, _ = _fit_below(x, y, STALLS)
    t = timing_with(build_engine(cfg), {"attn_mbu": 1.0})  # one token's KV at full HBM bandwidth
    full_bw_ms = t.kv_tok / t.kv_bw * 1e3
    mbu = full_bw_ms / coef[2]
    print(f"decode steps ({STEP_RUN}, {int(keep.sum())} of {len(y)}): {coef[0]:.3f} ms + "
          f"{coef[1] * 1e3:.0f} us/request + {coef[2] * 1e5:.3f} ms per 100k context tokens, "
          f"R2 {r2:.3f}; attn_mbu {mbu:.3f}", file=out)
    return float(mbu)


def fit_prefill(data_dir: Path, cfg: SimConfig, out=sys.stdout) -> tuple[float, float]:
    """`mfu` and `attn_mfu`, measured: over the engine steps of PREFILL_RUNS that prefill at least
    MIN_CHUNK tokens (each batch with its own compute time, steps.paired), the time beyond the
    model's per-step and per-sequence overheads is regressed, without intercept, on the two FLOP
    terms at full peak (dense layers: 2 x params x tokens; attention: 4 x layers x heads x
    head_dim x the token pairs of the prefill chunks (`pre_attn`) and of the decodes); each
    coefficient is 1 / efficiency. Nearly all of these steps carry a full 8,192-token chunk, the
    context before the chunk from 0 to 125k tokens, so the context separates attention's share.
    Until 2026-12-04 one `mfu` (0.64) was fitted to a 1-stream TTFT of a 2,000-token prompt and
    priced these steps 6 % slow, most at short context (docs/simulator.md §Calibration)."""
    t = timing_with(build_engine(cfg), {"mfu": 1.0, "attn_mfu": 1.0})
    rows = [(s, ms) for name in PREFILL_RUNS
            for s, ms in zip(*paired(load_steps(data_dir, name, PREFILL_STEPS)))
            if s.get("pre_tokens", 0) >= MIN_CHUNK]
    fixed = [(t.overhead + t.layer_overhead + s["reqs"] * t.per_seq) * 1e3 for s, _ in rows]
    y = np.array([ms - f for (_, ms), f in zip(rows, fixed)])
    decode_pairs = [s.get("ctx", 0) - s.get("pre_ctx", 0) + s["reqs"] - s.get("pre_reqs", 0) for s, _ in rows]
    x = np.array([[t.flop_tok * s["tokens"] / t.flops * 1e3,
                   t.attn_flop * (s.get("pre_attn", 0) + d) / t.attn_flops * 1e3]
                  for (s, _), d in zip(rows, decode_pairs)])
    coef, keep, r2, rms = _fit_below(x, y, PREFILL_STALLS)
    mfu, attn = 1 / coef[0], 1 / coef[1]
    print(f"prefill steps ({', '.join(PREFILL_RUNS)}, {int(keep.sum())} of {len(y)} with "
          f"{MIN_CHUNK}+ prefill tokens): dense {coef[0] * t.flop_tok / t.flops * 1e6:.2f} "
          f"ms per 1k tokens, attention {coef[1] * t.attn_flop / t.attn_flops * 1e9:.3f} ms per M "
          f"token pairs, R2 {r2:.3f}, rms {rms:.1f} ms; mfu {mfu:.3f}, attn_mfu {attn:.3f}", file=out)
    return float(mfu), float(attn)


def fit_admit_host(data_dir: Path, out=sys.stdout) -> tuple[float, float]:
    """`admit_host_ms` and `admit_host_us_per_token`, measured: vLLM 0.24 schedules and prepares
    batch k+1 on the host while batch k runs (a batch queue of 2), so the engine call that ends a
    decode-only batch lasts as long as the next batch's preparation when that is longer. Over the
    decode-only batches of STEP_RUN and PREFILL_RUNS (no connector; 16 and 32 lanes) whose next
    batch admits a new request, least squares of the batch's time (steps.paired) on (1, the next
    batch's prefill tokens). Their time is 16 ms before a chunk under 1k tokens and 28-37 ms
    before an 8k chunk, where the decode steps themselves take 6-11 ms; a decode-only batch before
    another decode-only one is on the model (docs/simulator-calibration-log.md, "Admitting after a decode step")."""
    rows = []
    for name, folder in ((STEP_RUN, STEPS), *((n, PREFILL_STEPS) for n in PREFILL_RUNS)):
        rows += before_admissions(load_steps(data_dir, name, folder))
    x = np.array([[1.0, n / 1e3] for n, _ in rows])
    y = np.array([ms for _, ms in rows])
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    res = y - x @ [a, b]
    print(f"decode-only steps before an admission ({STEP_RUN}, {', '.join(PREFILL_RUNS)}: {len(y)}): "
          f"{a:.2f} ms + {b:.3f} ms per 1k admitted tokens, R2 {1 - res.var() / y.var():.3f}, "
          f"rms {np.sqrt(np.mean(res ** 2)):.1f} ms", file=out)
    return float(a), float(b)


def _regress(data: list, calib: dict) -> tuple[float, float, float]:
    """(a ms, b us/token, rms ms) of the front-end work given the other constants in `calib`."""
    x, y = [], []
    for cfg, recs in data:
        ok = [r for r in recs if r.get("ok")]
        a0, b0 = calib["frontend_ms"], calib["frontend_us_per_prompt_token"]
        for r, m in zip(ok, replay(cfg, recs, calib)):
            if r.get("warmup"):
                continue
            work = a0 + b0 * r["isl"] / 1e3
            wait = m["frontend_ms"] - work
            target = r["ttft_ms"] - (m["ttft_ms"] - m["frontend_ms"]) - wait
            if 0.0 <= target <= 1000.0:
                x.append(r["isl"])
                y.append(target)
    a = np.c_[np.ones(len(x)), np.asarray(x, float)]
    (c0, c1), *_ = np.linalg.lstsq(a, np.asarray(y), rcond=None)
    rms = float(np.sqrt(np.mean((a @ [c0, c1] - np.asarray(y)) ** 2)))
    return float(c0), float(c1) * 1e3, rms


def score(data: list, calib: dict) -> float:
    """Sum over runs of squared relative TTFT p50 and p90 errors."""
    s = 0.0
    for cfg, recs in data:
        real, sim = figures(measured(recs)), replay_figures(cfg, recs, calib)
        s += sum((sim[k] / real[k] - 1) ** 2 for k in ("ttft_p50", "ttft_p90"))
    return s


def fit(data_dir: Path, rounds: int = 4, out=sys.stdout) -> dict:
    loaded = {r.name: r.load() for r in runs(data_dir)}
    base_cfg = loaded["base"][0]
    mbu = fit_attn_mbu(data_dir, base_cfg, out)
    mfu, attn_mfu = fit_prefill(data_dir, base_cfg, out)
    dec = {"attn_mbu": mbu, "mfu": mfu, "attn_mfu": attn_mfu,
           "per_seq_overhead_us": per_seq_for_anchor(base_cfg, mbu, DECODE_ANCHOR)}
    dec["admit_host_ms"], dec["admit_host_us_per_token"] = fit_admit_host(data_dir, out)
    data = [(loaded[n][0], loaded[n][1]) for n in FIT_RUNS if n in loaded]
    best = None
    for servers in SERVERS:
        cal = {**dec, "frontend_ms": 0.0, "frontend_us_per_prompt_token": 0.0, "frontend_servers": servers}
        rms = 0.0
        for _ in range(rounds):
            a, b, rms = _regress(data, cal)
            cal.update(frontend_ms=a, frontend_us_per_prompt_token=b)
        s = score(data, cal)
        print(f"servers {servers:g}: frontend {cal['frontend_ms']:.2f} ms + "
              f"{cal['frontend_us_per_prompt_token']:.3f} us/token, regression rms {rms:.1f} ms, "
              f"TTFT p50/p90 score {s:.4f}", file=out)
        if best is None or s < best[0]:
            best = (s, cal)
    return best[1]


def residuals(data_dir: Path, calib: dict, out=sys.stdout) -> None:
    """Per fitted run: real vs replayed TTFT/TPOT/E2E with the fitted constants."""
    print("| run | figure | real | fitted replay | error |\n|---|---|---:|---:|---:|", file=out)
    for r in runs(data_dir):
        if r.name not in FIT_RUNS:
            continue
        cfg, recs, _ = r.load()
        real, sim = figures(measured(recs)), replay_figures(cfg, recs, calib)
        for k in real:
            print(f"| {r.name} | {k} | {real[k]:.2f} | {sim[k]:.2f} | {100 * (sim[k] / real[k] - 1):+.1f}% |",
                  file=out)


_FORMAT = {"attn_mbu": "{:.3f}", "mfu": "{:.3f}", "attn_mfu": "{:.3f}", "per_seq_overhead_us": "{:.1f}",
           "admit_host_ms": "{:.2f}", "admit_host_us_per_token": "{:.3f}",
           "frontend_ms": "{:.2f}", "frontend_us_per_prompt_token": "{:.3f}", "frontend_servers": "{:g}"}


def write_profile(path: Path, calib: dict) -> None:
    """Replace (or append to the calibration section) each fitted key's value, keeping comments."""
    text = path.read_text(encoding="utf-8")
    for k, v in calib.items():
        val = _FORMAT[k].format(v)
        pat = re.compile(rf"^(  {k}:\s*)[^\s#]+", re.M)
        if pat.search(text):
            text = pat.sub(lambda m, v=val: m.group(1) + v, text)
        else:
            text = text.rstrip("\n") + f"\n  {k}: {val}  # written by python -m sim_calibration.fit\n"
    path.write_text(text, encoding="utf-8")


class FitOptions(StrictModel):
    data: Path = opt(DATA, "folder holding h200-runs and h200-runs-2", metavar="DIR")
    write: bool = opt(False, "write the constants into the shipped profile", negatable=False)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m sim_calibration.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, FitOptions)
    ns = ap.parse_args(argv)
    try:
        if (printed := config_flags(ns)) is not None:
            sys.exit(printed)
        args = from_args(ns, FitOptions)
    except InputError as err:
        sys.exit(str(err))
    cal = fit(args.data)
    print("fit: " + ", ".join(f"{k} {v:.4g}" for k, v in cal.items()))
    residuals(args.data, cal)
    if args.write:
        path = Path(str(resources.files("agentx.sim") / "profiles" / "h200-qwen3-8b-bf16.yaml"))
        write_profile(path, cal)
        print(f"written: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
