"""Shape statistics of a TraceSet: what a workload looks like before it is replayed.

Distributions (`agentx.distribution`: count, mean, std, min, max, p10 ... p99, linear interpolation)
are over parent sessions and
their own turns; subagents are reported separately. Hit rates are the theoretical prefix-cache
hits implied by the hash_ids (block granularity, a turn's hit = the longest prefix of its ids
already cached × block_size, capped at its prompt):
  * in-session, infinite cache: per parent session (hit tokens / prompt tokens) and
    token-weighted over the set — an upper bound for any real cache;
  * `lru_hit_rate`: one cache of a given capacity with vLLM's eviction order
    (agentx.prefix_cache), the whole set replayed one session after another (parents and
    their subagents in step order) — how much a bounded cache keeps.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..distribution import dist
from ..prefix_cache import PrefixCache
from .model import Subagent, Trace, TraceSet, Turn
from .weka import common_prefix


def session_hits(turns: Sequence[Turn], block_size: int) -> list[int]:
    """Per-turn hit tokens with an infinite cache holding every block seen earlier in this
    conversation (the first turn hits nothing)."""
    seen: set[int] = set()
    prev: list[int] = []
    hits = []
    for turn in turns:
        ids = turn.hash_ids
        k0 = k = common_prefix(prev, ids)  # the previous turn's ids are all in `seen`
        while k < len(ids) and ids[k] in seen:
            k += 1
        hits.append(min(k * block_size, turn.in_tokens))
        seen.update(ids[k0:])
        prev = ids
    return hits


def _all_subagents(trace: Trace) -> Iterable[Subagent]:
    for s in trace.subagents:
        yield s
        yield from _all_subagents(s.trace)


def _shape(traces: Sequence[Trace]) -> dict:
    """Distributions shared by parents and subagents."""
    turns_n, first, last, growth, out, think, api = [], [], [], [], [], [], []
    shrinks = transitions = 0
    for tr in traces:
        turns = tr.turns
        if not turns:
            continue
        turns_n.append(len(turns))
        first.append(turns[0].in_tokens)
        last.append(turns[-1].in_tokens)
        for a, b in zip(turns, turns[1:]):
            d = b.in_tokens - a.in_tokens
            transitions += 1
            if d > 0:
                growth.append(d)
            elif d < 0:
                shrinks += 1
        for i, t in enumerate(turns):
            out.append(t.out_tokens)
            if i:
                think.append(t.think_time)
            if t.api_time is not None:
                api.append(t.api_time)
    return {"turns": turns_n, "first": first, "last": last, "growth": growth, "out": out,
            "think": think, "api": api, "shrinks": shrinks, "transitions": transitions}


def trace_stats(ts: TraceSet, lru_capacity_tokens: int | None = None) -> dict:
    """All shape figures of a set (layout documented in docs/traces.md)."""
    parents = ts.traces
    subs = [s.trace for tr in parents for s in _all_subagents(tr)]
    p, s = _shape(parents), _shape(subs)
    per_session_rate, hit_tok, in_tok = [], 0, 0
    for tr in parents:
        turns = tr.turns
        h, n = sum(session_hits(turns, tr.block_size)), sum(t.in_tokens for t in turns)
        hit_tok, in_tok = hit_tok + h, in_tok + n
        if n:
            per_session_rate.append(h / n)
    sub_counts = [sum(1 for _ in _all_subagents(tr)) for tr in parents]
    n_turns = sum(p["turns"])
    out = {
        "name": ts.name,
        "formats": sorted({t.reader for t in ts.traces if t.reader}),  # trace readers' kinds
        "sessions": len(parents),
        "turns": n_turns,
        "subagents": len(subs),
        "subagent_turns": sum(s["turns"]),
        "block_size": ts.block_size,
        "parent": {
            "turns_per_session": dist(p["turns"]),
            "first_prompt_tokens": dist(p["first"]),
            "last_prompt_tokens": dist(p["last"]),
            "system_tokens": dist([t.system_tokens for t in parents]),
            "tool_tokens": dist([t.tool_tokens for t in parents]),
            "input_growth_tokens": dist(p["growth"]),
            "output_tokens": dist(p["out"]),
            "think_time_s": dist(p["think"]),
            "api_time_s": dist(p["api"]),
            "subagents_per_session": dist(sub_counts),
            "prefix_hit_rate": dist(per_session_rate),
        },
        "subagent": {
            "turns_per_subagent": dist(s["turns"]),
            "first_prompt_tokens": dist(s["first"]),
            "last_prompt_tokens": dist(s["last"]),
            "input_growth_tokens": dist(s["growth"]),
            "output_tokens": dist(s["out"]),
            "think_time_s": dist(s["think"]),
            "api_time_s": dist(s["api"]),
        },
        "compaction_turns": p["shrinks"],
        "compaction_turn_fraction": p["shrinks"] / p["transitions"] if p["transitions"] else 0.0,
        "subagents_per_session": len(subs) / len(parents) if parents else 0.0,
        "subagents_per_100_turns": 100.0 * len(subs) / n_turns if n_turns else 0.0,
        "prefix_hit_rate_overall": hit_tok / in_tok if in_tok else 0.0,
        "lru": None,
    }
    if lru_capacity_tokens is not None:
        out["lru"] = {"capacity_tokens": lru_capacity_tokens,
                      "hit_rate": lru_hit_rate(ts, lru_capacity_tokens)}
    return out


def _replay_order(trace: Trace) -> Iterable[tuple[Trace, Turn]]:
    """Requests in the order one replay of the session sends them (subagents inline)."""
    for step in trace.steps:
        if isinstance(step, Subagent):
            yield from _replay_order(step.trace)
        else:
            yield trace, step


def lru_hit_rate(ts: TraceSet, capacity_tokens: int) -> float:
    """Token-weighted prefix hit rate of one cache of `capacity_tokens` (capacity_tokens //
    block_size blocks) over the whole set replayed sequentially, through the model of vLLM's
    eviction order the replay engine uses (agentx.prefix_cache: a request's tail blocks are
    evicted before its head).

    Block identity is (session, id) for "local" hash_id scope and the id alone for "global"
    (Mooncake). Capacity is counted in blocks of the set's block size. Cost: a few dict
    operations per block per request (~10-15 s for the 533-session real set)."""
    cache = PrefixCache(max(capacity_tokens // ts.block_size, 0))
    hit_tok = in_tok = 0
    # local ids of session i become id - lo_i + offset_i: unique ints (cheaper than tuples),
    # all above every global id, so mixed sets cannot alias
    offset = 1 + max((_id_range(tr)[1] for tr in ts.traces if tr.hash_id_scope == "global"),
                     default=-1)
    for tr in ts.traces:
        if tr.hash_id_scope != "global":
            lo, hi = _id_range(tr)
            off = offset - lo
            offset += hi - lo + 1
        for owner, turn in _replay_order(tr):
            ids = turn.hash_ids
            keys = ids if owner.hash_id_scope == "global" else [h + off for h in ids]
            hit_tok += min(cache.observe(keys) * owner.block_size, turn.in_tokens)
            in_tok += turn.in_tokens
    return hit_tok / in_tok if in_tok else 0.0


def _id_range(trace: Trace) -> tuple[int, int]:
    """Smallest and largest block id of a session (and its subagents); (0, 0) if none."""
    lo, hi = 0, 0
    for _, turn in _replay_order(trace):
        if turn.hash_ids:
            lo, hi = min(lo, min(turn.hash_ids)), max(hi, max(turn.hash_ids))
    return lo, hi
