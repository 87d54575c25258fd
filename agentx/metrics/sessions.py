"""Per-session and per-turn results: pure functions over the request records.

An agentic run is sessions, but a latency table is per request. Here a session is one replay
of a trace by a lane (or an open-loop arrival): its own requests and those of the subagents it
spawned (`session_id` `<run>-<instance>[/<agent>]`, grouped by the part before `/`), without
the lane's warm-up "prime" request (the turn before its start turn, sent to warm the cache).
Per turn, the measured requests of the sessions' own turns are binned by turn index in the
trace and by prompt length (the context grows every turn): TTFT and the achieved hit rate by
bin, with n per bin. TTFT and hit rate are the catalog's (`catalog.dist_named("ttft_ms")`,
the `hit_rate` ratio), so a bin's figure means what the run's figure means
(docs/metrics.md#per-session-and-per-turn-results-2026-12-03).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..distribution import dist
from ..records import record_problem
from .catalog import RATIOS, dist_named
from .definitions import prompt_tokens

HIT = next(m for m in RATIOS if m.key == "hit_rate")
TTFT = dist_named("ttft_ms")
SESSION_DISTS = ("turns", "requests", "wall_s", "server_s", "think_s", "server_share",
                 "input_tokens", "output_tokens", "hit_rate", "ttft_ms_mean")
DEFINITION = ("sessions that ran to their trace's last turn (or, the trace unknown, were "
              "followed by another session on their lane) with every request measured; wall = "
              "first turn due -> last response, server = time some request of the session was "
              "in flight, think = wall - server")


def root_session(sid: str, roots: set[str]) -> str:
    """The session a record belongs to. A subagent's session id is `<parent
    instance>.<agent>[...]/<agent>` (engine/lanes.py): its records belong to the nearest
    ancestor among `roots` (the ids of sessions' own requests); itself when none is there."""
    base = sid.split("/")[0]
    if "/" not in sid:
        return base
    cut = base
    while "." in cut:
        cut = cut.rsplit(".", 1)[0]
        if cut in roots:
            return cut
    return base


def _measured(r: Mapping) -> bool:
    return bool(r.get("ok")) and not r.get("warmup") and not record_problem(r)


def busy_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals: time at least one was in flight
    (a subagent's requests may overlap its parent's)."""
    total, cur_a, cur_b = 0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (cur_b - cur_a if cur_b is not None else 0)


def session_rows(records: Sequence[Mapping], last_turns: Mapping[str, int] | None = None
                 ) -> list[dict]:
    """One row per session that sent at least one request besides its prime, in order of its
    first request. `last_turns`: trace id -> index of its last turn (the trace's turns - 1),
    which decides `complete`; a trace missing from it falls back to the lane rule (a later
    session on the same lane means this one reached its end), else `complete` is None."""
    sent = [r for r in records if r.get("kind", "turn") != "prime" and r.get("start_ns")]
    roots = {str(r.get("session_id")) for r in records if "/" not in str(r.get("session_id"))}
    groups: dict[str, list[Mapping]] = {}
    for r in sent:
        groups.setdefault(root_session(str(r.get("session_id") or ""), roots), []).append(r)
    rows = []
    for sid, reqs in groups.items():
        reqs.sort(key=lambda r: r["start_ns"])
        own = [r for r in reqs if "/" not in str(r.get("session_id"))]
        ok = [r for r in reqs if r.get("ok") and not record_problem(r)]
        first = own[0] if own else reqs[0]
        t0 = min(r.get("intended_send_ns") or r["start_ns"] for r in reqs)
        t1 = max(r["end_ns"] for r in reqs)
        wall = max(0, t1 - t0)
        server = busy_ns((r["start_ns"], max(r["start_ns"], r["end_ns"])) for r in reqs)
        trace_id = str(first.get("trace_id") or "")
        last = max((r["turn"] for r in own), default=None)
        complete = None
        if last_turns is not None and trace_id in last_turns and own:
            complete = last == last_turns[trace_id] and bool(own[-1].get("ok"))
        inp = sum(prompt_tokens(r) for r in ok)
        rows.append({
            "session_id": sid, "trace_id": trace_id, "lane": first.get("lane"),
            "first_turn": min((r["turn"] for r in own), default=None), "last_turn": last,
            "turns": len(own), "requests": len(reqs), "subagent_requests": len(reqs) - len(own),
            "failed": sum(1 for r in reqs if not r.get("ok")),
            "warmup_requests": sum(1 for r in reqs if r.get("warmup")),
            "measured": all(_measured(r) for r in reqs), "complete": complete,
            "start_ns": t0, "end_ns": t1,
            "wall_s": wall / 1e9, "server_s": server / 1e9, "think_s": max(0, wall - server) / 1e9,
            "server_share": server / wall if wall else None,
            "input_tokens": inp, "output_tokens": sum(r.get("osl") or 0 for r in ok),
            "cached_tokens": sum(r.get("cached_tokens") or 0 for r in ok),
            "hit_rate": HIT.over(ok, 0.0),
            "ttft_ms_mean": _mean([v for r in ok for v in TTFT.values(r)]),
        })
    _lane_rule(rows)
    rows.sort(key=lambda x: x["start_ns"])
    return rows


def _lane_rule(rows: list[dict]) -> None:
    """`complete` still unknown: True when a later session started on the same lane (a lane
    opens its next session only once this one's last turn was sent and answered)."""
    by_lane: dict[object, list[dict]] = {}
    for x in rows:
        by_lane.setdefault(x["lane"], []).append(x)
    for lane_rows in by_lane.values():
        lane_rows.sort(key=lambda x: x["start_ns"])
        for x, nxt in zip(lane_rows, lane_rows[1:]):
            if x["complete"] is None and nxt["start_ns"] >= x["end_ns"]:
                x["complete"] = bool(x["turns"]) and x["failed"] == 0


def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None


def session_summary(rows: Sequence[Mapping]) -> dict:
    """summary.json `per_session`: how many sessions ran, how many count (complete and wholly
    measured), and the distribution over those of each per-session figure."""
    counted = [x for x in rows if x["complete"] and x["measured"]]
    return {"sessions": len(rows), "complete": sum(1 for x in rows if x["complete"]),
            "counted": len(counted), "definition": DEFINITION,
            **{k: dist(x[k] for x in counted) for k in SESSION_DISTS}}


# -- per turn -----------------------------------------------------------------------------
def pow2_bins(v: int) -> tuple[int, int]:
    """[lo, hi] of the bin holding v: 0, 1, 2-3, 4-7, 8-15, ... (the turn index and the
    context grow geometrically in a long session; each bin keeps enough requests)."""
    if v <= 0:
        return 0, 0
    lo = 1 << (int(v).bit_length() - 1)
    return lo, 2 * lo - 1


def turn_bins(records: Sequence[Mapping], axis: str) -> list[dict]:
    """The measured requests of the sessions' own turns (no subagents, no warm-up), binned by
    `axis` ("turn": turn index in the trace; "context": prompt tokens) in pow2_bins; per bin
    n, TTFT (the catalog's distribution, with --percentiles' defaults), the achieved hit rate
    over the requests that report cached tokens, and the mean prompt length."""
    key = (lambda r: r["turn"]) if axis == "turn" else prompt_tokens
    bins: dict[tuple[int, int], list[Mapping]] = {}
    for r in records:
        if _measured(r) and r.get("kind", "turn") == "turn" and "/" not in str(r.get("session_id")):
            bins.setdefault(pow2_bins(int(key(r))), []).append(r)
    out = []
    for (lo, hi), rs in sorted(bins.items()):
        ttft = dist(v for r in rs for v in TTFT.values(r))
        out.append({"axis": axis, "lo": lo, "hi": hi, "n": len(rs),
                    "ttft_n": ttft["count"], "ttft_p50_ms": ttft["p50"],
                    "ttft_p90_ms": ttft["p90"], "ttft_mean_ms": ttft["mean"],
                    "hit_rate": HIT.over(rs, 0.0),
                    "hit_n": sum(1 for r in rs if r.get("cached_tokens") is not None),
                    "prompt_tokens_mean": sum(map(prompt_tokens, rs)) / len(rs)})
    return out


def per_turn(records: Sequence[Mapping]) -> dict:
    """summary.json `per_turn`: the bins by turn index and by prompt length."""
    return {"by_turn": turn_bins(records, "turn"), "by_context": turn_bins(records, "context")}


def bin_label(b: Mapping) -> str:
    """`4-7`, or `8k-16k` tokens for a context bin."""
    def k(v: int) -> str:
        return f"{v / 1024:g}k" if b["axis"] == "context" and v >= 1024 else str(v)
    if b["lo"] == b["hi"]:
        return k(b["lo"])
    hi = b["hi"] + 1 if b["axis"] == "context" else b["hi"]
    return f"{k(b['lo'])}-{k(hi)}" if b["axis"] == "context" else f"{b['lo']}-{hi}"
