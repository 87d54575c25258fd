"""One benchmark run as a function: `run(RunConfig, target) -> summary dict`.

Sweeps, A/B comparisons and calibration call this; the CLI is a thin wrapper. A run writes,
under `output_dir`: requests.jsonl (streamed as requests finish), metrics.jsonl (the /metrics
time series) and summary.json (self-describing: it embeds the config needed to rerun, minus
secrets). The server comes from agentx.targets: a running `Target`, or a `Server` the run
starts and stops; a run knows only its URL and description.

This module wires the phases, each with its own narrow input: the probe (client.probe: the
server's facts, credentials and token model), the instruments (scrape.instruments: /metrics
scraper and GPU sampler), the drive (engine.lanes_run over engine.drive's DriveShare, which
carries the engine's slice of the config) and the summary with its verdict
(verdict.run_summary, from SummaryOptions).
"""
from __future__ import annotations

import platform
import secrets
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

from . import __version__, aio
from .cache_theory.tiers import resolve as resolve_tier
from .client.config import ClientConfig
from .client.probe import ServerFacts, credentials, probe_server
from .config import RunConfig, run_dir
from .engine.drive import DriveShare, workload_of
from .engine.lanes_run import Driven, Progress, drive_lanes, merge_workers, shares, worker_count
from .errors import InputError, OutputError, RunLost
from .report.sessions import write_session_files
from .rundir import RunDir, read_jsonl, write_json
from .scrape.instruments import Instruments
from .session_plan import trace_times
from .targets.base import Server, Target
from .targets.choice import UrlChoice
from .targets.open import open_server
from .trace.load import load_traces
from .urls import redact_url
from .verdict.run_summary import Measured, SummaryOptions, run_summary


def run(cfg: RunConfig, target: Target | Server | None = None,
        ready: Callable[[], Awaitable[int]] | None = None) -> dict:
    """Run synchronously (own event loop; uvloop when installed). Returns the summary.
    `target`: the server, running (a Target) or started here and stopped after the run (a
    Server, from targets.open.open_server); default: the server at cfg.base_url.
    `ready` (one process, no workers): awaited once everything is built, it returns the
    perf_counter_ns instant to start at (e.g. A/B sides starting together)."""
    if cfg.output_dir is None:  # fixed once, so every check and write sees the same path
        cfg = cfg.model_copy(update={"output_dir": str(run_dir(cfg).path)})
    RunDir(cfg.output_dir).check(cfg.overwrite)  # before a server starts
    if target is None:
        if cfg.base_url is None:
            raise InputError("command line", "no server to measure: give --base-url",
                             field="--base-url")
        target = open_server(UrlChoice(cfg.base_url))
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
    """The run into cfg.output_dir (run() fixes and claims it)."""
    out = Path(str(cfg.output_dir))
    rd = RunDir(out)
    traces = load_traces(cfg.trace)  # parse errors surface here, before any traffic
    if cfg.arrival_mode() == "trace":
        trace_times(traces)  # a trace without session start times fails here
    run_salt = secrets.token_hex(8)
    client = credentials(client_config(cfg, target.url, run_salt), cfg.api_key is not None,
                         cfg.secret_key)
    facts = await probe_server(client, cfg.tokenizer, target.builtin_tokens)
    client = facts.client
    config = cfg.public()
    if target.options is not None:  # a simulator started for the run: its options, to rerun
        config["sim"] = target.options
    meta = {"config": config, "target": target.identity(client.model, facts.version),
            "labels": dict(cfg.labels), "run": _run_meta(facts, target.embedded, time.time())}
    # what was run, on what, written before any traffic: a killed run keeps it (report reads it)
    rd.write_run_json(meta)
    n_workers = worker_count(cfg.workers, cfg.conc, cfg.ray, target.local_cores)
    in_workers = n_workers > 1 or bool(cfg.ray)  # records per worker, merged at the end
    driven, specs = Driven(), []
    try:
        async with Instruments(client.base_url, cfg.scrape_interval_s, client.headers(),
                               rd.metrics, cfg.connect_timeout_s, cfg.gpu_indices) as inst:
            tier = resolve_tier(cfg.offload_tokens, inst.first, target.connector)
            block = traces.block_size * cfg.context_scale
            whole = DriveShare(
                workload_of(cfg, f"seed{cfg.seed}" if cfg.warm_cache else run_salt), client,
                list(range(cfg.conc)), cfg.max_requests, str(rd.requests), facts.token_info,
                facts.max_model_len, int(inst.pool_tokens / block) if inst.pool_tokens else None,
                offload_eager=bool(tier["offload_eager"]))
            specs = shares(whole, cfg.conc, n_workers, rd.worker if in_workers else None,
                           int(tier["offload_tokens"] / block) if tier["offload_tokens"] else None)
            if in_workers:  # the manifest names every file of the run (rundir.py)
                rd.register(*(Path(s.records_path).name for s in specs))
            await drive_lanes(specs, facts.token_model, traces, driven, in_workers=in_workers,
                              ray=cfg.ray, progress=_progress(cfg), ready=ready)
    finally:
        if in_workers and specs:
            driven.merge_failed = merge_workers(specs, rd.requests, driven.results,
                                                cfg.warmup_auto())
    failed = driven.failed()  # a records file not written (disk full): no summary of a part
    if failed:
        raise OutputError(failed.path, failed.reason, f"{failed.kept}; agentx report {out} "
                          "summarizes them once there is room")
    if driven.lost and not driven.results:
        raise RunLost(f"agentx: every worker was lost (above), no summary; agentx report {out} "
                      "summarizes the records they wrote")
    records, bad = read_jsonl(rd.requests)
    if bad:
        print(f"agentx: warning: skipped {bad} unreadable line(s) of {rd.requests}",
              file=sys.stderr)
    last_turns = traces.last_turns()
    summary = run_summary(SummaryOptions.of(cfg), Measured(
        driven.results, n_workers, records, inst.server_metrics(client.model), tier,
        driven.lost, inst.gpu_rows, inst.gpu if isinstance(inst.gpu, str) else None,
        traces if not in_workers else None, last_turns), meta)
    write_json(rd.summary, summary)
    write_session_files(out, records, last_turns)
    summary["output_dir"] = str(out)
    return summary


def client_config(cfg: RunConfig, base_url: str, run_salt: str) -> ClientConfig:
    """The client's slice of the run options (credentials are the probe's to choose)."""
    return ClientConfig(base_url=base_url, model=cfg.model or "", timeout_s=cfg.timeout_s,
                        request_timeout_s=cfg.request_timeout_s,
                        connect_timeout_s=cfg.connect_timeout_s, thinking=cfg.thinking,
                        extra_body=cfg.extra_body,
                        cache_salt=None if (cfg.warm_cache or not cfg.cache_salt) else run_salt)


def _progress(cfg: RunConfig) -> Progress | None:
    """The live display of the run's counters (--progress), titled with its workload."""
    if not cfg.progress:
        return None
    from .report.progress import show_progress
    from .report.target import load_text

    side = cfg.labels.get("ab_side")  # an A/B side: its lines say which (agentx ab)
    tag = f"side {side} run {cfg.labels.get('repeat', '1')}:" if side else ""
    title = f"{tag + ' ' if tag else ''}agentx {cfg.trace} {load_text(cfg.public(), short=True)}"
    return lambda stats, done: show_progress(stats, done, title, tag=tag)


def _run_meta(facts: ServerFacts, embedded: bool, t_wall0: float) -> dict:
    c = facts.client
    return {"agentx_version": __version__, "started_at": t_wall0, "target": redact_url(c.base_url),
            "embedded_simulator": embedded, "model": c.model,
            "max_model_len": facts.max_model_len, "tokens": facts.token_info,
            "cache_salt": bool(c.cache_salt), "python": platform.python_version(),
            "host": platform.node()}
