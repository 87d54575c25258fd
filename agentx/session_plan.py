"""Session plan: which trace a lane replays next, and from which turn (seeded, reproducible);
in open loop also when each session arrives.

Every choice comes from a RNG seeded by (seed, lane, pick number), so a lane's schedule does
not depend on how fast other lanes run, and the same --seed replays the same sessions. Open-loop
arrival times come from their own RNG seeded by the seed alone, so the same --seed gives the
same arrival times whatever the server does.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import InputError
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
        """Lane `lane`'s n-th session: a random trace from a random turn (closed loop)."""
        return self._pick(random.Random(stable_seed("pick", self.seed, lane, n)), f"L{lane}.{n}")

    def _pick(self, rng: random.Random, instance: str) -> SessionPick:
        trace = self.traces.traces[rng.randrange(len(self.traces.traces))]
        turns = len(trace.turns)
        lo = int(self.start_min * turns)
        hi = max(lo, int(self.start_max * turns))
        start = rng.randint(lo, hi) if turns > 1 else 0
        return SessionPick(trace, min(start, max(0, turns - 1)), instance)

    def arrivals(self, mode: str, rate: float | None = None, burstiness: float = 1.0,
                 time_scale: float = 1.0) -> Iterator[tuple[float, SessionPick]]:
        """Open loop: (seconds after the run's start, session) per arriving session, in
        arrival order; the same for the same seed. poisson: session k is picked as a lane
        picks (a random trace from a random turn, instance `Sk`); trace: every session of
        the trace once, whole, at its own start time x time_scale."""
        if mode == "trace":
            for k, (at, i) in enumerate(trace_times(self.traces, time_scale)):
                yield at, SessionPick(self.traces.traces[i], 0, f"S{k}")
            return
        for k, at in enumerate(poisson_times(self.seed, rate or 1.0, burstiness)):
            yield at, self._pick(random.Random(stable_seed("session", self.seed, k)), f"S{k}")


def poisson_times(seed: int, rate: float, burstiness: float = 1.0) -> Iterator[float]:
    """Arrival offsets (s), the first at 0: gaps drawn from a gamma distribution with shape
    `burstiness` and scale 1 / (rate x burstiness), as vllm bench serve's --burstiness
    (benchmarks/serve.py, get_request): the mean gap stays 1 / rate; shape 1 is the
    exponential (a Poisson process), below 1 burstier, above 1 more even."""
    rng = random.Random(stable_seed("arrivals", seed))
    scale = 1.0 / (rate * burstiness)
    t = 0.0
    while True:
        yield t
        t += rng.gammavariate(burstiness, scale)


def trace_times(traces: TraceSet, time_scale: float = 1.0) -> list[tuple[float, int]]:
    """(offset s, index into traces.traces) per session in start order, the earliest at 0:
    each session's own start time in the trace (Trace.start_s) times `time_scale`."""
    if any(t.start_s is None for t in traces.traces):
        raise InputError(traces.name, "--arrivals trace needs session start times, which "
                         "Mooncake, AIPerf (with timestamps), Bailian and OTel traces have (use "
                         "--session-rate)", field="--arrivals")
    order = sorted(range(len(traces.traces)), key=lambda i: (traces.traces[i].start_s, i))
    t0 = traces.traces[order[0]].start_s if order else 0.0
    return [((traces.traces[i].start_s - t0) * time_scale, i) for i in order]


# --warmup auto in open loop ends when the sessions arriving in this many seconds (at most
# --max-active of them) have each finished their first request (docs/metrics.md)
OPEN_WARMUP_S = 30.0


def warm_sessions(times: Iterable[float], max_active: int | None) -> int:
    """How many first sessions an open-loop auto warm-up waits for: those arriving before
    OPEN_WARMUP_S, at most max_active, at least one."""
    n = 0
    for t in times:
        if t >= OPEN_WARMUP_S or (max_active is not None and n >= max_active):
            break
        n += 1
    return max(1, n)


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
