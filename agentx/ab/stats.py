"""Bootstrap confidence intervals for an A/B comparison, resampling sessions, not requests.

The turns of one session share a growing context, a cache history and a lane, so their
latencies are correlated: resampling requests one by one would treat a session's 30 turns as
30 independent draws and give intervals that are too narrow. A replicate draws, for each side
independently, as many sessions as that side has, with replacement, and recomputes every
metric over all requests of the drawn sessions (a subagent's requests belong to the parent
session); a session drawn k times weighs its requests k times, so replicates are weight
matrices and percentiles are weighted (equal to numpy's linear rule on the repeated sample).
With --repeats R >= 2 a side's runs are a stage above its sessions, and a replicate resamples
both: R runs of R with replacement, then, for each run drawn, its sessions. Runs differ by
more than their sessions show: a server that falls into another batching pattern keeps it for
the run, so every session of the run shares it. Resampling the pooled sessions would count R
runs' sessions as independent draws and give an interval that ignores that run-to-run
variance (Davison & Hinkley, "Bootstrap Methods and their Application", 1997, sec. 3.8: two-
stage resampling; with replacement at both stages it errs wide, not narrow).
The 95% interval of B - A (and of B / A) is the 2.5th and 97.5th percentile of the
replicates' differences (the percentile bootstrap: Efron & Tibshirani, "An Introduction to the
Bootstrap", 1993, ch. 13). The verdict says which side is better when the interval of the
difference excludes 0, in the metric's direction; otherwise `no_difference`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..metrics.catalog import CATALOG, Dist, Ratio
from ..metrics.summary import measured

INSUFFICIENT = "insufficient"


@dataclass(frozen=True)
class ABMetric:
    name: str
    label: str
    higher_is_better: bool
    unit: str
    # (side, per-request weights of R replicates, shape (R, n)) -> R values (nan: undefined)
    compute: Callable[["SideData", np.ndarray], np.ndarray]


@dataclass
class SideData:
    """One side's measured requests with the session each belongs to (flat arrays); `cols`
    holds, per catalog key, each request's value (nan: undefined for it), and for a ratio
    `<key>/den` its denominator."""

    owner: np.ndarray  # per request: index of its session
    n_sessions: int
    cols: dict[str, np.ndarray]
    window_s: float
    run_of: np.ndarray | None = None  # per session: index of its run (None: one run)
    keys: list[str] | None = None  # per session: its session_key (pairing two runs' sessions)

    @property
    def n_runs(self) -> int:
        return 1 if self.run_of is None or not self.run_of.size else int(self.run_of.max()) + 1


def session_key(session_id: str) -> str:
    """A subagent's session id is its parent's plus '/agent': it belongs to the parent."""
    return session_id.split("/", 1)[0]


def _column(meas: Sequence[dict], f: Callable[[dict], object]) -> np.ndarray:
    """One value per request (nan: undefined for it)."""
    values = (f(r) for r in meas)
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def side_data(records: Sequence[dict], window_s: float,
              runs: Sequence[int] | None = None) -> SideData:
    """Measured requests (ok, not warm-up) and their sessions, with the values of every
    catalog metric A/B compares; `runs`, parallel to `records`, gives each record's run
    (repeat) index when the side ran more than once."""
    run_of_rec = {id(r): i for r, i in zip(records, runs)} if runs is not None else None
    meas = measured(records)
    ids: dict[str, int] = {}
    owner = np.array([ids.setdefault(session_key(r["session_id"]), len(ids)) for r in meas],
                     dtype=np.int64)
    run_of = None
    if run_of_rec is not None:
        run_of = np.zeros(len(ids), dtype=np.int64)
        for r, o in zip(meas, owner):
            run_of[o] = run_of_rec[id(r)]
        _, run_of = np.unique(run_of, return_inverse=True)  # runs without a measured request
    cols: dict[str, np.ndarray] = {}
    for m in CATALOG:
        if isinstance(m, Dist) and m.ab:
            cols[m.key] = _column(meas, m.value)
        elif isinstance(m, Ratio) and m.ab:
            cols[m.key] = _column(meas, m.num)
            if m.den is not None:
                cols[f"{m.key}/den"] = _column(meas, m.den)
    return SideData(owner=owner, n_sessions=len(ids), cols=cols, window_s=max(window_s, 1e-9),
                    run_of=run_of, keys=list(ids))


def weights(d: SideData, rng: np.random.Generator, replicates: int) -> np.ndarray:
    """(replicates, requests) multiplicities: each replicate draws n sessions of n with
    replacement, and every request of a session drawn k times counts k times. With several
    runs, it first draws R runs of R; a run drawn c times contributes c independent draws of
    its n_j sessions, which together are one multinomial draw of c * n_j of them."""
    n = d.n_sessions
    if d.n_runs <= 1:
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates)
        return counts[:, d.owner]
    assert d.run_of is not None
    runs = rng.multinomial(d.n_runs, np.full(d.n_runs, 1.0 / d.n_runs), size=replicates)
    counts = np.zeros((replicates, n), dtype=np.int64)
    for j in range(d.n_runs):
        mine = np.flatnonzero(d.run_of == j)
        counts[:, mine] = rng.multinomial(runs[:, j] * mine.size, np.full(mine.size, 1.0 / mine.size))
    return counts[:, d.owner]


def replay_key(key: str) -> str:
    """A session's key without its run's prefix (`<run>-L3.7` -> `L3.7`): the same replay in
    two runs of one seed (the planner picks each lane's sessions from the seed)."""
    return key.split("-", 1)[-1]


def paired_weights(a: SideData, b: SideData, rng: np.random.Generator,
                   replicates: int) -> tuple[np.ndarray, np.ndarray]:
    """(replicates, requests) multiplicities of both sides from ONE draw of sessions: the
    union of both sides' replays (by replay_key) drawn with replacement, and a replay drawn k
    times counts k times on each side that has it. Two runs of one seed replay the same
    sessions on the same lanes, so a session's own difficulty (its context length, its think
    times) falls on both sides alike and cancels from B - A instead of widening it."""
    ka, kb = ([replay_key(k) for k in d.keys or ()] for d in (a, b))
    union = sorted(set(ka) | set(kb))
    idx = {k: i for i, k in enumerate(union)}
    counts = rng.multinomial(len(union), np.full(len(union), 1.0 / len(union)), size=replicates)
    return (counts[:, [idx[k] for k in ka]][:, a.owner], counts[:, [idx[k] for k in kb]][:, b.owner])


def point_estimates(d: SideData, metrics: Sequence["ABMetric"] | None = None) -> dict[str, float | None]:
    """Each metric over all of the side's requests, once (no resampling)."""
    one = np.ones((1, d.owner.size), np.int64)
    return {m.name: _num(m.compute(d, one)[0]) for m in (METRICS if metrics is None else metrics)}


def weighted_percentile(values: np.ndarray, w: np.ndarray, q: float) -> np.ndarray:
    """Per row of `w`: the q-th percentile of `values` each repeated w times, by numpy's
    linear rule (distribution.py) — without building the repeated samples."""
    ok = ~np.isnan(values)
    order = np.argsort(values[ok], kind="stable")
    v, w = values[ok][order], w[:, ok][:, order]
    rows, n = w.shape
    if n == 0:
        return np.full(rows, np.nan)
    c = np.cumsum(w, axis=1)
    total = c[:, -1]
    h = np.maximum(total - 1, 0) * q / 100.0
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(total - 1, 0))
    # the element holding expanded position k is the first j with c[j] > k; rows are searched
    # at once by shifting each row's cumulative counts above the previous row's
    shift = (np.arange(rows, dtype=np.int64) * (int(total.max()) + 1))[:, None]
    flat = (c + shift).ravel()
    base = np.arange(rows, dtype=np.int64) * n
    j_lo = np.minimum(np.searchsorted(flat, lo + shift[:, 0], side="right") - base, n - 1)
    j_hi = np.minimum(np.searchsorted(flat, hi + shift[:, 0], side="right") - base, n - 1)
    out = v[j_lo] + (h - lo) * (v[j_hi] - v[j_lo])
    return np.where(total > 0, out, np.nan)


def _pct(key: str, q: float) -> Callable[[SideData, np.ndarray], np.ndarray]:
    def f(d: SideData, w: np.ndarray) -> np.ndarray:
        return weighted_percentile(d.cols[key], w, q)
    return f


def _ratio(m: Ratio) -> Callable[[SideData, np.ndarray], np.ndarray]:
    """Σ w·num / Σ w·den over the requests that have both; per second of the side's window
    without a denominator (fixed: a replicate draws as many sessions as the side has, so its
    total is the side's in expectation)."""
    def f(d: SideData, w: np.ndarray) -> np.ndarray:
        num = d.cols[m.key]
        if m.den is None:
            return (w @ np.nan_to_num(num)) / d.window_s
        den = d.cols[f"{m.key}/den"]
        ok = ~np.isnan(num) & ~np.isnan(den)
        total = w[:, ok] @ den[ok]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, (w[:, ok] @ num[ok]) / total, np.nan)
    return f


def ab_metrics(percentiles: Sequence[float] | None = None) -> tuple[ABMetric, ...]:
    """What `agentx ab` compares, in catalog order: each distribution's `ab` percentiles (or
    `--percentiles`, for every distribution that has `ab` ones) and each ratio with `ab`."""
    out: list[ABMetric] = []
    for m in CATALOG:
        if isinstance(m, Dist):
            out += [ABMetric(m.column(q), m.pct_label(q), m.higher_is_better, m.unit,
                             _pct(m.key, q)) for q in (percentiles or m.ab if m.ab else ())]
        elif m.ab:
            out.append(ABMetric(m.key, m.name, m.higher_is_better, m.unit, _ratio(m)))
    return tuple(out)


METRICS: tuple[ABMetric, ...] = ab_metrics()


def verdict(m: ABMetric, ci_low: float | None, ci_high: float | None) -> str:
    """b_better / a_better when the interval of B - A excludes 0, in the metric's direction;
    `insufficient` when there is no interval or it has no width: every replicate drew the
    same value (one session a side, or one value a metric), which is no evidence of a
    difference however far from 0 it lies."""
    if ci_low is None or ci_high is None or ci_low == ci_high:
        return INSUFFICIENT
    if ci_low <= 0 <= ci_high:
        return "no_difference"
    b_higher = ci_low > 0
    return "b_better" if b_higher == m.higher_is_better else "a_better"


def _num(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _interval(x: np.ndarray, level: float) -> tuple[float | None, float | None]:
    x = x[np.isfinite(x)]
    if not x.size:
        return None, None
    lo, hi = np.percentile(x, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def too_thin(d: SideData, min_sessions: int, min_requests: int) -> str | None:
    """Why a side's sample cannot carry a verdict (None when it can): the bootstrap resamples
    sessions, so a handful of them gives intervals that are mostly the handful's own
    spread (percentile intervals from fewer than ~10 clusters undercover: Davison & Hinkley
    1997, sec. 5.4), and few requests make every percentile a single value's."""
    n_req = int(d.owner.size)
    if d.n_sessions < min_sessions:
        return f"{d.n_sessions} session(s) measured, fewer than --min-sessions {min_sessions}"
    if n_req < min_requests:
        return f"{n_req} request(s) measured, fewer than --min-samples {min_requests}"
    return None


def compare(a: SideData, b: SideData, *, replicates: int = 2000, seed: int = 0,
            level: float = 0.95, metrics: Sequence[ABMetric] = METRICS,
            min_sessions: int = 0, min_requests: int = 0, paired: bool = False) -> dict:
    """`{name: {a, b, diff, ratio, ci_low, ci_high, ratio_ci_low, ratio_ci_high, verdict}}`
    with the percentile-bootstrap interval of B - A (ci_*) and of B / A (ratio_ci_*); every
    verdict is `insufficient` when a side has fewer sessions or requests than asked.
    `paired`: both sides' sessions are drawn together (paired_weights), for two runs of one
    seed."""
    thin = too_thin(a, max(1, min_sessions), min_requests) \
        or too_thin(b, max(1, min_sessions), min_requests)
    empty = not a.n_sessions or not b.n_sessions  # nothing to resample: no interval
    rng = np.random.default_rng(seed)
    if not empty:
        wa, wb = paired_weights(a, b, rng, replicates) if paired \
            else (weights(a, rng, replicates), weights(b, rng, replicates))
    with np.errstate(divide="ignore", invalid="ignore"):
        pa, pb = point_estimates(a, metrics), point_estimates(b, metrics)
    out = {}
    for m in metrics:
        va, vb = pa[m.name], pb[m.name]
        ci = rci = (None, None)
        if not empty:
            ra, rb = m.compute(a, wa), m.compute(b, wb)
            with np.errstate(divide="ignore", invalid="ignore"):
                ci, rci = _interval(rb - ra, level), _interval(rb / ra, level)
        out[m.name] = {
            "label": m.label, "unit": m.unit, "higher_is_better": m.higher_is_better,
            "a": va, "b": vb,
            "diff": None if va is None or vb is None else vb - va,
            "ratio": None if va in (None, 0) or vb is None else vb / va,
            "ci_low": ci[0], "ci_high": ci[1], "ratio_ci_low": rci[0], "ratio_ci_high": rci[1],
            "verdict": INSUFFICIENT if thin else verdict(m, *ci),
        }
    return out
