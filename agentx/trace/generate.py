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

import orjson

from .swe_model import SWE, Draw, SweModel
from .weka import _Ctx, synth_hash_ids

SWE_SEED = 20251130
SWE_SESSIONS = 500
BLOCK = 64
MODEL_NAME = "synthetic-coder"
_TAR_MTIME = 1_700_000_000  # fixed so regeneration is byte-identical


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
