"""The one summary of a sample that every report uses (run summary, trace shape, fidelity,
simulator calibration, live progress), so a `p90` means the same thing everywhere.

Keys: count, mean, std, min, max, p10, p50, p75, p90, p95, p99 (all None when there are no
values). Percentiles interpolate linearly between order statistics, numpy's default method
(https://numpy.org/doc/stable/reference/generated/numpy.percentile.html), which is what vLLM's
`vllm bench serve` reports with (`np.percentile` in vllm/benchmarks/serve.py,
calculate_metrics); std is the population std (`np.std`, ddof=0, as there).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

PCTS = (10, 50, 75, 90, 95, 99)
KEYS = ("count", "mean", "std", "min", "max", *(f"p{p}" for p in PCTS))


def dist(values: Iterable[float | None], extra: Sequence[tuple[str, float]] = ()) -> dict:
    """Summary of `values`; None entries (a metric undefined for some request) are skipped.
    `extra`: more percentiles as (key, q) pairs (`--percentiles`, metrics/percentiles.py)."""
    a = np.fromiter((v for v in values if v is not None), dtype=float)
    more = [(k, q) for k, q in extra if k not in KEYS]
    if a.size == 0:
        return {"count": 0, **{k: None for k in KEYS[1:]}, **{k: None for k, _ in more}}
    q = np.percentile(a, [*PCTS, *(x for _, x in more)])
    return {"count": int(a.size), "mean": float(a.mean()), "std": float(a.std()),
            "min": float(a.min()), "max": float(a.max()),
            **{f"p{p}": float(v) for p, v in zip(PCTS, q)},
            **{k: float(v) for (k, _), v in zip(more, q[len(PCTS):])}}


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """One percentile by the same rule (for a live display that needs only the median)."""
    a = np.fromiter((v for v in values if v is not None), dtype=float)
    return float(np.percentile(a, p)) if a.size else None


def rank_interval(values: Iterable[float | None], q: float, z: float = 1.96) -> tuple[float, float]:
    """Where the q-quantile of the distribution one run sampled lies, at ~95 % (z = 1.96), from
    that run alone: the order statistics at ranks n q -+ z sqrt(n q (1 - q)), the
    distribution-free binomial interval for a quantile (Conover, Practical Nonparametric
    Statistics, 3rd ed., section 3.2). Why: a figure judged on one run has no measured spread,
    yet a p90 of ~130 requests that falls between a steady state and a start-up tail (a real
    EAGLE3 run on the H200: 642 ms at one rank, 3,298 ms at the next) moves several-fold with one
    request more or less in that tail; this says how far a repeat could move it
    (bench/sim_vs_real.py prints it beside the figures of a run that has no repeat)."""
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    if not n:
        return math.nan, math.nan
    half = z * (n * q * (1 - q)) ** 0.5
    r, s = (min(n, max(1, math.ceil(n * q + d))) for d in (-half, half))  # ranks from 1
    return xs[r - 1], xs[s - 1]
