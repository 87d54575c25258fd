"""The 95% interval of a measured acceptance length, by bootstrap over requests.

Each request i contributes (accepted_i, drafts_i): the server's own per-request counts when
it sends them (vLLM's `metrics.speculative_decoding`), else the counts read from its streamed
chunks (`definitions.chunk_spec_counts`). Requests, not steps, are resampled: the steps of one
request share its prompt and are correlated. The replicates' spread is placed around the AL of
the /metrics deltas (the percentile interval shifted by AL - R: [AL + q2.5(R*) - R,
AL + q97.5(R*) - R], R the pooled ratio of the pairs), so the interval belongs to the figure
written to the golden file even where the chunk counts only approximate the server's.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..metrics.definitions import chunk_spec_counts

SERVER_COUNTS, CHUNK_COUNTS = "per-request server counts", "chunk token counts"


@dataclass
class Interval:
    low: float
    high: float
    source: str  # SERVER_COUNTS | CHUNK_COUNTS
    requests: int  # requests with at least one draft


def request_counts(records: Iterable[Mapping]) -> tuple[list[tuple[int, int]], str]:
    """(accepted, drafts) per completed request, and where they came from."""
    ok = [r for r in records if r.get("ok")]
    server = [(r["spec_accepted"], r["spec_steps"]) for r in ok
              if r.get("spec_steps") is not None and r.get("spec_accepted") is not None]
    if server and len(server) == len(ok):
        return [p for p in server if p[1] > 0], SERVER_COUNTS
    pairs = [chunk_spec_counts(r.get("chunk_tokens") or []) for r in ok]
    return [p for p in pairs if p[1] > 0], CHUNK_COUNTS


def bootstrap(al: float, pairs: Sequence[tuple[int, int]], k: int, source: str,
              resamples: int = 2000, seed: int = 0) -> Interval | None:
    """95% interval around `al` from `pairs`; None with fewer than two requests."""
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    n = len(pairs)
    ratio = sum(a for a, _ in pairs) / sum(d for _, d in pairs)
    reps = []
    for _ in range(resamples):
        sample = [pairs[rng.randrange(n)] for _ in range(n)]
        reps.append(sum(a for a, _ in sample) / sum(d for _, d in sample))
    reps.sort()
    lo, hi = reps[int(0.025 * (resamples - 1))], reps[int(0.975 * (resamples - 1))]
    accepted, drafts = sum(a for a, _ in pairs), sum(d for _, d in pairs)
    if lo == hi and accepted in (0, k * drafts):
        return _boundary(accepted == 0, drafts, k, source, n)
    if lo == hi:
        return _identical(al, drafts, k, source, n)
    return Interval(max(1.0, al + lo - ratio), min(k + 1.0, al + hi - ratio), source, n)


def _identical(al: float, drafts: int, k: int, source: str, n: int) -> Interval:
    """Every request accepted the same share (a deterministic model on near-identical prompts:
    the tiny ngram server of the vLLM tests gave 10 requests of 8 steps each accepting 20), so
    every resample repeats it and the bootstrap collapses to a point, which would claim an
    exact AL from a few dozen drafts. Taking the drafts as independent, each accepting 0..K
    tokens, Hoeffding's inequality bounds their mean within K * sqrt(ln(2 / 0.05) / (2 drafts))
    at 95% whatever their distribution (Hoeffding 1963, Theorem 2): wide, never falsely narrow."""
    half = k * math.sqrt(math.log(2 / 0.05) / (2 * drafts))
    return Interval(max(1.0, al - half), min(k + 1.0, al + half),
                    source + ", Hoeffding bound over drafts (requests identical)", n)


def _boundary(none: bool, drafts: int, k: int, source: str, n: int) -> Interval:
    """No draft accepted (or every one): every resample repeats it and the bootstrap interval
    collapses to a point. The exact (Clopper-Pearson) 97.5% bound on the first position's
    rate after 0 successes in `drafts` trials is q = 1 - 0.025^(1/drafts), and AL - 1 = sum of
    the K position rates <= K * p1, so AL lies in [1, 1 + K q] (drafts taken as independent)."""
    q = 1.0 - 0.025 ** (1.0 / drafts)
    low, high = (1.0, 1.0 + k * q) if none else (k + 1.0 - k * q, k + 1.0)
    return Interval(low, high, source + ", exact binomial bound at the boundary", n)
