"""Session plan: which trace a lane replays next, and from which turn (seeded, reproducible).

Every choice comes from a RNG seeded by (seed, lane, pick number), so a lane's schedule does
not depend on how fast other lanes run, and the same --seed replays the same sessions.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .prompt.blocks import stable_seed
from .trace.model import Trace, TraceSet


@dataclass(frozen=True)
class SessionPick:
    trace: Trace
    start_turn: int  # index into trace.turns of the first measured turn
    instance: str  # unique id of this replay of the trace, e.g. "L3.7"


@dataclass
class Planner:
    traces: TraceSet
    seed: int = 0
    start_min: float = 0.25
    start_max: float = 0.75

    def pick(self, lane: int, n: int) -> SessionPick:
        rng = random.Random(stable_seed("pick", self.seed, lane, n))
        trace = self.traces.traces[rng.randrange(len(self.traces.traces))]
        turns = len(trace.turns)
        lo = int(self.start_min * turns)
        hi = max(lo, int(self.start_max * turns))
        start = rng.randint(lo, hi) if turns > 1 else 0
        return SessionPick(trace, min(start, max(0, turns - 1)), f"L{lane}.{n}")


def split_count(n: int | None, shares: list[int]) -> list[int | None]:
    """Split a request budget proportionally to `shares` (workers' lane counts, or one per
    lane): fixed shares keep the set of requests sent independent of timing."""
    if n is None:
        return [None] * len(shares)
    total = sum(shares)
    out = [n * s // total for s in shares]
    for i in range(n - sum(out)):
        out[i % len(out)] += 1
    return out
