"""`agentx run` (and `python bench.py`): flags -> RunConfig -> run -> console summary."""
from __future__ import annotations

import argparse
import os

import orjson

from .errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="replay a trace against a server (default: embedded simulator)")
    add_run_arguments(p)
    p.set_defaults(func=main)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--trace", default="swe", help="built-in name (swe) or path (default: swe)")
    g.add_argument("--conc", type=int, default=8, help="concurrent session lanes (default 8)")
    g.add_argument("--duration", type=float, default=60.0,
                   help="seconds before no new request starts (default 60; 0 = no limit)")
    g.add_argument("--max-requests", type=int, default=None, help="stop after N requests started")
    g.add_argument("--warmup", type=float, default=0.0,
                   help="seconds at the start whose requests are flagged warm-up and excluded")
    g.add_argument("--seed", type=int, default=0, help="schedule seed (default 0)")
    g.add_argument("--think-scale", type=float, default=1.0, help="multiply trace think times")
    g.add_argument("--max-think", type=float, default=300.0, help="cap one think time (s)")
    g.add_argument("--start-range", default="0.25,0.75",
                   help="a lane starts each session at a random turn in this fraction range")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may finish after the stop (then cancelled)")
    g.add_argument("--workers", default="1",
                   help="client processes the lanes are split over, or 'auto' (default 1)")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="place the worker processes as Ray actors across hosts: a cluster "
                        "address (auto, HOST:6379, ray://HOST:10001) or 'local' "
                        "(pip install 'agentx[ray]'; see docs/scale-out.md)")
    g = p.add_argument_group("target")
    g.add_argument("--base-url", default=None,
                   help="OpenAI-compatible server; omitted: start the embedded simulator")
    g.add_argument("--model", default=None, help="default: the first model at /v1/models")
    g.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY (never recorded)")
    g.add_argument("--timeout", type=float, default=600.0, help="per-read timeout (s)")
    g.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="chat_template_kwargs.enable_thinking (default: server's)")
    g.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    g = p.add_argument_group("prompt synthesis")
    g.add_argument("--tokenizer", default=None,
                   help="local HF tokenizer dir: client-side chat template, exact token ids")
    g.add_argument("--context-scale", type=float, default=1.0,
                   help="scale trace token counts (fit long traces to a small model)")
    g.add_argument("--shared-prefix", default="none", choices=("none", "system", "system+tools"))
    g.add_argument("--live-history", action="store_true",
                   help="history uses the live response, not the trace's")
    g.add_argument("--warm-cache", action="store_true",
                   help="no per-run cache isolation (repeat runs may hit a warm cache)")
    g.add_argument("--no-cache-salt", action="store_true",
                   help="do not send cache_salt (servers that reject unknown fields)")
    g = p.add_argument_group("output and validation")
    g.add_argument("--output-dir", "-o", default=None, help="default: results/<time>-<trace>-c<N>")
    g.add_argument("--gpus", type=int, default=None, help="GPUs behind the server (per-GPU rates)")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("--scrape-interval", type=float, default=5.0, help="/metrics period (0 = off)")
    g.add_argument("--validate", choices=("strict", "warn", "off"), default="warn")
    g.add_argument("--expect-al", type=float, default=None,
                   help="expected (synthetic) acceptance length to validate")
    g.add_argument("--al-tolerance", type=float, default=0.05)
    g.add_argument("--expect-offload", action="store_true",
                   help="an offload connector is configured: offload hits must appear")
    g.add_argument("--loop-lag-threshold", type=float, default=None, metavar="MS",
                   help="flag the run client-bound when event-loop lag p99 exceeds this "
                        "(default: max(2 ms, 10%% of the chunk ITL p50))")
    g = p.add_argument_group("embedded simulator (no --base-url)")
    g.add_argument("--sim-profile", default=None, help="simulator profile (default h200-minimaxm3-fp8)")
    g.add_argument("--sim-time-scale", type=float, default=None)
    g.add_argument("--sim-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="any SimConfig option, e.g. --sim-opt spec_k=3 (repeatable)")


def _parse_sim(args: argparse.Namespace) -> dict:
    sim: dict = {}
    if args.sim_profile:
        sim["profile"] = args.sim_profile
    if args.sim_time_scale:
        sim["time_scale"] = args.sim_time_scale
    for kv in args.sim_opt:
        if "=" not in kv:
            raise InputError("command line", f"expected KEY=VALUE, got {kv!r}", field="--sim-opt")
        k, v = kv.split("=", 1)
        try:
            sim[k] = orjson.loads(v)
        except orjson.JSONDecodeError:
            sim[k] = v
    return sim


def config_from_args(args: argparse.Namespace):
    from .run import RunConfig

    try:
        lo, hi = (float(x) for x in args.start_range.split(","))
    except ValueError:
        raise InputError("command line", "expected MIN,MAX fractions", field="--start-range")
    extra = {}
    if args.extra_body:
        try:
            extra = orjson.loads(args.extra_body)
        except orjson.JSONDecodeError as e:
            raise InputError("command line", f"not valid JSON ({e})", field="--extra-body")
        if not isinstance(extra, dict):
            raise InputError("command line", "must be a JSON object", field="--extra-body")
    return RunConfig(
        trace=args.trace, conc=args.conc, duration_s=args.duration or None,
        max_requests=args.max_requests, warmup_s=args.warmup, seed=args.seed,
        think_scale=args.think_scale, max_think_s=args.max_think, start_min=lo, start_max=hi,
        drain_timeout_s=args.drain_timeout,
        base_url=args.base_url, model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), timeout_s=args.timeout,
        thinking=args.thinking, extra_body=extra, tokenizer=args.tokenizer,
        context_scale=args.context_scale, shared_prefix=args.shared_prefix,
        live_history=args.live_history, warm_cache=args.warm_cache,
        no_cache_salt=args.no_cache_salt, output_dir=args.output_dir, gpus=args.gpus,
        progress=not args.no_progress, scrape_interval_s=args.scrape_interval,
        validate=args.validate, expect_al=args.expect_al, al_tolerance=args.al_tolerance,
        expect_offload=args.expect_offload, sim=_parse_sim(args), workers=args.workers,
        ray=args.ray, loop_lag_threshold_ms=args.loop_lag_threshold)


def main(args: argparse.Namespace) -> int:
    from .report.console import print_summary
    from .run import run

    cfg = config_from_args(args)
    summary = run(cfg)
    print_summary(summary)
    print(f"results: {summary['output_dir']}/summary.json, requests.jsonl")
    v = summary.get("validation") or {}
    if cfg.validate == "strict" and v.get("verdict") == "fail":
        return 3
    return 0
