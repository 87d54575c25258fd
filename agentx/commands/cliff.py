"""`agentx cliff`: the cache-cliff planner. For a trace and a server's KV pool (and offload
tier), the predicted prefix-cache hit rate per tier at each lane count and the lane count
where each tier's hits collapse (agentx/cache_theory/cliff.py); a table, cliff.json and cliff.png.
`--verify` runs the lane counts on either side of each cliff on the embedded simulator with
the same sizes and overlays the measured hit rates.

The sizes: `--pool-tokens` (a real server's GPU pool: vLLM logs "GPU KV cache size: N
tokens") and `--offload-tokens` (its tier), else the simulator's, from `--sim-*` (profile,
`--sim-kv-pool-tokens`, `--sim-kv-offload`, ...). Every other option is `agentx run`'s: the
replay uses the run's trace, seed, start turns, think scale and cap, context scale and
duration, so the prediction is of the run those options make."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from pydantic import field_validator

from ..config import RunConfig
from ..options import add_arguments, from_args, opt
from ..sim.config import SimConfig
from .run import SIM_EXCLUDED, SIM_GROUP, SIM_PREFIX, sim_from_args

CLIFF = "cache-cliff planner"
DEFAULT_LANES = [1, 2, 4, 8, 16, 32, 64, 128]


class CliffOptions(RunConfig):
    lanes: list[int] = opt(None, "lane counts to predict", factory=lambda: list(DEFAULT_LANES),
                           group=CLIFF, metavar="N,M,...")
    pool_tokens: int | None = opt(None, "the server's GPU KV pool in tokens (default: the "
                                  "simulator's, from --sim-*)", group=CLIFF, ge=1)
    offload_store: Literal["eager", "lazy"] | None = opt(
        None, "when the offload tier stores blocks: every new block (eager: LMCache, "
        "Mooncake) or those the GPU evicts (lazy: SimpleCPUOffload); default: the "
        "simulator's connector", group=CLIFF)
    request_s: float = opt(1.0, "a request's duration in the replay where the trace records "
                           "no api_time", group=CLIFF, gt=0.0)
    plots: bool = opt(True, "write cliff.png", group=CLIFF)
    verify: bool = opt(False, "run the lane counts on either side of each cliff on the "
                       "embedded simulator (these sizes) and overlay the measured hit rates",
                       group=CLIFF)


    @field_validator("lanes")
    @classmethod
    def _lanes(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v):
            raise ValueError("lane counts must be >= 1")
        return v


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_arguments(p, CliffOptions)
    add_arguments(p, SimConfig, prefix=SIM_PREFIX, group=SIM_GROUP, exclude=SIM_EXCLUDED)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return run(from_args(args, CliffOptions), sim_from_args(args))


def sizes(o: CliffOptions, sim: SimConfig) -> tuple[int, int | None, bool]:
    """(GPU pool tokens, tier tokens or None, eager): the flags, else the simulator's."""
    from ..sim.build import offload_tier
    from ..sim.profile import resolve

    r = resolve(sim)
    tier = offload_tier(sim, r)
    pool = o.pool_tokens or r.kv_pool_tokens
    tier_tokens = o.offload_tokens if o.offload_tokens is not None else (
        tier.capacity * tier.block_size if tier else None)
    eager = o.offload_store == "eager" if o.offload_store else bool(tier and tier.eager)
    return pool, tier_tokens or None, eager


def run(o: CliffOptions, sim: SimConfig) -> int:
    from ..cache_theory.cliff import Replay, cliffs, predict
    from ..report.console import make_console
    from ..rundir import CliffDir, trace_label
    from ..trace.load import load_traces

    console = make_console()
    traces = load_traces(o.trace)
    pool, tier, eager = sizes(o, sim)
    replay = Replay(seed=o.seed, think_scale=o.think_scale, max_think_s=o.max_think_s,
                    request_s=o.request_s, duration_s=o.duration_s or 600.0,
                    start_min=o.start_min, start_max=o.start_max,
                    context_scale=o.context_scale, shared_prefix=o.shared_prefix)
    points = [predict(traces, n, pool, tier, eager, replay) for n in sorted(set(o.lanes))]
    found = cliffs(points)
    folder = CliffDir.at(o.output_dir, trace_label(o.trace)).create()
    out = folder.path
    if o.pool_tokens:  # the simulator of --verify gets the pool that was predicted for
        sim = sim.model_copy(update={"kv_pool_tokens": o.pool_tokens})
    measured = _verify(o, sim, found, out) if o.verify else []
    doc = {"trace": o.trace, "pool_tokens": pool, "offload_tokens": tier,
           "offload_eager": eager if tier else None, "replay": replay.__dict__,
           "points": points, "cliffs": found, "measured": measured}
    folder.write_json(CliffDir.JSON, doc)
    from ..report.cliff import cliff_plot, print_cliff

    print_cliff(doc, console)
    if o.plots:
        console.print(f"plot: {cliff_plot(doc, folder / CliffDir.PNG)}")
        folder.register(CliffDir.PNG)
    console.print(f"results: {folder / CliffDir.JSON}")
    return 0


def _verify(o: CliffOptions, sim: SimConfig, found: dict, out: Path) -> list[dict]:
    """Each lane count next to a cliff, run on the embedded simulator: its achieved hit rate
    and the run's own pool-aware theory."""
    from ..run import run as run_once
    from ..targets.choice import EmbeddedChoice
    from ..targets.open import open_server

    lanes = sorted({n for c in found.values() if c for n in (c["holds_to"], c["at"])})
    rows = []
    for n in lanes:
        cfg = o.model_copy(update={"conc": n, "output_dir": str(out / f"c{n}"),
                                   "overwrite": True, "progress": False,
                                   "validation": "off"})
        run_cfg = RunConfig.model_validate(cfg.model_dump(include=set(RunConfig.model_fields)))
        s = run_once(run_cfg, open_server(EmbeddedChoice(sim, api_key=run_cfg.secret_key(),
                                                         pin=run_cfg.golden_al)))
        cache = s["cache"]
        rows.append({"lanes": n, "dir": str(out / f"c{n}"), "completed": s["completed"],
                     "hit_rate": cache.get("achieved_hit_rate"),
                     "theory_pool": cache.get("theoretical_hit_rate_pool")})
    return rows
