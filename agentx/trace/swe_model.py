"""Fitted distributions of the built-in `swe` trace (the session generator is generate.py).

`Draw` turns a seeded PCG64 stream into uniforms and applies only our own transforms (inverse
normal CDF, Poisson by inversion), so regeneration does not depend on numpy's distribution
algorithms. `SweModel` holds every fitted parameter: lognormal / logit-normal mixtures and
probabilities fitted to the real traces (traces/README.md lists targets, method and results).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


# -- distributions ----------------------------------------------------------------------------
def norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |rel err| < 1.2e-9)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00)
    p = min(max(p, 1e-12), 1 - 1e-12)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


class Draw:
    """Uniform source: numpy PCG64 `random()` only (stable across numpy versions)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def u(self) -> float:
        return float(self.rng.random())

    def normal(self) -> float:
        return norm_ppf(self.u())

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.u()

    def poisson(self, lam: float) -> int:
        """Inverse-CDF Poisson (small lambda)."""
        u, k, p = self.u(), 0, math.exp(-lam)
        s = p
        while u > s and k < 1000:
            k += 1
            p *= lam / k
            s += p
        return k


def _pick(comps: tuple[tuple[float, float, float], ...], u: float) -> tuple[float, float, float]:
    """The mixture component that uniform `u` falls in (by cumulative weight)."""
    acc = 0.0
    for comp in comps:
        acc += comp[0]
        if u < acc:
            return comp
    return comps[-1]


@dataclass(frozen=True)
class LogNormalMix:
    """Mixture of log-normals given by (weight, median, sigma) components."""

    comps: tuple[tuple[float, float, float], ...]

    def draw(self, d: Draw) -> float:
        _, med, sig = _pick(self.comps, d.u())
        return med * math.exp(sig * d.normal())

    def cdf(self, x: float) -> float:
        if x <= 0:
            return 0.0
        lx = math.log(x)
        return sum(w * 0.5 * (1 + math.erf((lx - math.log(med)) / (sig * math.sqrt(2))))
                   for w, med, sig in self.comps)

    def ppf(self, p: float) -> float:
        """Quantile by bisection in log space (for stratified draws)."""
        lo = math.log(min(c[1] for c in self.comps)) - 12 * max(c[2] for c in self.comps)
        hi = math.log(max(c[1] for c in self.comps)) + 12 * max(c[2] for c in self.comps)
        for _ in range(100):
            mid = (lo + hi) / 2
            if self.cdf(math.exp(mid)) < p:
                lo = mid
            else:
                hi = mid
        return math.exp((lo + hi) / 2)


@dataclass(frozen=True)
class LogitNormalMix:
    """A fraction in (0, 1): logistic of a normal mixture given by (weight, mu, sigma)."""

    comps: tuple[tuple[float, float, float], ...]

    def draw(self, d: Draw) -> float:
        _, mu, sig = _pick(self.comps, d.u())
        return 1.0 / (1.0 + math.exp(-(mu + sig * d.normal())))


# -- the fitted model -------------------------------------------------------------------------
@dataclass(frozen=True)
class SweModel:
    """Fitted constants (targets: the real 533-session set; see traces/README.md)."""

    # Session classes. A session either starts fresh (small first user context; long) or
    # resumes earlier work (large first context). Resumed ones start either very large (1M
    # window) or moderately large; the latter mostly use a 200k window, and those with a 1M
    # window run long. Counts per class are stratified (see generate_sessions).
    p_resumed: float = 0.454
    p_resumed_big_start: float = 0.3382  # of resumed: first context from the big component
    p_large_resumed_small: float = 0.18  # of the other resumed: 1M window (run long)
    p_large_fresh: float = 0.058
    u0_fresh: LogNormalMix = LogNormalMix(((0.4738, 507.9, 1.5946), (0.5262, 6229.8, 0.3782)))
    u0_resumed_small: LogNormalMix = LogNormalMix(((1.0, 80000.0, 0.5441),))
    u0_resumed_big: LogNormalMix = LogNormalMix(((1.0, 290000.0, 0.5513),))
    turns_fresh: LogNormalMix = LogNormalMix(((0.2605, 14.72, 0.8616), (0.7395, 90.22, 0.6596)))
    turns_resumed: LogNormalMix = LogNormalMix(((0.2168, 4.58, 0.2053), (0.7832, 29.7, 0.7341)))
    # 1M-window sessions that start below 140k only count as 1M because they grew past
    # 200k: they run long
    turns_long: LogNormalMix = LogNormalMix(((1.0, 150.0, 0.5),))
    # the turn counts above are the recorded ones; 200k-window sessions that end at their
    # context limit are cut short, so their intended count is scaled up (calibrated by
    # simulation)
    turns_scale: tuple[float, float] = (1.1, 1.3)  # fresh, resumed
    system_tokens: LogNormalMix = LogNormalMix(((0.8595, 2775.6, 0.2133),
                                                (0.1405, 2077.4, 0.7278)))
    tool_tokens: LogNormalMix = LogNormalMix(((0.4955, 12500.8, 0.0214),
                                              (0.5045, 10529.3, 0.1617)))
    std_limit: tuple[float, float] = (140_000.0, 168_000.0)
    large_limit: tuple[float, float] = (800_000.0, 900_000.0)
    # a session reaching its limit ends there (the recorded session stops) with this chance,
    # else it compacts hard
    p_end_at_limit: tuple[float, float] = (0.3, 0.8)  # fresh, resumed
    # per-turn chance of a compaction below the limit, per class (fresh, fresh_1m, resumed,
    # resumed_1m_long, resumed_1m): fresh sessions summarise hard, resumed ones mostly trim
    hazard: tuple[float, ...] = (0.003, 0.012, 0.004, 0.008, 0.008)
    # kept fraction of the prompt: fit to the shrinks of fresh sessions (hard summaries) and
    # of resumed sessions (mostly trims)
    rel_fresh: LogitNormalMix = LogitNormalMix(((0.566, -1.1443, 0.4494),
                                                (0.434, 1.0038, 1.7963)))
    rel_resumed: LogitNormalMix = LogitNormalMix(((0.6247, 1.2192, 1.0734),
                                                  (0.3753, 5.1651, 1.1102)))
    out: LogNormalMix = LogNormalMix(((0.6586, 181.75, 0.4793), (0.3414, 536.46, 1.0021)))
    extra: LogNormalMix = LogNormalMix(((0.6817, 70.0, 1.9), (0.3183, 1300.0, 1.0)))
    early_boost: tuple[float, float] = (4.607, 1.463)  # × extra for turns 1-3 and 4-10
    growth_session_sigma: float = 0.3  # per-session growth scale exp(N(-s²/2, s))
    p_end_turn: float = 0.125
    think_tool: LogNormalMix = LogNormalMix(((0.7589, 7.70, 0.5198), (0.2411, 50.5, 1.3845)))
    think_user: LogNormalMix = LogNormalMix(((0.7056, 67.73, 1.463), (0.2944, 738.87, 1.474)))
    max_think_s: float = 6 * 3600.0
    ttft: LogNormalMix = LogNormalMix(((1.0, 2.156, 0.5041),))
    speed: LogNormalMix = LogNormalMix(((1.0, 60.92, 0.1828),))
    # hash id continuity beyond the partial block: extra full blocks dropped from the previous
    # turn's ids (1..4, 5..99 log-uniform) or a rewrite keeping only system+tools
    drop_p: tuple[float, ...] = (0.04138, 0.00497, 0.0015, 0.00042)
    drop_many_p: float = 0.00156
    rewrite_p: float = 0.0101
    # subagents
    p_subagents: float = 0.028  # observed 2.4%; sessions cut at their limit lose some
    subagent_extra_count: float = 3.0  # count = 1 + Poisson(this)
    sub_turns: LogNormalMix = LogNormalMix(((1.0, 9.61, 0.4679),))
    sub_system_tokens: LogNormalMix = LogNormalMix(((1.0, 900.0, 0.45),))
    sub_tool_tokens: tuple[float, float] = (7800.0, 300.0)  # normal mean, sd
    sub_u0: LogNormalMix = LogNormalMix(((1.0, 1141.6, 0.8076),))
    sub_extra: LogNormalMix = LogNormalMix(((1.0, 1746.4, 1.5684),))
    sub_out: LogNormalMix = LogNormalMix(((0.9197, 223.86, 0.4157), (0.0803, 3263.3, 0.3061)))
    sub_think: LogNormalMix = LogNormalMix(((0.6394, 3.53, 0.3395), (0.3606, 11.79, 1.1257)))


SWE = SweModel()
