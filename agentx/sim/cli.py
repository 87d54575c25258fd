"""`agentx serve-sim`: run the vLLM-compatible simulator standalone."""
from __future__ import annotations

import argparse

from ..errors import InputError
from .config import FAIL_KINDS, OFFLOAD_BACKENDS, SimConfig


def _rates(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise InputError("serve-sim", f"not a comma-separated list of numbers: {s!r}",
                         field="synthetic_rates") from None


def _kinds(s: str) -> tuple[str, ...]:
    kinds = tuple(x.strip().lower() for x in s.split(",") if x.strip())
    for k in kinds:
        if k not in FAIL_KINDS:
            raise InputError("serve-sim", f"unknown fail kind {k!r}; known: {','.join(FAIL_KINDS)}",
                             field="fail_kinds")
    return kinds


def add_parser(subparsers) -> argparse.ArgumentParser:
    d = SimConfig()
    p = subparsers.add_parser("serve-sim", help="run the embedded vLLM-compatible simulator as a server",
                              description=__doc__)
    a = p.add_argument
    a("--host", default=d.host, help="bind address (loopback by default)")
    a("--port", type=int, default=d.port)
    a("--model-name", default=d.model_name, help="served model name")
    a("--max-model-len", type=int, default=d.max_model_len)
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    a("--profile", default=d.profile, help="shipped profile name or path to a YAML profile")
    a("--tp", type=int, default=None, help="tensor parallel size (default: profile)")
    a("--gpu-memory-utilization", type=float, default=None)
    a("--kv-pool-tokens", type=int, default=None, help="override the derived GPU KV pool size")
    a("--block-size", type=int, default=None)
    a("--max-num-seqs", type=int, default=None)
    a("--max-num-batched-tokens", type=int, default=None)
    a("--spec-k", type=int, default=0, help="speculative tokens per step (0 = off)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--synthetic-al", type=float, default=None, help="synthetic mean acceptance length L")
    g.add_argument("--synthetic-rates", default=None, help="per-position rates p1,..,pK")
    a("--kv-offload", choices=OFFLOAD_BACKENDS, default="none")
    a("--offload-gb", type=float, default=None, help="CPU tier size in GB (default: profile)")
    a("--offload-store", choices=("eager", "lazy"), default=None)
    a("--time-scale", type=float, default=1.0, help="run F x faster than real time")
    a("--fixed-ttft-ms", type=float, default=None, help="fidelity mode: exact TTFT, no roofline")
    a("--fixed-itl-ms", type=float, default=None, help="fidelity mode: exact gap between chunks")
    a("--fail-rate", type=float, default=0.0)
    a("--fail-kinds", default=",".join(FAIL_KINDS), help=",".join(FAIL_KINDS))
    a("--stall-s", type=float, default=d.stall_s)
    a("--slow-headers-s", type=float, default=d.slow_headers_s)
    a("--truth-log", default=None, help="write one JSON line per request (chunk send times)")
    a("--default-thinking", choices=("on", "off"), default="on")
    a("--reasoning-fraction", type=float, default=d.reasoning_fraction)
    a("--eos-prob", type=float, default=d.eos_prob, help="per-token EOS chance without ignore_eos")
    a("--no-per-request-metrics", action="store_true")
    a("--seed", type=int, default=0)
    p.set_defaults(func=_main)
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build and validate the config; bad values raise InputError (one line, exit 2)."""
    cfg = SimConfig(host=ns.host, port=ns.port, model_name=ns.model_name, max_model_len=ns.max_model_len,
                    api_key=ns.api_key, profile=ns.profile, tp=ns.tp,
                    gpu_memory_utilization=ns.gpu_memory_utilization, kv_pool_tokens=ns.kv_pool_tokens,
                    block_size=ns.block_size, max_num_seqs=ns.max_num_seqs,
                    max_num_batched_tokens=ns.max_num_batched_tokens, spec_k=ns.spec_k,
                    synthetic_al=ns.synthetic_al,
                    synthetic_rates=_rates(ns.synthetic_rates) if ns.synthetic_rates else None,
                    kv_offload=ns.kv_offload,
                    offload_gb=ns.offload_gb, offload_store=ns.offload_store, time_scale=ns.time_scale,
                    fixed_ttft_ms=ns.fixed_ttft_ms, fixed_itl_ms=ns.fixed_itl_ms, fail_rate=ns.fail_rate,
                    fail_kinds=_kinds(ns.fail_kinds), stall_s=ns.stall_s, slow_headers_s=ns.slow_headers_s,
                    truth_log=ns.truth_log, default_thinking=ns.default_thinking == "on",
                    reasoning_fraction=ns.reasoning_fraction, eos_prob=ns.eos_prob,
                    per_request_metrics=not ns.no_per_request_metrics, seed=ns.seed)
    cfg.validate()
    return cfg


def _main(ns: argparse.Namespace) -> int:
    from .profile import resolve
    from .server import run

    cfg = config_from_args(ns)
    resolve(cfg)  # load the profile now so bad input fails before the loop starts
    return run(cfg)
