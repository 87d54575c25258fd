"""Replay a real run's requests through the engine model on a virtual clock, and fit the
front-end terms of a profile to what that run measured.

Each recorded request (agentx requests.jsonl: `start_ns`, `isl`, `osl`, `cached_tokens`) arrives
at its recorded send time, is held for the profile's front-end time, and enters the engine
built by `build.build_engine` (the served simulator's engine) with exactly its recorded prefix
hit: its first `cached_tokens` are made resident in the KV pool just before it is submitted.
So the arrival pattern, prompt sizes, hits and output lengths are the real ones and only the
server's timing is modelled. `fit_frontend` then explains what the engine model does not:

    measured TTFT - modelled engine TTFT = frontend_ms + frontend_us_per_prompt_token x prompt

(least squares over every measured request of the runs, iterated because the front-end delay
shifts when requests reach the engine). `python -m agentx.sim.replay` prints the fit and the
replayed figures for the H200 runs in tests/data/h200-runs.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from ..dist import dist
from ..rundir import RunDir, read_jsonl
from .build import build_engine
from .config import SimConfig
from .request import SimRequest
from .timing import StepTiming


def replay(cfg: SimConfig, records: list[dict], calib: dict | None = None) -> list[dict]:
    """Modelled timings (ms) of every ok record, in record order: ttft, tpot, e2e, frontend.

    `calib` overrides fields of the profile's calibration section (what the fits vary)."""
    built = build_engine(cfg.model_copy(update={"time_scale": 1.0, "fixed_ttft_ms": None,
                                                "fixed_itl_ms": None}))
    eng, bs = built.engine, built.res.block_size
    timing = eng.timing = _timing(built, calib) if calib else built.timing
    eng.use_virtual_clock()
    recs = [r for r in records if r.get("ok")]
    t0 = min(r["start_ns"] for r in recs)
    sessions: dict[str, int] = {}
    todo = []
    for i, r in enumerate(recs):
        sid = sessions.setdefault(r["session_id"], len(sessions))
        hit_blocks = r["cached_tokens"] // bs
        # the hit prefix is the session's chain of blocks; the rest is new content
        hashes = [hash((sid, b)) for b in range(hit_blocks)]
        hashes += [hash((sid, b, i)) for b in range(hit_blocks, r["isl"] // bs)]
        arrival = r["start_ns"] - t0
        req = SimRequest(rid=str(i), prompt_len=r["isl"], max_tokens=max(1, r["osl"]),
                         block_hashes=hashes, arrival_ns=arrival)
        todo.append((arrival + int(timing.frontend_seconds(r["isl"]) * 1e9), hit_blocks, req))
    todo.sort(key=lambda x: x[0])
    nxt = 0
    while True:
        while nxt < len(todo) and todo[nxt][0] <= eng.virtual_ns:
            _, hit_blocks, req = todo[nxt]
            _make_resident(eng.pool, req.block_hashes[:hit_blocks])
            eng.submit(req)
            nxt += 1
        if not eng.step_offline():
            if nxt == len(todo):
                break
            eng.virtual_ns = max(eng.virtual_ns, todo[nxt][0])
    out = []
    for _, _, q in sorted(todo, key=lambda x: int(x[2].rid)):
        first, last = q.first_token_ns - q.arrival_ns, q.last_token_ns - q.arrival_ns
        out.append({"ttft_ms": first / 1e6, "e2e_ms": last / 1e6,
                    "tpot_ms": (last - first) / 1e6 / (q.num_out - 1) if q.num_out > 1 else None,
                    "frontend_ms": timing.frontend_seconds(q.prompt_len) * 1e3})
    return out


def _timing(built, calib: dict) -> StepTiming:
    """The step timing of `built` with some calibration constants replaced."""
    prof = built.res.profile
    prof = prof.model_copy(update={"calibration": prof.calibration.model_copy(update=calib)})
    return StepTiming(dataclasses.replace(built.res, profile=prof), built.cfg.spec_k,
                      offload=built.cfg.kv_offload)


def _make_resident(pool, hashes: list[int]) -> None:
    """Cache these blocks in the pool (as earlier turns of the session left them)."""
    new = [h for h in hashes if h not in pool.cached]
    blocks = pool.allocate(len(new)) if new else []
    if blocks is None:
        raise RuntimeError("replay: the recorded prefix hits do not fit the KV pool")
    for b, h in zip(blocks, new):
        pool.commit(b, h)
    pool.release(blocks)


def measured(records: list[dict]) -> list[dict]:
    """The records a summary counts: finished ok, not warm-up."""
    return [r for r in records if r.get("ok") and not r.get("warmup")]


def figures(rows: list[dict]) -> dict:
    """TTFT p50/p90, TPOT p50, E2E p50 (ms) of per-request rows, as the summary computes them."""
    ttft = dist([r["ttft_ms"] for r in rows])
    return {"ttft_p50": ttft["p50"], "ttft_p90": ttft["p90"],
            "tpot_p50": dist([r["tpot_ms"] for r in rows if r["tpot_ms"]])["p50"],
            "e2e_p50": dist([r["e2e_ms"] for r in rows])["p50"]}


def replay_figures(cfg: SimConfig, records: list[dict], calib: dict | None = None) -> dict:
    """`figures` of the measured requests of a replay."""
    ok = [r for r in records if r.get("ok")]
    rows = replay(cfg, records, calib)
    return figures([m for r, m in zip(ok, rows) if not r.get("warmup")])


def fit_frontend(runs: list[tuple[SimConfig, list[dict]]], calib: dict | None = None,
                 rounds: int = 4) -> dict:
    """{frontend_ms, frontend_us_per_prompt_token} that best explain the measured TTFT of every
    run beyond the engine model's own TTFT (one least-squares fit over all runs; `calib`: other
    calibration overrides to replay with)."""
    fe = {**(calib or {}), "frontend_ms": 0.0, "frontend_us_per_prompt_token": 0.0}
    for _ in range(rounds):
        x, y = [], []
        for cfg, records in runs:
            ok = [r for r in records if r.get("ok")]
            for r, m in zip(ok, replay(cfg, records, fe)):
                if not r.get("warmup"):
                    x.append(r["isl"])
                    y.append(r["ttft_ms"] - (m["ttft_ms"] - m["frontend_ms"]))
        a = np.c_[np.ones(len(x)), np.asarray(x, float)]
        (c0, c1), *_ = np.linalg.lstsq(a, np.asarray(y), rcond=None)
        fe.update(frontend_ms=float(c0), frontend_us_per_prompt_token=float(c1) * 1e3)
    return {k: fe[k] for k in ("frontend_ms", "frontend_us_per_prompt_token")}


def fit_decode(cfg: SimConfig, records: list[dict], anchor: tuple[int, int, float],
               lo: float = 0.3, hi: float = 1.0) -> dict:
    """{attn_mbu, per_seq_overhead_us}: the KV-read efficiency at which the replayed TPOT p50
    equals the measured one, with the per-sequence overhead re-derived so that the steady
    decode step of `anchor` = (streams, context, TPOT ms) stays exact. The 2k-context anchors
    alone cannot separate the two (KV reads and per-sequence work both grow with the batch);
    the long contexts of a real run can. Bisection, clipped to [lo, hi] (hi: all of HBM)."""
    built = build_engine(cfg.model_copy(update={"spec_k": 0}))
    target = figures(measured(records))["tpot_p50"]

    def constants(mbu: float) -> dict:
        t = _timing(built, {"attn_mbu": mbu, "per_seq_overhead_us": 0.0})
        b = t.new_batch()
        for _ in range(anchor[0]):
            b.add_decode(None, anchor[1], 1)
        per_seq = (anchor[2] / 1e3 - t.step_seconds(b)) / anchor[0]
        return {"attn_mbu": mbu, "per_seq_overhead_us": per_seq * 1e6}

    def tpot(mbu: float) -> float:
        return replay_figures(cfg, records, constants(mbu))["tpot_p50"]

    if tpot(hi) >= target:
        return constants(hi)
    if tpot(lo) <= target:
        return constants(lo)
    for _ in range(12):  # TPOT falls as the KV reads get faster
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tpot(mid) > target else (lo, mid)
    return constants((lo + hi) / 2)


def h200_runs(data: Path) -> list[tuple[str, SimConfig, list[dict], dict]]:
    """(name, simulator config, records, summary) of the H200 base and EAGLE3 runs."""
    import orjson

    out = []
    for name, spec in (("base", {}), ("spec", {"spec_k": 3, "synthetic_al": 2.78})):
        d = RunDir(data / name)
        recs = read_jsonl(d.requests, strict=True)[0]
        cfg = SimConfig(profile="h200-qwen3-8b-bf16", **spec)
        out.append((name, cfg, recs, orjson.loads(d.summary.read_bytes())))
    return out


# the steady decode step the per-sequence overhead is tied to: 8 streams of 2,000 + 128 tokens
# at TPOT 6.12 ms (docs/references.md §5)
DECODE_ANCHOR = (8, 2128, 6.12)


def fit_h200(data: Path) -> dict:
    """Fit the calibration terms the H200 runs determine: decode on the base run, then the front
    end on base and EAGLE3 together (replayed with the fitted decode)."""
    runs = h200_runs(data)
    dec = fit_decode(runs[0][1], runs[0][2], DECODE_ANCHOR)
    return {**dec, **fit_frontend([(c, r) for _, c, r, _ in runs], dec)}


def main(data: str = "tests/data/h200-runs") -> None:
    fit = fit_h200(Path(data))
    print("fit: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.items()))
    for name, cfg, recs, _ in h200_runs(Path(data)):
        real = figures(measured(recs))
        for label, c in (("profile", None), ("fitted", fit)):
            sim = replay_figures(cfg, recs, c)
            print(f"{name:5s} {label:8s} " + "  ".join(
                f"{k} {sim[k]:.1f} ({100 * (sim[k] / real[k] - 1):+.0f}%)" for k in sim))
        print(f"{name:5s} {'real':8s} " + "  ".join(f"{k} {v:.1f}" for k, v in real.items()))


if __name__ == "__main__":
    main(*sys.argv[1:])
