"""Goodput: the rate of requests that met every latency SLO, as `vllm bench serve --goodput`
defines it (vllm/benchmarks/serve.py, `check_goodput_args` and `calculate_metrics`) and as
AIPerf does (github.com/ai-dynamo/aiperf, tutorial "Benchmark Goodput with AIPerf": "the number
of completed requests per second that meet specified metric constraints").

SLOs are in ms on `ttft`, `tpot` and `e2el` (vLLM's names: the catalog entries with an SLO
name, `catalog.SLO_KEYS`); a request is good when each given
metric is <= its SLO (vLLM: `s >= r`). A request with one output token or none has no TPOT;
vLLM counts its TPOT as 0 for goodput, and so do we. Goodput = good requests / the run's
measurement window; the same window gives good tokens/s (vLLM reports requests/s only).
The shares met are over the measured requests plus the window's failed ones: a request that
failed met no SLO (vLLM's goodput counts completed requests only, so a server failing 29% of
its requests could read "met: 100%"). Requests cancelled by the run's own stop are left out:
they ended because the run did, not because the server was slow.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .catalog import SLO_KEYS, by_slo


def parse_slo(text: str) -> dict[str, float]:
    """`ttft:500,tpot:50` -> {"ttft": 500.0, "tpot": 50.0}; ValueError says what is wrong."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition(":")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"{part!r} is not NAME:MS (e.g. ttft:500,tpot:50,e2el:20000)")
        if key not in SLO_KEYS:
            raise ValueError(f"unknown SLO {key!r} (use {', '.join(SLO_KEYS)})")
        if key in out:
            raise ValueError(f"{key} given twice")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"{key}: {value.strip()!r} is not a number of ms") from None
    return check_slo(out)


def slo_option(value: object) -> object:
    """Pydantic before-validator of the `--slo` option: the command line's string, or a
    mapping (a recipe's YAML), becomes the checked dict; None stays None."""
    if isinstance(value, str):
        return parse_slo(value)
    if isinstance(value, Mapping):
        return check_slo(value)
    return value


def check_slo(slo: Mapping[str, float]) -> dict[str, float]:
    """Keys among SLO_KEYS, values finite and >= 0 ms (vLLM refuses negative SLOs)."""
    out = {}
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise ValueError(f"unknown SLO {key!r} (use {', '.join(SLO_KEYS)})")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: {value!r} is not a number of ms") from None
        if not v >= 0 or v == float("inf"):
            raise ValueError(f"{key}: must be a finite number of ms >= 0")
        out[key] = v
    if not out:
        raise ValueError("no SLO given (e.g. ttft:500,tpot:50,e2el:20000)")
    return out


def metric_ms(rec: Mapping, key: str) -> float | None:
    """The record's value for one SLO metric; TPOT of a <= 1-token answer is 0 (vLLM)."""
    v = by_slo(key).value(rec)
    return 0.0 if v is None and key == "tpot" else v


def meets(rec: Mapping, key: str, limit_ms: float) -> bool:
    v = metric_ms(rec, key)
    return v is not None and v <= limit_ms


def is_good(rec: Mapping, slo: Mapping[str, float]) -> bool:
    return all(meets(rec, k, v) for k, v in slo.items())


def goodput(records: Sequence[dict], slo: Mapping[str, float], window_s: float) -> dict:
    """The summary's `goodput` block: the share of the window's requests (measured, i.e. ok and
    not warm-up, plus failed ones) meeting each SLO and all of them, and good requests and
    tokens per second over the run's measurement window."""
    from .summary import measured  # here: RunConfig's --slo imports this module, and `agentx
    # run --help` should not import numpy (via summary and dist) for it

    meas = measured(records)
    failed = sum(1 for r in records
                 if not r["ok"] and not r["warmup"] and r.get("error") != "cancelled")
    n = len(meas) + failed
    good = [r for r in meas if is_good(r, slo)]
    w = max(window_s, 1e-9)
    out_tok = sum(r.get("osl") or 0 for r in good)
    in_tok = sum((r["isl"] if r.get("isl") is not None else r.get("isl_intended") or 0)
                 for r in good)
    return {
        "slo_ms": dict(slo),
        "met": {**{k: (sum(meets(r, k, v) for r in meas) / n if n else None)
                   for k, v in slo.items()},
                "all": len(good) / n if n else None},
        "good_requests": len(good),
        "failed_requests": failed,
        "requests_s": len(good) / w,
        "output_tok_s": out_tok / w,
        "total_tok_s": (in_tok + out_tok) / w,
        "window_s": window_s,
    }
