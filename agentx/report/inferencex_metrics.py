"""The measured blocks of an InferenceX agentic result (`request_accounting`, `request_metrics`,
`server_metrics`), computed from AIPerf-format rows (aiperf_export.py) by InferenceX's own
definitions, so an agentx cell and an AIPerf run of the same point give the same numbers.

Definitions (InferenceX 843c6254ff69b567f772f6a5fd97675af3d04431,
utils/agentic/aggregation/request_metrics.py, server_metrics.py, backends/vllm.py,
aggregation_common.py; docs/inferencex.md has the table): warm-up and failed rows are dropped
but counted; latencies in seconds; each distribution is mean, p50/p75/p90/p95 (linear
interpolation) and population std; interactivity is 1/ITL of the matching statistic; qps is
completions per 1-second window; throughput spans the first start to the last end; every float
is rounded to 5 places and one that rounds to a whole number >= 1 becomes an int.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from .. import vllm_names as vn

STATS = ("mean", "p50", "p75", "p90", "p95")


def percentile(data: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); 0.0 for no data."""
    if not data:
        return 0.0
    s = sorted(data)
    k = (len(s) - 1) * p / 100
    f = int(k)
    return s[f] if f + 1 >= len(s) else s[f] + (k - f) * (s[f + 1] - s[f])


def stats(values: list[float]) -> dict[str, float]:
    """mean, p50, p75, p90, p95, std (population); {} for no values."""
    if not values:
        return {}
    out = {"mean": statistics.mean(values)}
    out.update({f"p{q}": percentile([float(v) for v in values], q) for q in (50, 75, 90, 95)})
    out["std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
    return out


def _value(row: dict, key: str) -> float | None:
    m = row.get("metrics", {}).get(key)
    v = m.get("value") if isinstance(m, dict) else m
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _seconds(values_ms: Iterable[float | None]) -> list[float]:
    return [v / 1000.0 for v in values_ms if v is not None and math.isfinite(v) and v > 0]


def split(rows: list[dict]) -> tuple[list[dict], dict]:
    """The profiling rows without errors, and InferenceX's request_accounting of all rows."""
    kept: list[dict] = []
    acc: dict = {"records_total": len(rows), "records_profiled": 0, "records_dropped_total": 0,
                 "records_warmup_dropped": 0, "records_error_dropped": 0, "error_categories": {}}
    for row in rows:
        phase = row.get("metadata", {}).get("benchmark_phase")
        warm = phase is not None and phase != "profiling"
        err = row.get("error")
        acc["records_warmup_dropped"] += warm
        if err:
            acc["records_error_dropped"] += 1
            cat = _category(err)
            acc["error_categories"][cat] = acc["error_categories"].get(cat, 0) + 1
        if not (err or warm):
            kept.append(row)
    acc["records_profiled"] = len(kept)
    acc["records_dropped_total"] = len(rows) - len(kept)
    return kept, acc


def _category(err: object) -> str:
    if isinstance(err, dict):
        for key in ("type", "error_type", "code", "class", "status"):
            if err.get(key) not in (None, ""):
                return str(err[key])
        err = err.get("message") or err.get("error")
    if not err:
        return "unknown"
    return (str(err).strip().splitlines()[0].split(":", 1)[0] or "unknown")[:120]


def _intvty(itl: dict, per_request: list[float]) -> dict:
    out = {k: 1.0 / itl[k] for k in STATS if isinstance(itl.get(k), (int, float)) and itl[k] > 0}
    inv = [1.0 / v for v in per_request if v > 0]
    if inv:
        out["std"] = statistics.pstdev(inv) if len(inv) > 1 else 0.0
    return out


def latency(rows: list[dict]) -> dict:
    itls = _seconds(_value(r, "inter_token_latency") for r in rows)
    itl = stats(itls)
    ratios = []
    for r in rows:
        e2e, osl = _value(r, "request_latency"), _value(r, "output_sequence_length")
        if e2e is not None and osl is not None and math.isfinite(e2e) and math.isfinite(osl) \
                and e2e > 0 and osl > 0:
            ratios.append(e2e / 1000.0 / osl)
    full = _seconds(_value(r, "full_response_inter_token_latency") for r in rows)
    return {"ttft": stats(_seconds(_value(r, "time_to_first_token") for r in rows)),
            "e2el": stats(_seconds(_value(r, "request_latency") for r in rows)),
            "itl": itl, "tpot": stats(itls), "intvty": _intvty(itl, itls),
            "e2e_norm_intvty": _intvty(stats(ratios), ratios),
            "full_response_itl": stats(full), "full_response_intvty": _intvty(stats(full), full)}


def qps(rows: list[dict]) -> dict:
    ends = sorted(int(r["metadata"]["request_end_ns"]) / 1e9 for r in rows
                  if r.get("metadata", {}).get("request_end_ns"))
    if len(ends) < 2 or ends[-1] - ends[0] <= 0:
        return {}
    values, t = [], ends[0]
    while t + 1.0 <= ends[-1]:
        values.append(float(sum(1 for e in ends if t <= e < t + 1.0)))
        t += 1.0
    flat = stats(values) if values else {"mean": len(ends) / (ends[-1] - ends[0])}
    return {"window_seconds": 1.0, "samples": len(values), **flat}


def _ints(rows: list[dict], key: str) -> list[int]:
    return [int(v) for r in rows if (v := _value(r, key)) is not None]


def tokens(rows: list[dict]) -> dict:
    return {"input": stats(_ints(rows, "input_sequence_length")),
            "output_actual": stats(_ints(rows, "output_sequence_length")),
            "output_expected": {}}  # InferenceX fills it from its own trace set's metadata


def throughput(rows: list[dict], gpus: int) -> dict:
    starts = [int(r["metadata"]["request_start_ns"]) for r in rows
              if r.get("metadata", {}).get("request_start_ns")]
    ends = [int(r["metadata"]["request_end_ns"]) for r in rows
            if r.get("metadata", {}).get("request_end_ns")]
    if not starts or not ends or (max(ends) - min(starts)) <= 0:
        return {}
    dur = (max(ends) - min(starts)) / 1e9
    i, o = sum(_ints(rows, "input_sequence_length")), sum(_ints(rows, "output_sequence_length"))
    out: dict = {"input": {"tokens_per_second": i / dur}, "output": {"tokens_per_second": o / dur},
                 "total": {"tokens_per_second": (i + o) / dur}, "duration_seconds": dur,
                 "per_gpu": {}}
    if gpus > 0:
        out["per_gpu"] = {"total_tput_tps": (i + o) / dur / gpus,
                          "output_tput_tps": o / dur / gpus, "input_tput_tps": i / dur / gpus}
    return out


def theoretical_hit(aggregate: dict) -> float | None:
    m = aggregate.get("theoretical_prefix_cache_hit")
    if not isinstance(m, dict):
        return None
    if m.get("sum") is not None and m.get("count"):
        return float(m["sum"]) / float(m["count"])
    if m.get("avg") is None:
        return None
    return float(m["avg"]) / 100.0 if str(m.get("unit", "")).strip() == "%" else float(m["avg"])


def request_metrics(rows: list[dict], aggregate: dict, gpus: int) -> dict:
    """`request_metrics` of the kept rows (split)."""
    return {"qps": qps(rows), "latency": latency(rows), "tokens": tokens(rows),
            "throughput": throughput(rows, gpus),
            "cache": {"theoretical_cache_hit_rate": theoretical_hit(aggregate)}}


def _stat(export: dict, name: str, keys: tuple[str, ...]) -> float | None:
    """The first of `keys` in the metric's series' stats, summed (counters) over series."""
    found, total = False, 0.0
    for s in (export.get("metrics", {}).get(name) or {}).get("series") or []:
        for k in keys:
            if (s.get("stats") or {}).get(k) is not None:
                total += float(s["stats"][k])
                found = True
                break
    return total if found else None


def _rate(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def server_metrics(export: dict, rows: list[dict], pool_tokens: int | None) -> tuple[dict, list]:
    """`server_metrics` as InferenceX's vLLM adapter fills it from server_metrics_export.json
    (prefix-cache counters, KV usage, token totals), and its warnings. `pool_tokens` is the
    KV pool's size, which InferenceX reads from the server log ("GPU KV cache size")."""
    metrics = export.get("metrics") or {}
    counter = ("total", "sum", "max", "avg")
    hits, queries = _stat(export, vn.PREFIX_HITS, counter), _stat(export, vn.PREFIX_QUERIES, counter)
    ext_hits, ext_queries = _stat(export, vn.EXT_HITS, counter), \
        _stat(export, vn.EXT_QUERIES, counter)
    usage = _stat(export, vn.KV_USAGE, ("max", "avg", "total"))
    usage = usage / 100.0 if usage is not None and usage > 1.5 else usage
    gpu_rate, ext_rate = _rate(hits, queries), _rate(ext_hits, ext_queries)
    prompt = _stat(export, vn.PROMPT_TOKENS, counter)
    gen = _stat(export, vn.GEN_TOKENS, counter)
    isl, osl = _ints(rows, "input_sequence_length"), _ints(rows, "output_sequence_length")
    prompt_total = int(round(prompt)) if prompt is not None else (sum(isl) if isl else None)
    gen_total = int(round(gen)) if gen is not None else (sum(osl) if osl else None)
    out = {
        "present": bool(metrics), "adapter": "vllm" if metrics else "none",
        "metric_count": len(metrics),
        "cache": {"gpu_cache_hit_rate": gpu_rate, "cpu_cache_hit_rate": ext_rate,
                  "external_cache_hit_rate": ext_rate, "overall_cache_hit_rate": gpu_rate,
                  "prefix_cache_hits": hits, "prefix_cache_queries": queries,
                  "external_prefix_cache_hits": ext_hits,
                  "external_prefix_cache_queries": ext_queries, "cached_tokens_by_source": {},
                  "frontend_cache_hit_rate": None, "router_kv_hit_rate": None,
                  "router_shared_cache_hit_rate": None, "frontend_cached_tokens": None,
                  "frontend_input_tokens": None},
        "kv_cache": {"gpu_usage_pct": usage, "gpu_total_tokens": pool_tokens,
                     "cpu_usage_pct": None, "cpu_used_tokens": None, "cpu_total_tokens": None},
        "kv_offload": dict.fromkeys(("bytes_gpu_to_cpu", "bytes_cpu_to_gpu", "time_gpu_to_cpu",
                                     "time_cpu_to_gpu", "bandwidth_gpu_to_cpu_bytes_per_second",
                                     "bandwidth_cpu_to_gpu_bytes_per_second")),
        "tokens": {"prompt_total": prompt_total, "generation_total": gen_total,
                   "requests_completed": len(rows),
                   "prompt_by_source": {"gpu_cache_hit": None, "cpu_or_external_cache_hit": None,
                                        "computed": None, "raw": {}}},
        "sources": [],
    }
    if not metrics:
        return out, ["server_metrics_export.json missing or empty"]
    out["sources"] = [{"id": "combined", "role": "combined", "prompt_tokens": prompt,
                       "generation_tokens": gen, "prefix_cache_hit_rate": gpu_rate,
                       "gpu_kv_cache_usage_pct": usage}]
    return out, []


def round_floats(obj: object, places: int = 5) -> object:
    """Every finite float rounded to `places`; one that rounds to a whole number >= 1 an int."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return obj
        r = round(obj, places)
        return int(r) if abs(r) >= 1 and r.is_integer() else r
    if isinstance(obj, dict):
        return {k: round_floats(v, places) for k, v in obj.items()}
    if isinstance(obj, list):
        return [round_floats(v, places) for v in obj]
    return obj
