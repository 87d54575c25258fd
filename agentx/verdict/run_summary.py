"""A run's summary.json, from its records, its processes' results and the server's /metrics,
with the verdict on it. Its input is its own (`SummaryOptions`: what it reads of the run's
options), not the run's whole config; run.py hands it what the run measured."""
from __future__ import annotations

from dataclasses import dataclass

from ..cache_theory.tiers import theory_band, tier_theory
from ..config import RunConfig
from ..engine.drive import DriveResult
from ..golden_al import GoldenPin
from ..metrics.arrivals import arrival_summary
from ..metrics.client_bound import client_bound
from ..metrics.concurrency import concurrency_block
from ..metrics.cost import cost_block
from ..metrics.goodput import goodput
from ..metrics.outages import outages
from ..metrics.summary import dist, summarize
from ..metrics.window import Window, delivered, headline, measurement_window, server_throughput
from ..scrape.gpu import energy_block
from ..trace.model import TraceSet
from .validate import Expectations, validate


@dataclass(frozen=True)
class SummaryOptions:
    """The run options the summary and its verdict read (SummaryOptions.of(cfg))."""

    conc: int
    open_loop: bool
    max_active: int | None
    warmup: str | float  # "auto" or the fixed seconds
    ramp_up_s: float
    arrival_mode: str | None
    session_rate: float | None
    burstiness: float
    time_scale: float
    slo: dict | None
    percentiles: list
    gpus: int | None  # --gpus (or the recipe point's)
    ray: bool
    context_scale: float
    shared_prefix: str
    golden_al: GoldenPin | None
    gpu_hour_usd: float | None
    validation: str
    expect_al: float | None
    al_tolerance: float
    expect_offload: bool
    min_samples: int
    thinking: str | None
    loop_lag_threshold_ms: float
    scraped: bool  # --scrape-interval > 0

    @classmethod
    def of(cls, cfg: RunConfig) -> SummaryOptions:
        return cls(cfg.conc, cfg.open_loop(), cfg.max_active,
                   "auto" if cfg.warmup_auto() else cfg.warmup_fixed_s(), cfg.ramp_up(),
                   cfg.arrival_mode(), cfg.session_rate, cfg.burstiness, cfg.time_scale,
                   cfg.slo, cfg.percentiles, cfg.gpus, bool(cfg.ray), cfg.context_scale,
                   cfg.shared_prefix, cfg.golden_al, cfg.gpu_hour_usd, cfg.validation,
                   cfg.expect_al, cfg.al_tolerance, cfg.expect_offload, cfg.min_samples,
                   cfg.thinking, cfg.loop_lag_threshold_ms, cfg.scrape_interval_s > 0)


@dataclass
class Measured:
    """What a run measured: every process's result (one per worker), the merged records,
    the server's /metrics figures, the offload tier, the lost workers, the GPU samples."""

    results: list[DriveResult]
    n_workers: int
    records: list[dict]
    server_metrics: dict | None
    tier: dict
    lost: list[str]
    gpu_rows: list[dict]
    gpu_note: str | None = None  # why there are no GPU samples
    traces: TraceSet | None = None  # one worker: its cache model is the whole pool's
    last_turns: dict[str, int] | None = None


def run_summary(o: SummaryOptions, m: Measured, meta: dict) -> dict:
    """summary.json's content; `meta` (config, target, labels, run) as run.json holds it."""
    results, records, server_metrics = m.results, m.records, m.server_metrics
    # measurement window: from the end of warm-up to the last measured completion
    win = window(results, records)
    sm = server_metrics or {}
    # per-GPU figures divide by GPUs known, never assumed: --gpus (or the recipe point),
    # else the simulator's TP; a real server does not say (docs/metrics.md#gpus)
    gpus = o.gpus or meta["target"].get("gpus")
    s = summarize(records, window_s=win.seconds, gpus=gpus,
                  block_size=sm.get("kv_block_size"), kv_pool_tokens=sm.get("kv_pool_tokens"),
                  percentiles=o.percentiles, last_turns=m.last_turns)
    s["throughput"].update(server_throughput(server_metrics))
    s["throughput"].update(delivered(records, win.start_ns, win.stop_ns))
    s["throughput"]["headline"] = headline(s["throughput"], gpus)
    s["gpus"] = gpus
    s["gpus_source"] = "given" if o.gpus else "simulator" if gpus else None
    s["concurrency"] = concurrency_block(o.conc, o.open_loop, records, win.start_ns,
                                         win.stop_ns or win.end_ns, server_metrics)
    s["window"] = win.block(o.warmup, o.ramp_up_s,
                            (o.max_active or 0) if o.open_loop else o.conc)
    s["steady_state"] = win.steady_state
    if o.open_loop:
        s["arrivals"] = arrival_summary(
            o.arrival_mode, o.session_rate, o.burstiness, o.max_active,
            o.time_scale, [x for r in results for x in r.sessions], records, win.t_start_ns,
            win.stop_ns or max(x.t_end_ns for x in results))
    if o.slo:
        s["goodput"] = goodput(records, o.slo, s["throughput"]["window_s"])
    cpu = [x.cpu_util for x in results if x.cpu_util is not None]
    s["client"].update({
        "workers": m.n_workers,
        "backend": "ray" if o.ray else "local",
        "hosts": sorted({x.host for x in results if x.host}),
        "loop_lag_ms": dist([v for x in results for v in x.loop_lag_ms]),
        "cpu_util": max(cpu) if cpu else None,  # busiest process (1.0 = a saturated core)
        "cpu_util_per_worker": cpu,
        # ms per s the loop was ready but another process had its core (delays timestamps)
        "runqueue_wait_ms_per_s": max((x.runqueue_wait_ms_per_s or 0.0) for x in results),
        "max_in_flight": max_overlap([(r["start_ns"], r["end_ns"]) for r in records]),
        "max_sessions_active": sum(x.max_sessions_active for x in results),
        "backoff_s": round(sum(x.backoff_s for x in results), 3),  # after connect failures
    })
    s["outages"] = outages(records)  # each one event, not its connect failures one by one
    s["server_metrics"] = server_metrics
    s["cache"].update(m.tier or {})
    if s["cache"]["kv_pool_tokens"]:
        s["cache"]["working_set_exceeds_pool"] = sum(x.cache_evictions for x in results) > 0
    if m.traces is not None:  # one worker's model: the whole pool (replay_theory)
        s["cache"]["theory_band"] = theory_band(records, m.traces, s["cache"],
                                                context_scale=o.context_scale,
                                                shared_prefix=o.shared_prefix)
    s["stop_reason"] = stop_reason({x.stop_reason for x in results} | set(m.lost))
    s["golden_al"] = o.golden_al.model_dump() if o.golden_al else None  # the pinned entry
    s.update(meta)  # config, target, labels, run
    s["cost"] = cost_block(s, o.gpu_hour_usd)
    if o.validation != "off":
        s["validation"] = verdict(o, s)
    w = s["window"]
    s["energy"] = energy_block(m.gpu_rows, w["start_ns"], w["end_ns"], s["tokens"]["output"],
                               s["completed"], m.gpu_note)
    return s


def window(results: list[DriveResult], records: list[dict]) -> Window:
    return measurement_window([x.t_start_ns for x in results], [x.warmup_end_ns for x in results],
                              [x.first_done_ns for x in results], [x.t_end_ns for x in results],
                              [r["end_ns"] for r in records if r["ok"] and not r["warmup"]],
                              stops=[x.stop_ns for x in results])


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Most requests in flight at once, from the records' own start/end times."""
    ev = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def verdict(o: SummaryOptions, s: dict) -> dict:
    """summary.json's `validation` (verdict.validate) on the summary `s`."""
    extra = [s["stop_reason"]] if s["stop_reason"].startswith(("error", "aborted")) else []
    bound, warnings = client_bound(s["client"], (s.get("itl_ms") or {}).get("p50"),
                                   (s.get("ttft_ms") or {}).get("p50"), o.loop_lag_threshold_ms)
    interrupted = None
    if s["stop_reason"] == "signal":
        warm = s.get("warmup_cancelled") or 0  # every cancelled record, warm-up ones too
        interrupted = (f"stopped by a signal (SIGINT/SIGTERM); {s['completed']} requests "
                       f"completed, {s['cancelled'] + warm} cancelled in flight"
                       + (f" ({warm} of them warm-up)" if warm else ""))
    golden = o.golden_al
    exp = Expectations(synthetic_al=o.expect_al if o.expect_al is not None
                       else golden.al if golden else None,
                       golden=golden.model_dump() if golden else None,
                       al_tolerance=o.al_tolerance,
                       offload_expected=offload_configured(o.expect_offload, s),
                       min_samples=o.min_samples,
                       working_set_exceeds_pool=s["cache"].get("working_set_exceeds_pool"),
                       theoretical_hit_rate=(s["cache"]["theoretical_hit_rate_pool"]
                                             if s["cache"]["kv_pool_tokens"]
                                             else s["cache"]["theoretical_hit_rate"]),
                       tier_hit_rates=tier_theory(s["cache"]),
                       theory_band=s["cache"].get("theory_band"),
                       thinking=o.thinking,
                       # --scrape-interval 0 turned scraping off: nothing to require of it
                       **({} if o.scraped else {"required_families": []}))
    return validate(s, exp, extra_reasons=extra + bound, warnings=warnings,
                    interrupted=interrupted)


def offload_configured(expect_offload: bool, s: dict) -> bool:
    """An offload tier is there to be checked: --expect-offload, a tier size known (given,
    from the recipe or the server's /metrics), or the server reporting external hits."""
    ext = (((s.get("server_metrics") or {}).get("external_cache") or {}).get("hits")) or 0
    return expect_offload or bool(s["cache"].get("offload_tokens")) or ext > 0


STOP_PRIORITY = ("error", "aborted", "signal")


def stop_reason(reasons: set[str]) -> str:
    """The run's stop reason when its processes report several: a lane's bug first, then an
    error-rate abort, then a signal, else the first normal end (duration, max_requests)."""
    for prefix in STOP_PRIORITY:
        hit = sorted(r for r in reasons if r.startswith(prefix))
        if hit:
            return hit[0]
    return sorted(reasons)[0]
