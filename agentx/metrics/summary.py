"""Aggregate request records into the run summary (definitions: docs/metrics.md).

Only measured requests count: ok, not warm-up, not cancelled. The distributions are those of
the metric catalog (`catalog.DISTS`), each summarised by `dist.dist` (linear-interpolation
percentiles, population std), and its ratios (`catalog.RATIOS`) go into their blocks.
Records are read back from files that any version (or a hand) wrote: an `ok` record whose
token counts are impossible (`records.record_problem`: a negative, fractional or absurd
count) is not measured but counted as a `bad_usage` failure, so a lying server's numbers can
neither crash a summary nor enter it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..distribution import dist
from ..records import record_problem
from .catalog import DISTS, RATIOS
from .definitions import prompt_tokens
from .percentiles import pct_key
from .sessions import per_turn, session_rows, session_summary

__all__ = ["add_percentiles", "dist", "measured", "summarize"]


def measured(records: Iterable[dict]) -> list[dict]:
    return [r for r in records if r["ok"] and not r["warmup"] and not record_problem(r)]


def _by_class(failed: list[dict]) -> dict[str, int]:
    errors: dict[str, int] = {}
    for r in failed:
        errors[r["error"] or "unknown"] = errors.get(r["error"] or "unknown", 0) + 1
    return errors


def summarize(records: list[dict], *, window_s: float, gpus: int | None = None,
              block_size: int | None = None, kv_pool_tokens: int | None = None,
              percentiles: Sequence[float] | None = None,
              last_turns: Mapping[str, int] | None = None) -> dict:
    """The summary numbers other tools read (keys are a contract: see docs/metrics.md).
    `percentiles` (--percentiles) adds keys to the catalog's distributions and is recorded
    as the summary's `percentiles`, which its views show. `last_turns` (trace id -> its last
    turn index) tells which sessions ran to their end (metrics/sessions.py)."""
    extra = [(pct_key(q), q) for q in percentiles or ()]
    meas, impossible = [], []
    for r in records:
        if r["ok"] and not r["warmup"]:
            (impossible if record_problem(r) else meas).append(r)
    failed = [r for r in records if not r["ok"] and r["error"] != "cancelled" and not r["warmup"]]
    failed += [{**r, "error": "bad_usage"} for r in impossible]
    cancelled = [r for r in records if r["error"] == "cancelled" and not r["warmup"]]
    warm = [r for r in records if r["warmup"]]
    warm_failed = [r for r in warm if not r["ok"] and r["error"] != "cancelled"]
    isl = sum(prompt_tokens(r) for r in meas)
    osl = sum((r["osl"] or 0) for r in meas)
    w = max(window_s, 1e-9)
    with_cache = [r for r in meas if r["cached_tokens"] is not None]
    cached = sum(r["cached_tokens"] for r in with_cache)
    throughput = {"input_tok_s": isl / w, "total_tok_s": (isl + osl) / w,
                  # the part of total_tok_s that was prompt served from the prefix cache
                  "cached_share": cached / (isl + osl) if isl + osl else None,
                  "requests_s": len(meas) / w, "window_s": window_s,
                  "per_gpu_tok_s": (isl + osl) / w / gpus if gpus else None,
                  "per_gpu_output_tok_s": osl / w / gpus if gpus else None}
    theo_in = sum(r["isl_intended"] for r in meas)
    isl_err = [(r["isl"] - r["isl_intended"]) for r in meas if r["isl"] is not None]
    out = {
        "completed": len(meas),
        "failed": len(failed),
        "cancelled": len(cancelled),
        "warmup_requests": len(warm),
        # warm-up requests are out of the statistics, not out of sight (docs/reliability.md)
        "warmup_failed": len(warm_failed),
        "warmup_cancelled": sum(1 for r in warm if r["error"] == "cancelled"),
        "warmup_errors": _by_class(warm_failed),
        "errors": _by_class(failed),
        # what 429/503 answers' Retry-After made the lanes wait, warm-up included (s)
        "retry_after_s": sum(r.get("retry_after_s") or 0.0 for r in records),
        "retry_after_responses": sum(1 for r in records if r.get("retry_after_s") is not None),
        **{m.key: dist((v for r in meas for v in m.values(r)), extra) for m in DISTS},
        "throughput": throughput,
        "tokens": {"input": isl, "output": osl,
                   "reasoning": sum(r["reasoning_tokens"] for r in meas),
                   "tokens_per_chunk_mean": (sum(sum(r["chunk_tokens"]) for r in meas)
                                             / max(1, sum(len(r["chunk_tokens"]) for r in meas)))},
        "reasoning_tokens": sum(r["reasoning_tokens"] for r in meas),
        "isl_error": {"exact_fraction": (sum(1 for e in isl_err if e == 0) / len(isl_err))
                      if isl_err else None, "abs_rel": dist(
                          [abs(e) / max(1, r["isl_intended"])
                           for e, r in zip(isl_err, [r for r in meas if r["isl"] is not None])])},
        "cache": {
            "theoretical_hit_rate": (sum(r.get("cached_expected", 0) for r in meas) / theo_in
                                     if theo_in else None),
            "theoretical_hit_rate_pool": (sum(r.get("cached_expected_pool", 0) for r in meas)
                                          / theo_in if theo_in else None),
            "theoretical_hit_rate_offload": (sum(r.get("cached_expected_offload", 0) for r in meas)
                                             / theo_in if theo_in else None),
            "kv_pool_tokens": kv_pool_tokens,
            "cached_tokens": cached,
            "reported_by": len(with_cache),
            "block_size": block_size,
        },
        "client": {"dispatch_lag_ms": dist([r["dispatch_lag_ms"] for r in meas])},
    }
    for m in RATIOS:  # output_tok_s, achieved_hit_rate: defined once, for A/B too
        out[m.summary[0]][m.summary[1]] = m.over(meas, window_s)
    out["percentiles"] = list(percentiles) if percentiles else None
    out["per_session"] = session_summary(session_rows(records, last_turns))
    out["per_turn"] = per_turn(records)
    return out


def add_percentiles(summary: dict, records: Iterable[Mapping],
                    percentiles: Sequence[float]) -> dict:
    """`agentx report --percentiles` on a finished run: the catalog distributions' missing
    percentile keys computed from its records (same rule as `dist`), in memory, and the
    summary's `percentiles` set to what the report shows."""
    meas = measured(list(records))
    need = [(pct_key(q), q) for q in percentiles]
    for m in DISTS:
        d = summary.get(m.key)
        if not isinstance(d, dict) or all(k in d for k, _ in need):
            continue
        fresh = dist((v for r in meas for v in m.values(r)), need)
        d.update({k: fresh[k] for k, _ in need if k not in d})
    summary["percentiles"] = list(percentiles)
    return summary
