"""Drive both sides of an A/B comparison through `agentx.run` and compare them.

Each side's runs use the same options (trace, seed, lanes, duration; repeat i uses seed + i - 1
on both sides) and differ only in the server. Every run sends its own cache salt (a fresh one
per run), so neither side can hit the other's cache, even on one server. Sides run one after
the other (A's repeats, then B's), alternately with --interleave, or at the same time against
two servers with --parallel. Results: `<out>/a/<i>/`, `<out>/b/<i>/` (a run directory each),
`ab.json`, and `ab_cdf.png`.
"""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..config import RunConfig
from ..engine.workers import StartGate
from ..metrics.summary import measured
from ..records import read_records
from ..run import run
from ..rundir import ABDir, RunDir, trace_label
from ..targets.base import Target
from .config import ABConfig
from .sides import Side, open_side
from .stats import ab_metrics, compare, point_estimates, side_data, too_thin


def run_ab(cfg: ABConfig) -> dict:
    """Run both sides, write ab.json and the CDF plot; returns the ab.json document."""
    folder = ABDir.at(cfg.output_dir, trace_label(cfg.trace), f"c{cfg.conc}")
    out = folder.create(cfg.overwrite).path
    summaries: dict[str, list[dict]] = {"a": [], "b": []}
    sides: dict[str, Side] = {}
    with contextlib.ExitStack() as stack:
        def side(name: str) -> Side:
            if name not in sides:
                sides[name] = stack.enter_context(open_side(name, getattr(cfg, name), cfg, out))
            return sides[name]

        if cfg.parallel:
            both = stack.enter_context(_Both())
            for i in range(1, cfg.repeats + 1):
                a, b = side("a"), side("b")
                pair = both.run((_config(cfg, a, i, out), a.target),
                                (_config(cfg, b, i, out), b.target))
                summaries["a"].append(pair[0])
                summaries["b"].append(pair[1])
        else:
            for name, i in cfg.schedule():
                if not cfg.interleave and name == "b" and "a" in sides:
                    _stop_servers(sides)  # A is done: free its server before B's starts
                s = side(name)
                summaries[name].append(run(_config(cfg, s, i, out), s.target))
        doc = _document(cfg, out, sides, summaries)
    from .plot import cdf_plot

    doc["plot"] = str(cdf_plot(doc, folder / ABDir.CDF))
    folder.register(ABDir.CDF)
    folder.write_json(ABDir.JSON, doc)
    return doc


def _config(cfg: ABConfig, s: Side, repeat: int, out: Path) -> RunConfig:
    t = s.target
    return cfg.side_config(s.name, repeat, t.url, t.model, out, t.offload_tokens)


def _stop_servers(sides: dict[str, Side]) -> None:
    """Stop the launched servers opened so far (stopping is idempotent: the context's exit
    stops them again harmlessly)."""
    for s in sides.values():
        s.server.stop()


class _Both:
    """Both sides at once, each in its own client process (as two `agentx run`): sharing one
    event loop, the side whose tasks were created first would be served first at every tick.
    They start their lanes together, once both are built: otherwise the start-up of one
    (imports, traces, scraper process, every lane's first session) falls inside the other's
    first seconds. The two processes (and the barrier's manager) serve every repeat: spawning
    them again costs each repeat ~1 s of imports per side before anything is measured."""

    def __enter__(self) -> _Both:
        ctx = multiprocessing.get_context("spawn")
        self._stack = contextlib.ExitStack()
        self._manager = self._stack.enter_context(ctx.Manager())
        self._ex = self._stack.enter_context(ProcessPoolExecutor(2, mp_context=ctx))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def run(self, side_a: tuple[RunConfig, Target], side_b: tuple[RunConfig, Target]) -> list[dict]:
        gate = self._manager.Barrier(2)  # a fresh one: a side that failed breaks it
        futures = [self._ex.submit(_run_side, *side_a, gate), self._ex.submit(_run_side, *side_b, gate)]
        return [f.result() for f in futures]


GATE_TIMEOUT_S = 300.0


def _run_side(cfg: RunConfig, target: Target, gate) -> dict:
    """One side of --parallel: `run` that waits for the other side at the start. A side that
    fails before it breaks the gate, so the other starts instead of waiting for it."""

    async def ready() -> int:
        with contextlib.suppress(threading.BrokenBarrierError):
            await asyncio.to_thread(gate.wait, GATE_TIMEOUT_S)
        return time.perf_counter_ns() + int(StartGate.MARGIN_S * 1e9)  # as local workers

    try:
        return run(cfg, target, ready)
    except BaseException:
        with contextlib.suppress(Exception):
            gate.abort()
        raise


def _side_summary(s: Side | None, runs: list[dict]) -> dict:
    v = [(r.get("validation") or {}).get("verdict") for r in runs]
    return {**(s.public() if s else {}), "runs": [r["output_dir"] for r in runs],
            "validation": v, "completed": sum(r["completed"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "window_s": sum(r["throughput"]["window_s"] for r in runs)}


def _document(cfg: ABConfig, out: Path, sides: dict[str, Side],
              summaries: dict[str, list[dict]]) -> dict:
    data, by_run = {}, {}
    for name, runs in summaries.items():
        per = [read_records(Path(r["output_dir"]) / RunDir.REQUESTS) for r in runs]
        data[name] = side_data([rec for recs in per for rec in recs],
                               sum(r["throughput"]["window_s"] for r in runs),
                               runs=[i for i, recs in enumerate(per) for _ in recs])
        # each repeat alone: the run-to-run spread the two-stage bootstrap accounts for
        by_run[name] = [point_estimates(side_data(recs, r["throughput"]["window_s"])) if measured(recs)
                        else None for recs, r in zip(per, runs)]
    metrics = compare(data["a"], data["b"], replicates=cfg.bootstrap, seed=cfg.seed,
                      min_sessions=cfg.min_sessions, min_requests=cfg.min_samples,
                      metrics=ab_metrics(cfg.percentiles))
    thin = {name: why for name in ("a", "b")
            if (why := too_thin(data[name], cfg.min_sessions, cfg.min_samples))}
    return {"a": {**_side_summary(sides.get("a"), summaries["a"]), "label": cfg.side_name("a")},
            "b": {**_side_summary(sides.get("b"), summaries["b"]), "label": cfg.side_name("b")},
            "insufficient": {k.upper(): v for k, v in thin.items()},
            "sessions": {"a": data["a"].n_sessions, "b": data["b"].n_sessions},
            "bootstrap": {"replicates": cfg.bootstrap, "level": 0.95,
                          "resampled": "runs, then sessions" if cfg.repeats > 1 else "sessions",
                          "seed": cfg.seed},
            "per_run": by_run,
            "metrics": metrics, "warnings": _warnings(cfg), "output_dir": str(out),
            "config": cfg.public()}


def _warnings(cfg: ABConfig) -> list[str]:
    """What the verdicts cannot cover with these settings."""
    if cfg.repeats > 1:
        return []
    return ["one run a side: the intervals resample that run's sessions, so they do not cover "
            "run-to-run variance (a server's batching pattern can last a whole run: identical "
            "servers were called different in 12 of 50 such 4 s A/Bs, docs/ab.md); give "
            "--repeats 3 or more before publishing a verdict"]
