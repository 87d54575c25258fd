"""The cache-cliff planner: the prefix-cache hit rate a trace would get per tier (GPU pool,
offload tier) as the number of session lanes grows, and the lane count where each tier's
hits collapse (docs/metrics.md#cache-cliff-planner-2026-12-03).

For each lane count, a virtual-clock replay of that many closed-loop lanes goes through the
pool-aware model the replay engine uses for every request's expected hits
(`prefix_cache.TieredCache`, keys from `Conversation.block_keys`): each lane replays the
sessions the run's planner would pick (same seed, same start turns), sends its warm-up prime,
then every turn after its think time (scaled and capped as a run does), each request lasting
its trace `api_time` (else `request_s`). Requests in flight hold their blocks, as in a server.
Measured: the requests sent after every lane's first request finished, up to `duration_s`.
Not modelled: the server's speed at that load (a slower server stretches every gap alike, so
the order of requests, and with it the hits, barely moves), subagents (their turns are left
out), chunked connectors' granularity.

A tier's cliff is the first lane count whose hit rate on that tier falls below half the best
it reached at fewer lanes; `holds_to` is the lane count before it.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ..prefix_cache import TieredCache
from ..prompt.synth import Conversation, SynthConfig
from ..prompt.token_model import builtin_model
from ..session_plan import Planner
from ..trace.model import TraceSet, Turn

COLLAPSE = 0.5  # a tier's hits fall below this share of their best so far: the cliff


@dataclass(frozen=True)
class Replay:
    """How the virtual lanes replay the trace (the run options that shape reuse distance)."""

    seed: int = 0
    think_scale: float = 1.0
    max_think_s: float = 30.0
    request_s: float = 1.0  # a request's duration where the trace records no api_time
    duration_s: float = 600.0
    start_min: float = 0.25
    start_max: float = 0.75
    context_scale: float = 1.0
    shared_prefix: str = "none"


def predict(traces: TraceSet, lanes: int, pool_tokens: int, tier_tokens: int | None,
            eager: bool, r: Replay) -> dict:
    """Hit rates at `lanes` lanes: {"lanes", "requests", "hit_rate", "gpu", "offload"}
    (token-weighted over the measured requests; tiers None when there is no tier)."""
    bs = traces.block_size * r.context_scale
    cache = TieredCache(int(pool_tokens / bs), int(tier_tokens / bs) if tier_tokens else None,
                        eager, queue=True)
    planner = Planner(traces, r.seed, r.start_min, r.start_max)
    tm = builtin_model()
    cfg = SynthConfig(run_ns="cliff", shared_prefix=r.shared_prefix,
                      context_scale=r.context_scale)
    # per lane: its session's own turns from its prime (start - 1) on, and how far it is
    state: dict[int, list] = {}
    events: list[tuple[float, int, int, object]] = []  # (time, order, lane, admission | None)
    seq = 0

    def open_session(lane: int, n: int) -> None:
        pick = planner.pick(lane, n)
        turns = [s for s in pick.trace.steps if isinstance(s, Turn)]
        first = max(0, pick.start_turn - 1)
        state[lane] = [Conversation(pick.trace, pick.instance, cfg, tm), turns, first, n,
                       pick.start_turn]

    def send(lane: int, t: float) -> None:
        nonlocal seq
        conv, turns, i, _, start = state[lane]
        turn = turns[i]
        a = cache.submit(conv.block_keys(turn.hash_ids))
        dur = turn.api_time if turn.api_time else r.request_s
        seq += 1
        heapq.heappush(events, (t + dur, seq, lane, (a, turn, i < start)))

    first_done: set[int] = set()
    t_measure = None
    hit = tier = total = n_req = 0
    for lane in range(lanes):
        open_session(lane, 0)
        send(lane, 0.0)
    while events:
        t, _, lane, (a, turn, prime) = heapq.heappop(events)
        if t > r.duration_s:
            break
        cache.settle(a)
        if t_measure is not None and not prime:
            n_in = turn.in_tokens * r.context_scale
            hit += min(n_in, (a.hits or 0) * bs)
            tier += min(n_in, a.tier_hits * bs)
            total += n_in
            n_req += 1
        cache.finish(a)
        first_done.add(lane)
        if t_measure is None and len(first_done) == lanes:
            t_measure = t
        st = state[lane]
        st[2] += 1
        if st[2] >= len(st[1]):  # the session is over: the lane's next one, due now
            open_session(lane, st[3] + 1)
            send(lane, t)
            continue
        think = min(st[1][st[2]].think_time * r.think_scale, r.max_think_s)
        send(lane, t + think)
    has_tier = bool(tier_tokens)
    return {"lanes": lanes, "requests": n_req,
            "hit_rate": hit / total if total else None,
            "gpu": (hit - tier) / total if total else None,
            "offload": tier / total if total and has_tier else None}


def cliffs(points: Sequence[dict], keys: Sequence[str] = ("gpu", "offload", "hit_rate")
           ) -> dict[str, dict | None]:
    """Per tier: {"at": the first lane count whose hit rate fell below COLLAPSE x the best
    at fewer lanes, "holds_to": the lane count before it, "from", "to": the rates}; None
    when it never collapsed over these lane counts."""
    out: dict[str, dict | None] = {}
    pts = sorted(points, key=lambda p: p["lanes"])
    for k in keys:
        best, prev, found = None, None, None
        for p in pts:
            v = p.get(k)
            if v is None:
                continue
            if best is not None and best > 0 and v < COLLAPSE * best:
                found = {"at": p["lanes"], "holds_to": prev["lanes"], "from": prev[k], "to": v}
                break
            best = v if best is None else max(best, v)
            prev = p
        out[k] = found
    return out
