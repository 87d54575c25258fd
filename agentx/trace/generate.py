"""Seeded generator of the built-in `swe` trace: synthetic Claude-Code-like sessions.

Why synthetic: the real traces are large and not ours to ship; a parametric model fitted to
their distributions gives a small, reproducible built-in workload with the same shape. Nothing
of the real data is embedded: every constant below is a fitted distribution parameter
(traces/README.md lists the targets, the fit method and the resulting figures).

Output is the native Weka/kv-cache-tester format, one JSON per session in a tar.xz, like the
real archive. Session model (per parent session):
  * class: fresh start (small first user context, long) or resumed work (large first context,
    shorter), each with a 200k or 1M context window; first prompt = system + tools + context;
  * every later turn adds the previous answer plus new input (tool result or user message):
    growth = out_{i-1} + 10 + extra, extra heavy tailed, larger in the first ten turns and
    scaled per session;
  * a 200k-window session whose prompt would pass its limit (~140-168k) either ends there or
    compacts; all sessions also compact (fresh: hard summaries) or trim (resumed: mild) at a
    small per-turn hazard. A compaction keeps system+tools and a fraction of the context;
  * think time: a tool delay, or after an end_turn answer a user delay (heavy tail, capped);
    api_time = ttft + out / decode speed;
  * hash_ids: ceil(in/64) ids; the next turn keeps the previous ids minus the last partial
    block (rarely a few more blocks, or only the system+tools prefix: a rewrite), then new
    ids; a compaction keeps only the system+tools prefix;
  * subagents: a few sessions spawn several `Explore`-like child sessions that share their own
    system+tools prefix ids; the parent's next think time includes the child's duration.
Sampling uses only `Generator.random()` uniforms and our own transforms, so the byte-identical
regeneration does not depend on numpy's distribution algorithms (only on its PCG64 stream).
"""
from __future__ import annotations

import io
import lzma
import math
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .weka import _Ctx, synth_hash_ids

SWE_SEED = 20251130
SWE_SESSIONS = 500
BLOCK = 64
MODEL_NAME = "synthetic-coder"
_TAR_MTIME = 1_700_000_000  # fixed so regeneration is byte-identical


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


# -- one session ------------------------------------------------------------------------------
@dataclass
class _Ids:
    """Trace-wide block id allocator (ids grow in document order, like the loader expects)."""

    next_id: int = 1
    sub_prefix: list[int] = field(default_factory=list)

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return out


def _continue_ids(d: Draw, m: SweModel, ids: _Ids, prev: list[int], prev_in: int, n_in: int,
                  base_blocks: int, rewrite: bool) -> list[int]:
    """Next turn's ids: the previous full blocks (minus rare extra drops, or only the system
    + tools prefix for a compaction / rewrite), then fresh ids up to ceil(n_in / 64)."""
    keep = min(len(prev), prev_in // BLOCK)  # the partial last block is new content now
    floor = min(keep, base_blocks)  # system + tools never change
    if rewrite:
        keep = min(keep, base_blocks)
    else:
        u, acc = d.u(), 0.0
        for k, p in enumerate(m.drop_p, 1):
            acc += p
            if u < acc:
                keep -= k
                break
        else:
            if u < acc + m.drop_many_p:
                keep -= int(math.exp(d.uniform(math.log(5), math.log(100))))
            elif u < acc + m.drop_many_p + m.rewrite_p:
                keep = min(keep, base_blocks)
    keep = min(max(keep, floor), n_in // BLOCK)
    return prev[:keep] + ids.fresh(-(-n_in // BLOCK) - keep)


def _api(d: Draw, m: SweModel, out: int) -> float:
    return round(m.ttft.draw(d) + out / m.speed.draw(d), 2)


def _subagent(d: Draw, m: SweModel, ids: _Ids, n: int, t: float, sys_t: int,
              tool_t: int) -> tuple[dict, float]:
    """One child session; returns its entry and its duration (s)."""
    base = sys_t + tool_t
    if not ids.sub_prefix:  # all subagents of a session share their system+tools blocks
        ids.sub_prefix = ids.fresh(base // BLOCK)
    n_turns = max(1, round(m.sub_turns.draw(d)))
    reqs, rt, prev_ids, prev_in, prev_out, prev_api = [], 0.0, [], 0, 0, 0.0
    for i in range(n_turns):
        out = max(1, round(m.sub_out.draw(d)))
        if i == 0:
            n_in = base + max(1, round(m.sub_u0.draw(d)))
            hid = ids.sub_prefix + ids.fresh(-(-n_in // BLOCK) - len(ids.sub_prefix))
            think = 0.0
        else:
            n_in = prev_in + prev_out + 10 + round(m.sub_extra.draw(d))
            hid = _continue_ids(d, m, ids, prev_ids, prev_in, n_in, base // BLOCK, False)
            think = round(m.sub_think.draw(d), 2)
            rt = round(rt + prev_api + think, 3)
        api = _api(d, m, out)
        reqs.append({"t": rt, "type": "n", "model": MODEL_NAME, "in": n_in, "out": out,
                     "hash_ids": hid, "api_time": api, "think_time": think,
                     "input_types": ["text"] if i == 0 else ["tool_result"],
                     "stop": "end_turn" if i == n_turns - 1 else "tool_use"})
        prev_ids, prev_in, prev_out, prev_api = hid, n_in, out, api
    entry = {"t": round(t, 3), "type": "subagent", "agent_id": f"agent_{n:03d}",
             "subagent_type": "Explore", "system_tokens": sys_t, "tool_tokens": tool_t,
             "requests": reqs}
    return entry, rt + prev_api


def _sample_positions(d: Draw, k: int, n: int, ordered: bool = False):
    """k distinct values of range(n) (partial Fisher-Yates): a set, or the list in draw order."""
    pool = list(range(n))
    for i in range(k):
        j = i + int(d.u() * (n - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k] if ordered else set(pool[:k])


KINDS = FRESH, FRESH_1M, RESUMED, RESUMED_1M_LONG, RESUMED_1M = (
    "fresh", "fresh_1m", "resumed", "resumed_1m_long", "resumed_1m")


def generate_session(d: Draw, index: int, seed: int, kind: str, with_subagents: bool,
                     p_first: float | None = None, p_turns: float | None = None,
                     m: SweModel = SWE) -> dict:
    """One parent session of class `kind` as a native Weka document (full hash_ids).
    `p_first` / `p_turns`: quantiles for the first context and turn count (stratified by the
    caller), else random."""
    resumed = kind not in (FRESH, FRESH_1M)
    large = kind in (FRESH_1M, RESUMED_1M_LONG, RESUMED_1M)
    u0_dist = {FRESH: m.u0_fresh, FRESH_1M: m.u0_fresh, RESUMED: m.u0_resumed_small,
               RESUMED_1M_LONG: m.u0_resumed_small, RESUMED_1M: m.u0_resumed_big}[kind]
    sys_t = min(9000, max(300, round(m.system_tokens.draw(d))))
    tool_t = min(20000, max(2000, round(m.tool_tokens.draw(d))))
    base = sys_t + tool_t
    limit = d.uniform(*(m.large_limit if large else m.std_limit))
    first = base + max(1, round(u0_dist.ppf(p_first) if p_first is not None
                                else u0_dist.draw(d)))
    for _ in range(50):  # a session starts below its compaction limit
        if first < 0.97 * limit:
            break
        first = base + max(1, round(u0_dist.draw(d)))
    first = min(first, int(0.97 * limit))
    turns = {FRESH: m.turns_fresh, FRESH_1M: m.turns_long, RESUMED: m.turns_resumed,
             RESUMED_1M_LONG: m.turns_long, RESUMED_1M: m.turns_resumed}[kind]
    scale = 1.0 if large else m.turns_scale[resumed]
    n_raw = turns.ppf(p_turns) if p_turns is not None else turns.draw(d)
    n_turns = min(2000, max(1, round(n_raw * scale)))
    subs: set[int] = set()
    if n_turns >= 2 and with_subagents:
        k = min(n_turns - 1, 1 + d.poisson(m.subagent_extra_count))
        subs = _sample_positions(d, k, n_turns - 1)
    sub_sys = min(4000, max(200, round(m.sub_system_tokens.draw(d)))) if subs else 0
    sub_tool = max(1000, round(m.sub_tool_tokens[0] + m.sub_tool_tokens[1] * d.normal())) \
        if subs else 0

    hazard = m.hazard[KINDS.index(kind)]
    sig = m.growth_session_sigma
    g_scale = math.exp(sig * d.normal() - sig * sig / 2)
    ids = _Ids()
    reqs: list[dict] = []
    t, prev_ids, prev_in, prev_out, prev_api, prev_end = 0.0, [], 0, 0, 0.0, False
    waited = 0.0  # subagent time the next parent turn waits for
    for i in range(n_turns):
        out = max(1, round(m.out.draw(d)))
        if i == 0:
            n_in, hid, think, types = first, ids.fresh(-(-first // BLOCK)), 0.0, ["text"]
        else:
            user = prev_end
            raw = (m.think_user if user else m.think_tool).draw(d)
            think = round(min(m.max_think_s, raw) + waited, 2)
            types = ["text"] if user else ["tool_result"]
            boost = m.early_boost[0] if i <= 3 else m.early_boost[1] if i <= 10 else 1.0
            grown = prev_in + prev_out + 10 + round(m.extra.draw(d) * boost * g_scale)
            forced = grown > limit
            if forced and d.u() < m.p_end_at_limit[resumed]:
                break
            compact = forced or d.u() < hazard
            if compact:
                rel = (m.rel_resumed if resumed and not forced else m.rel_fresh).draw(d)
                n_in = max(base + 500, min(prev_in - 1, round(rel * prev_in)))
            else:
                n_in = grown
            if n_in >= prev_in:  # tiny contexts cannot shrink below system+tools: grow
                compact = False
            hid = _continue_ids(d, m, ids, prev_ids, prev_in, n_in, base // BLOCK, compact)
            t = round(t + prev_api + think, 3)
        waited = 0.0
        api = _api(d, m, out)
        end = i == n_turns - 1 or (i not in subs and d.u() < m.p_end_turn)
        reqs.append({"t": t, "type": "n", "model": MODEL_NAME, "in": n_in, "out": out,
                     "hash_ids": hid, "api_time": api, "think_time": think,
                     "input_types": types, "stop": "end_turn" if end else "tool_use"})
        if i in subs:
            entry, dur = _subagent(d, m, ids, len(reqs) - i, t + api, sub_sys, sub_tool)
            reqs.append(entry)
            waited = dur
        prev_ids, prev_in, prev_out, prev_api, prev_end = hid, n_in, out, api, end
    while reqs[-1]["type"] == "subagent":  # ended at the limit right after spawning one
        reqs.pop()
    reqs[-1]["stop"] = "end_turn"
    return {"id": f"swe_{index + 1:04d}", "models": [MODEL_NAME], "block_size": BLOCK,
            "hash_id_scope": "local", "tool_tokens": tool_t, "system_tokens": sys_t,
            "generator": {"name": "agentx.trace.generate", "seed": seed, "index": index},
            "requests": reqs}


def generate_sessions(seed: int = SWE_SEED, n: int = SWE_SESSIONS,
                      m: SweModel = SWE) -> list[dict]:
    """`n` sessions. Variance reduction, so a few hundred sessions already show the model's
    distributions: the session classes (and which sessions spawn subagents) get exact counts
    in random order, and within a class the first-context and turn-count draws are
    Latin-hypercube quantiles. Leaving these to chance moves the medians and p90s of the
    multi-modal prompt sizes by 10-20% at n = 500."""
    d = Draw(seed)
    n_res = round(n * m.p_resumed)
    n_res_1m = round(n_res * m.p_resumed_big_start)
    n_res_long = round((n_res - n_res_1m) * m.p_large_resumed_small)
    n_fresh_1m = round((n - n_res) * m.p_large_fresh)
    kinds = ([RESUMED_1M] * n_res_1m + [RESUMED_1M_LONG] * n_res_long
             + [RESUMED] * (n_res - n_res_1m - n_res_long) + [FRESH_1M] * n_fresh_1m
             + [FRESH] * (n - n_res - n_fresh_1m))
    order = _sample_positions(d, n, n, ordered=True)
    with_subs = _sample_positions(d, round(n * m.p_subagents), n)
    session_kind = [kinds[order[i]] for i in range(n)]
    p_first, p_turns = [0.0] * n, [0.0] * n
    for kind in KINDS:  # Latin-hypercube quantiles of first context and turns, per class
        members = [i for i in range(n) if session_kind[i] == kind]
        for target in (p_first, p_turns):
            perm = _sample_positions(d, len(members), len(members), ordered=True)
            for j, i in enumerate(members):
                target[i] = (perm[j] + d.u()) / len(members)
    return [generate_session(d, i, seed, session_kind[i], i in with_subs, p_first[i],
                             p_turns[i], m=m) for i in range(n)]


# -- writing ----------------------------------------------------------------------------------
def omit_implied_hash_ids(doc: dict) -> dict:
    """Drop every turn's hash_ids that the loader's fallback rebuilds identically (the usual
    "previous ids minus the partial block + new ids"): same trace once loaded, ~15x less JSON
    to parse. Walks the requests in document order exactly like agentx.trace.weka."""
    ctx = _Ctx(source="", trace_id="", block_size=doc["block_size"], scope="local")

    def walk(reqs: list[dict]) -> None:
        prev_ids: list[int] = []
        prev_in = 0
        have_prev = False
        for r in reqs:
            if r.get("type") == "subagent":
                walk(r["requests"])
                continue
            ids = r["hash_ids"]
            implied = synth_hash_ids(prev_ids if have_prev else [], prev_in, r["in"],
                                     _Ctx("", "", ctx.block_size, "local", ctx.next_id))
            if implied == ids:
                del r["hash_ids"]
            if ids:
                ctx.next_id = max(ctx.next_id, max(ids) + 1)
            prev_ids, prev_in, have_prev = ids, r["in"], True

    walk(doc["requests"])
    return doc


def archive_bytes(docs: list[dict]) -> bytes:
    """Deterministic tar.xz of one `<id>.json` per session (fixed metadata, sorted)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for doc in sorted(docs, key=lambda x: x["id"]):
            data = orjson.dumps(doc)
            info = tarfile.TarInfo(f"{doc['id']}.json")
            info.size, info.mtime, info.mode = len(data), _TAR_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    return lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME)


def write_swe(out: Path, seed: int = SWE_SEED, n: int = SWE_SESSIONS,
              full_hash_ids: bool = False) -> Path:
    """Generate and write the archive; the defaults reproduce traces/swe.tar.xz exactly."""
    docs = generate_sessions(seed, n)
    if not full_hash_ids:
        docs = [omit_implied_hash_ids(doc) for doc in docs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(archive_bytes(docs))
    return out
