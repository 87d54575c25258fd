"""Open-loop session arrivals (`--session-rate`, `--arrivals trace`): sessions start on a
schedule (plan.Planner.arrivals), not when a lane frees up.

Each arriving session is opened (history and first request built) before its arrival time,
then, once admitted, runs its turns with think times exactly as a lane's session does
(LaneEngine._arrived_session). `--max-active N` caps the sessions in progress: an arrival beyond
the cap waits, first come first served, and the wait is logged; its first request is then
due at its admission (the cap's wait is reported apart from dispatch lag). A stop cancels
the sessions still waiting. A trace's arrivals run out: the run ends (`trace_end`) when its
last session has finished.

Sessions take the place of lanes in the engine's bookkeeping: session k is "lane" k (its
records' `lane`), and the auto warm-up waits for the first `warm_n` sessions.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..session_plan import SessionPick
from ..trace.model import Subagent, Trace

perf_ns = time.perf_counter_ns


@dataclass
class SessionLog:
    """One arrived session: scheduled offset, arrival and admission instants, requests it
    would send if it ran to its end."""

    at_s: float
    arrive_ns: int
    admit_ns: int = 0  # 0: still waiting for the cap when the run stopped
    planned: int = 0
    wait_ns: int = 0  # how long it waited for a place under the cap (0: found one free)

    def row(self) -> tuple[float, int, int, int, int]:
        return (self.at_s, self.arrive_ns, self.admit_ns, self.planned, self.wait_ns)


def trace_requests(trace: Trace) -> int:
    """Requests a whole session sends, its subagents' included."""
    return sum(trace_requests(s.trace) if isinstance(s, Subagent) else 1 for s in trace.steps)


def planned_requests(op: Any) -> int:
    """Requests an opened session (lanes._Opened) sends from its first one to its end."""
    if op.pos is None:
        return 0
    return sum(trace_requests(s.trace) if isinstance(s, Subagent) else 1
               for s in op.conv.trace.steps[op.pos:])


@dataclass
class OpenLoop:
    arrivals: Iterator[tuple[float, SessionPick]]
    max_active: int | None
    warm_n: int  # the auto warm-up waits for this many first sessions' first requests
    log: list[SessionLog] = field(default_factory=list)

    async def run(self, engine: Any) -> None:
        """Start sessions at their arrival times (after engine.t_start_ns) until the engine
        stops or the arrivals run out; return when every started session has returned."""
        cap = asyncio.Semaphore(self.max_active) if self.max_active else None
        tasks: list[asyncio.Task] = []
        ran_out = True
        for k, (at_s, pick) in enumerate(self.arrivals):
            if engine.stopping:
                ran_out = False
                break
            due = engine.t_start_ns + int(at_s * 1e9)
            op = await engine._open(pick.trace, pick.instance, pick.start_turn, "")
            await engine._pause((due - perf_ns()) / 1e9)
            if engine.stopping:
                ran_out = False
                break
            log = SessionLog(at_s, perf_ns(), planned=planned_requests(op))
            self.log.append(log)
            tasks.append(asyncio.create_task(self._session(engine, cap, k, op, log, due),
                                             name=f"session-{k}"))
        if ran_out:  # a trace's last session has arrived: the run ends when all are done
            await asyncio.gather(*tasks, return_exceptions=True)
            engine.request_stop(reason="trace_end")
        await engine.wait_stopped()
        for t, log in zip(tasks, self.log):
            if not log.admit_ns:  # still waiting for the cap: never started
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _session(self, engine: Any, cap: asyncio.Semaphore | None, k: int, op: Any,
                       log: SessionLog, due: int) -> None:
        if cap is not None:
            if cap.locked():  # full: wait for a session to end (first come, first served)
                t = perf_ns()
                await cap.acquire()
                log.wait_ns = perf_ns() - t
            else:
                await cap.acquire()  # free: no yield, no wait
        try:
            log.admit_ns = perf_ns()
            if not engine.stopping:
                await engine._arrived_session(k, op, max(due, log.admit_ns))
        finally:
            if cap is not None:
                cap.release()
