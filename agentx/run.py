"""One benchmark run as a function: `run(RunConfig, target) -> summary dict`.

Sweeps, A/B comparisons and calibration call this; the CLI is a thin wrapper. A run writes,
under `output_dir`: requests.jsonl (streamed as requests finish), metrics.jsonl (the /metrics
time series) and summary.json (self-describing: it embeds the config needed to rerun, minus
secrets). The server comes from agentx.targets: a running `Target`, or a `Server` the run
starts and stops (the command starts the embedded simulator this way); a run knows only its
URL and description.
"""
from __future__ import annotations

import asyncio
import platform
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from . import __version__, aio
from .cache_theory.tiers import resolve as resolve_tier
from .cache_theory.tiers import theory_band, tier_theory
from .client.config import basic_auth, without_credentials
from .client.http import ClientConfig, first_model, make_session, probe_error, server_version
from .config import RunConfig, run_dir
from .engine.drive import DriveResult, DriveSpec, drive, split_lanes
from .engine.lanes import LaneEngine
from .engine.workers import WorkerPool, auto_workers, usable_cores, worker_name
from .errors import InputError, OutputError, RunLost
from .metrics.arrivals import arrival_summary
from .metrics.concurrency import concurrency_block
from .metrics.cost import cost_block
from .metrics.goodput import goodput
from .metrics.outages import outages
from .metrics.summary import dist, summarize
from .metrics.window import Window, delivered, headline, measurement_window, server_throughput
from .prompt.token_model import TokenModel, builtin_model, hf_model
from .report.sessions import write_session_files
from .rundir import RunDir, merge_record_files, read_jsonl, write_json
from .scrape.gpu import energy_block
from .scrape.server_metrics import kv_pool
from .session_plan import split_count, trace_times
from .targets.base import Server, Target, UrlServer
from .trace.load import load_traces
from .trace.model import TraceSet
from .urls import redact_url, scrub

STOP_NOTICE = "\nagentx: stopping — draining in-flight requests (Ctrl-C again to cancel)"


def run(cfg: RunConfig, target: Target | Server | None = None,
        ready: Callable[[], Awaitable[int]] | None = None) -> dict:
    """Run synchronously (own event loop; uvloop when installed). Returns the summary.
    `target`: the server, running (a Target) or started here and stopped after the run (a
    Server, e.g. targets.embedded.EmbeddedSim); default: the server at cfg.base_url.
    `ready` (one process, no workers): awaited once everything is built, it returns the
    perf_counter_ns instant to start at (e.g. A/B sides starting together)."""
    if cfg.output_dir is None:  # fixed once, so every check and write sees the same path
        cfg = cfg.model_copy(update={"output_dir": str(run_dir(cfg).path)})
    RunDir(cfg.output_dir).check(cfg.overwrite)  # before a server starts
    if target is None:
        if cfg.base_url is None:
            raise InputError("command line", "no server to measure: give --base-url",
                             field="--base-url")
        target = UrlServer(cfg.base_url)
    # the directory is this run's from here to its end (rundir.RunDir.claim): a second run
    # into it refuses, `agentx report` leaves it alone; a start that fails or is interrupted
    # before any record leaves no folder
    rd = RunDir(cfg.output_dir).claim(cfg.overwrite)
    ended = False
    try:
        if isinstance(target, Target):
            summary = aio.run(run_async(cfg, target, ready=ready))
        else:
            with target as t:
                summary = aio.run(run_async(cfg, t, ready=ready))
        ended = True
        return summary
    finally:
        rd.release(abandon=not ended)


async def run_async(cfg: RunConfig, target: Target,
                    ready: Callable[[], Awaitable[int]] | None = None) -> dict:
    base_url = target.url
    traces = load_traces(cfg.trace)  # parse errors surface here, before any traffic
    if cfg.arrival_mode() == "trace":
        trace_times(traces)  # a trace without session start times fails here
    out = run_dir(cfg).path
    run_salt = secrets.token_hex(8)
    run_ns = f"seed{cfg.seed}" if cfg.warm_cache else run_salt
    # one Authorization on every request: --api-key (Bearer), else the URL's user:password
    # (Basic), else $OPENAI_API_KEY; docs/reliability.md#credentials
    key = cfg.secret_key() if cfg.api_key is not None or not basic_auth(base_url) else None
    if cfg.api_key is not None and basic_auth(base_url):
        print("agentx: warning: --api-key is sent (Bearer) on every request; the user:password "
              "in --base-url is not (a request carries one Authorization header)", file=sys.stderr)
        base_url = without_credentials(base_url)
    ccfg = ClientConfig(base_url=base_url, model=cfg.model or "", timeout_s=cfg.timeout_s,
                        request_timeout_s=cfg.request_timeout_s,
                        api_key=key, connect_timeout_s=cfg.connect_timeout_s,
                        thinking=cfg.thinking, extra_body=cfg.extra_body,
                        cache_salt=None if (cfg.warm_cache or not cfg.cache_salt) else run_salt)
    async with make_session(ccfg, 1) as session:
        try:
            model, max_model_len = await first_model(session, base_url, cfg.connect_timeout_s)
        except Exception as exc:
            raise InputError(redact_url(base_url),
                             scrub(probe_error(exc, "GET /v1/models", cfg.connect_timeout_s),
                                   base_url), field="--base-url") from None
        ccfg.model = cfg.model or model
        version = await server_version(session, base_url, cfg.connect_timeout_s)
        tm, token_info = await _token_model(cfg, session, base_url, ccfg.model,
                                            target.builtin_tokens)
    rd = RunDir(out)  # claimed by run()
    t_wall0 = time.time()
    config = cfg.public()
    if target.options is not None:  # a simulator started for the run: its options, to rerun
        config["sim"] = target.options
    meta = {"config": config, "target": target.identity(ccfg.model, version),
            "labels": dict(cfg.labels),
            "run": _run_meta(ccfg, base_url, target.embedded, max_model_len, token_info,
                             t_wall0)}
    # what was run, on what, written before any traffic: a killed run keeps it (report reads it)
    rd.write_run_json(meta)
    scraper = _scraper(base_url, cfg.scrape_interval_s, ccfg.headers(), rd.metrics,
                       cfg.connect_timeout_s)
    pool_tokens = None
    if scraper:
        await scraper.start()
        if scraper.first is not None:
            pool_tokens = kv_pool(scraper.first).get("kv_pool_tokens")
    gpu = _gpu_sampler(cfg, base_url, rd.metrics)  # after the scraper: both append there
    if not isinstance(gpu, str):
        gpu.start()
    tier = resolve_tier(cfg.offload_tokens, scraper.first if scraper else None, target.connector)
    block_tokens = traces.block_size * cfg.context_scale
    pool_blocks = int(pool_tokens / block_tokens) if pool_tokens else None
    tier_blocks = int(tier["offload_tokens"] / block_tokens) if tier["offload_tokens"] else None
    n_workers = resolve_workers(cfg, target.local_cores)
    pooled = n_workers > 1 or bool(cfg.ray)  # records per worker, merged at the end
    lanes = split_lanes(cfg.conc, n_workers)
    budgets = split_count(cfg.max_requests, [len(x) for x in lanes])
    requests_path = rd.requests
    specs = [DriveSpec(run=cfg, client=ccfg, lanes=lanes[w],
                       max_requests=budgets[w],
                       records_path=str(rd.worker(w) if pooled
                                        else requests_path),
                       token_info=token_info, run_ns=run_ns, max_model_len=max_model_len,
                       pool_blocks=(pool_blocks * len(lanes[w]) // cfg.conc) if pool_blocks
                       else None, worker=w,
                       offload_blocks=(tier_blocks * len(lanes[w]) // cfg.conc) if tier_blocks
                       else None, offload_eager=bool(tier["offload_eager"]))
             for w in range(n_workers)]
    if pooled:  # the manifest names every file of the run (rundir.py)
        rd.register(*(Path(s.records_path).name for s in specs))
    results: list[DriveResult] = []
    lost: list[str] = []  # workers that gave no result, with the lanes they held
    merge_failed: OutputError | None = None
    try:
        if not pooled:
            results = [await _drive_here(cfg, specs[0], tm, traces, ready)]
        else:
            if ready:  # workers start together on their own gate, once past this one
                await ready()
            results, lost = await _drive_workers(cfg, specs)
    finally:
        if scraper:
            await scraper.stop()
        if not isinstance(gpu, str):
            await asyncio.to_thread(gpu.stop)
        if pooled:
            merge_failed = _merge_workers(cfg, specs, requests_path, results)
    # a records file that could not be written (disk full): no summary of a partial record
    failed = next(filter(None, map(OutputError.found_in, [x.stop_reason for x in results]
                                   + lost)), None) or merge_failed
    if failed:
        raise OutputError(failed.path, failed.reason, f"{failed.kept}; agentx report {out} "
                          "summarizes them once there is room")
    if lost and not results:
        raise RunLost(f"agentx: every worker was lost (above), no summary; agentx report {out} "
                      "summarizes the records they wrote")
    records, bad = read_jsonl(requests_path)
    if bad:
        print(f"agentx: warning: skipped {bad} unreadable line(s) of {requests_path}",
              file=sys.stderr)
    last_turns = traces.last_turns()
    summary = _summary(cfg, results, n_workers, records, scraper, meta, ccfg, tier, lost,
                       traces if not pooled else None, last_turns)
    win = summary["window"]
    summary["energy"] = energy_block([] if isinstance(gpu, str) else gpu.rows, win["start_ns"],
                                     win["end_ns"], summary["tokens"]["output"],
                                     summary["completed"], gpu if isinstance(gpu, str) else None)
    write_json(rd.summary, summary)
    write_session_files(out, records, last_turns)
    summary["output_dir"] = str(out)
    return summary


def resolve_workers(cfg: RunConfig, local_cores: int = 0) -> int:
    """--workers as a number; `auto` keeps `local_cores` for a server on this machine."""
    if cfg.workers == "auto":
        if cfg.ray:
            from .engine.ray_pool import cluster_cpus, connect

            cores, where = cluster_cpus(connect(cfg.ray)), "CPUs in the Ray cluster"
            n = auto_workers(cfg.conc, cores=cores)
        else:
            cores, where = usable_cores(), "usable cores"
            n = auto_workers(cfg.conc, cores=cores, reserve=local_cores)
        kept = f", {local_cores} kept for the server beside it" if local_cores else ""
        print(f"agentx: --workers auto -> {n} process(es) for {cfg.conc} lanes "
              f"({cores} {where}{kept})", file=sys.stderr)
        return n
    return min(cfg.workers, cfg.conc)


async def _drive_here(cfg: RunConfig, spec: DriveSpec, tm: TokenModel, traces: TraceSet,
                      ready: Callable[[], Awaitable[int]] | None = None) -> DriveResult:
    """One process: the engine runs on this event loop, progress reads its counters."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    prog: list[asyncio.Task] = []

    def on_engine(engine: LaneEngine) -> None:
        aio.install_stop_signals(loop, engine.request_stop, STOP_NOTICE)
        if cfg.progress:
            prog.append(asyncio.create_task(_progress(cfg, engine.stats, done)))

    try:
        return await drive(spec, on_engine, tm, traces, ready)
    finally:
        done.set()
        if prog:
            await prog[0]
        aio.remove_stop_signals(loop)


def _merge_workers(cfg: RunConfig, specs: list[DriveSpec], requests_path: Path,
                   results: list[DriveResult]) -> OutputError | None:
    """The workers' record files into requests.jsonl; a full disk leaves them as they were."""
    try:
        # workers end their warm-ups apart: the run's is the last (auto warm-up only)
        _, bad = merge_record_files([s.records_path for s in specs], requests_path,
                                    warm_until_ns=max(x.warmup_end_ns for x in results)
                                    if results and cfg.warmup_auto() else None)
    except OutputError as e:
        return e
    if bad:
        print(f"agentx: warning: skipped {bad} unreadable line(s) of the workers' record "
              "files (a worker killed while writing)", file=sys.stderr)
    return None


async def _drive_workers(cfg: RunConfig, specs: list[DriveSpec]
                         ) -> tuple[list[DriveResult], list[str]]:
    """The workers' results, and each lost worker (its lanes and why) as the run's stop
    reason: `error: worker w1 (lanes 1, 3) lost: ...` (none when a signal stopped the run:
    it is `signal`, and interrupted). One stderr line per lost worker."""
    if cfg.ray:
        from .engine.ray_pool import RayPool

        pool: Any = RayPool(cfg.ray, specs)
    else:
        pool = WorkerPool(specs)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    # workers get SIGINT from the terminal themselves; the parent forwards it regardless
    aio.install_stop_signals(loop, pool.request_stop, STOP_NOTICE)
    prog = asyncio.create_task(_progress(cfg, pool.stats, done)) if cfg.progress else None
    # workers and Ray actors start together once every one is ready (workers.StartGate,
    # ray_pool.RayPool._open_gate)
    pool.start()
    try:
        results = await pool.wait()
    finally:
        done.set()
        if prog:
            await prog
        aio.remove_stop_signals(loop)
    lost = [v if v.startswith("worker w") else f"{worker_name(specs[w])} lost: {v}"  # Ray's
            for w, v in sorted(pool.errors.items())]
    for why in lost:
        print(f"agentx: {why}", file=sys.stderr)
    signalled = getattr(pool, "signalled", False)  # RayPool: never
    if signalled and not results:
        raise KeyboardInterrupt  # interrupted before any worker could report: exit 130
    return results, [] if signalled else [f"error: {why}" for why in lost]


async def _progress(cfg: RunConfig, stats: Any, done: asyncio.Event) -> None:
    from .report.progress import show_progress
    from .report.target import load_text

    side = cfg.labels.get("ab_side")  # an A/B side: its lines say which (agentx ab)
    tag = f"side {side} run {cfg.labels.get('repeat', '1')}:" if side else ""
    await show_progress(stats, done, f"{tag + ' ' if tag else ''}agentx {cfg.trace} "
                        f"{load_text(cfg.public(), short=True)}", tag=tag)


async def _token_model(cfg: RunConfig, session: Any, base_url: str, model: str,
                       builtin_tokens: bool) -> tuple[TokenModel, dict]:
    kw = {"enable_thinking": cfg.thinking == "on"} if cfg.thinking else None
    if cfg.tokenizer:
        if not Path(cfg.tokenizer).is_dir():
            raise InputError(cfg.tokenizer, "not a directory with a Hugging Face tokenizer",
                             field="--tokenizer")
        tm = hf_model(cfg.tokenizer, kw)
        return tm, {"mode": "hf", "tokenizer": cfg.tokenizer, "overhead": tm.overhead,
                    "generation_prompt": tm.generation_prompt, "build": tm.build}
    if builtin_tokens:  # the server tokenizes as agentx's built-in model (the simulator)
        return builtin_model(), {"mode": "builtin"}
    from .client.tokenize import server_token_model

    try:
        # a dozen small /tokenize calls: bounded, so a server that hangs there cannot stall
        # start-up (the fallback below is reported in summary.run.tokens)
        return await asyncio.wait_for(server_token_model(session, base_url, model, kw),
                                      3 * cfg.connect_timeout_s)
    except Exception as exc:  # server without /tokenize: word = token assumption, reported
        return builtin_model(), {"mode": "assumed", "reason": f"/tokenize unavailable: {exc}"[:200]}


def _scraper(base_url: str, interval: float, headers: dict, out_path: Path,
             timeout_s: float = 10.0):
    """Scrapes use their own session so they never queue behind benchmark requests; each is
    appended to `out_path` (metrics.jsonl) as it is taken."""
    if interval <= 0:
        return None
    from .scrape.process import ScraperProcess

    auth = {k: v for k, v in headers.items() if k == "Authorization"}
    return ScraperProcess(base_url.rstrip("/") + "/metrics", interval_s=interval, headers=auth,
                         timeout_s=timeout_s,
                         out_path=out_path)


def _gpu_sampler(cfg: RunConfig, base_url: str, out_path: Path):
    """NVML sampling of this machine's GPUs at the scrape cadence, or why not (a str)."""
    from .scrape.gpu import GpuSampler, say_once, server_on_this_host

    if cfg.scrape_interval_s <= 0:
        return "--scrape-interval 0 turns sampling off"
    if not server_on_this_host(base_url):
        return say_once(f"the server ({redact_url(base_url)}) is not on this machine, whose "
                        "GPUs NVML would read")
    return GpuSampler.open(cfg.scrape_interval_s, cfg.gpu_indices, out_path)


def _run_meta(ccfg: ClientConfig, base_url: str, embedded: bool, max_model_len: int | None,
              token_info: dict, t_wall0: float) -> dict:
    return {"agentx_version": __version__, "started_at": t_wall0, "target": redact_url(base_url),
            "embedded_simulator": embedded, "model": ccfg.model,
            "max_model_len": max_model_len, "tokens": token_info,
            "cache_salt": bool(ccfg.cache_salt), "python": platform.python_version(),
            "host": platform.node()}


def _summary(cfg: RunConfig, results: list[DriveResult], n_workers: int, records: list[dict],
             scraper: Any, meta: dict, ccfg: ClientConfig, tier: dict | None = None,
             lost: list[str] = (), traces: TraceSet | None = None,
             last_turns: dict[str, int] | None = None) -> dict:
    # measurement window: from the end of warm-up to the last measured completion
    win = _window(results, records)
    server_metrics = scraper.compute(ccfg.model) if scraper else None
    sm = server_metrics or {}
    # per-GPU figures divide by GPUs known, never assumed: --gpus (or the recipe point),
    # else the simulator's TP; a real server does not say (docs/metrics.md#gpus)
    gpus = cfg.gpus or meta["target"].get("gpus")
    s = summarize(records, window_s=win.seconds, gpus=gpus,
                  block_size=sm.get("kv_block_size"), kv_pool_tokens=sm.get("kv_pool_tokens"),
                  percentiles=cfg.percentiles, last_turns=last_turns)
    s["throughput"].update(server_throughput(server_metrics))
    s["throughput"].update(delivered(records, win.start_ns, win.stop_ns))
    s["throughput"]["headline"] = headline(s["throughput"], gpus)
    s["gpus"] = gpus
    s["gpus_source"] = "given" if cfg.gpus else "simulator" if gpus else None
    s["concurrency"] = concurrency_block(cfg.conc, cfg.open_loop(), records, win.start_ns,
                                         win.stop_ns or win.end_ns, server_metrics)
    s["window"] = win.block("auto" if cfg.warmup_auto() else cfg.warmup_fixed_s(), cfg.ramp_up(),
                            (cfg.max_active or 0) if cfg.open_loop() else cfg.conc)
    s["steady_state"] = win.steady_state
    if cfg.open_loop():
        s["arrivals"] = arrival_summary(
            cfg.arrival_mode(), cfg.session_rate, cfg.burstiness, cfg.max_active,
            cfg.time_scale, [x for r in results for x in r.sessions], records, win.t_start_ns,
            win.stop_ns or max(x.t_end_ns for x in results))
    if cfg.slo:
        s["goodput"] = goodput(records, cfg.slo, s["throughput"]["window_s"])
    cpu = [x.cpu_util for x in results if x.cpu_util is not None]
    s["client"].update({
        "workers": n_workers,
        "backend": "ray" if cfg.ray else "local",
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
    s["cache"].update(tier or {})
    if s["cache"]["kv_pool_tokens"]:
        s["cache"]["working_set_exceeds_pool"] = sum(x.cache_evictions for x in results) > 0
    if traces is not None:  # one worker's model: the whole pool (replay_theory)
        s["cache"]["theory_band"] = theory_band(records, traces, s["cache"],
                                                context_scale=cfg.context_scale,
                                                shared_prefix=cfg.shared_prefix)
    s["stop_reason"] = stop_reason({x.stop_reason for x in results} | set(lost))
    s["golden_al"] = cfg.golden_al.model_dump() if cfg.golden_al else None  # the pinned entry
    s.update(meta)  # config, target, labels, run
    s["cost"] = cost_block(s, cfg.gpu_hour_usd)
    if cfg.validation != "off":
        s["validation"] = _validate(cfg, s)
    return s


def _window(results: list[DriveResult], records: list[dict]) -> Window:
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


def _validate(cfg: RunConfig, s: dict) -> dict:
    from .metrics.client_bound import client_bound
    from .verdict.validate import Expectations, validate

    extra = [s["stop_reason"]] if s["stop_reason"].startswith(("error", "aborted")) else []
    bound, warnings = client_bound(s["client"], (s.get("itl_ms") or {}).get("p50"),
                                   (s.get("ttft_ms") or {}).get("p50"), cfg.loop_lag_threshold_ms)
    interrupted = None
    if s["stop_reason"] == "signal":
        warm = s.get("warmup_cancelled") or 0  # every cancelled record, warm-up ones too
        interrupted = (f"stopped by a signal (SIGINT/SIGTERM); {s['completed']} requests "
                       f"completed, {s['cancelled'] + warm} cancelled in flight"
                       + (f" ({warm} of them warm-up)" if warm else ""))
    golden = cfg.golden_al
    exp = Expectations(synthetic_al=cfg.expect_al if cfg.expect_al is not None
                       else golden.al if golden else None,
                       golden=golden.model_dump() if golden else None,
                       al_tolerance=cfg.al_tolerance,
                       offload_expected=offload_configured(cfg, s),
                       min_samples=cfg.min_samples,
                       working_set_exceeds_pool=s["cache"].get("working_set_exceeds_pool"),
                       theoretical_hit_rate=(s["cache"]["theoretical_hit_rate_pool"]
                                             if s["cache"]["kv_pool_tokens"]
                                             else s["cache"]["theoretical_hit_rate"]),
                       tier_hit_rates=tier_theory(s["cache"]),
                       theory_band=s["cache"].get("theory_band"),
                       thinking=cfg.thinking,
                       # --scrape-interval 0 turned scraping off: nothing to require of it
                       **({} if cfg.scrape_interval_s > 0 else {"required_families": []}))
    return validate(s, exp, extra_reasons=extra + bound, warnings=warnings,
                    interrupted=interrupted)


def offload_configured(cfg: RunConfig, s: dict) -> bool:
    """An offload tier is there to be checked: --expect-offload, a tier size known (given,
    from the recipe or the server's /metrics), or the server reporting external hits."""
    ext = (((s.get("server_metrics") or {}).get("external_cache") or {}).get("hits")) or 0
    return cfg.expect_offload or bool(s["cache"].get("offload_tokens")) or ext > 0


STOP_PRIORITY = ("error", "aborted", "signal")


def stop_reason(reasons: set[str]) -> str:
    """The run's stop reason when its processes report several: a lane's bug first, then an
    error-rate abort, then a signal, else the first normal end (duration, max_requests)."""
    for prefix in STOP_PRIORITY:
        hit = sorted(r for r in reasons if r.startswith(prefix))
        if hit:
            return hit[0]
    return sorted(reasons)[0]
