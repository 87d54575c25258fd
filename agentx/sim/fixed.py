"""Fidelity mode (--fixed-ttft-ms / --fixed-itl-ms): no batching model, exact delays.

Every request gets its first token `fixed_ttft` after its arrival and one more chunk every
`fixed_itl` (both divided by time_scale), independently of the others, so a client's
measured TTFT and ITL can be compared with known true values (bench/fidelity.py). With
speculative decoding a chunk carries 1 + the accepted drafts.
"""
from __future__ import annotations

import asyncio
import time

from ..aio import sleep_until
from .engine import SimEngine
from .request import FINISHED, RUNNING, SimRequest


class FixedDelayEngine(SimEngine):
    """The engine in fidelity mode: its task starts a timer task per admitted request instead of
    stepping a batch (sim/build.py builds it when --fixed-ttft-ms is set)."""

    def __init__(self, *, fixed_ttft_s: float, fixed_itl_s: float, **engine) -> None:
        super().__init__(**engine)
        self.fixed_ttft = fixed_ttft_s
        self.fixed_itl = fixed_itl_s

    async def _run(self) -> None:
        await run_fixed(self)


async def run_fixed(eng: FixedDelayEngine) -> None:
    """The engine's task in fidelity mode: start a timer task per admitted request."""
    loop = asyncio.get_running_loop()
    timers: set[asyncio.Task] = set()  # referenced until done (the loop keeps weak refs only)
    while True:
        eng.wake.clear()
        while eng.waiting:
            req = eng.waiting.popleft()
            req.state = RUNNING
            req.scheduled_ns = time.perf_counter_ns()
            eng.stats.on_scheduled(req)
            task = loop.create_task(_one(eng, req))
            timers.add(task)
            task.add_done_callback(timers.discard)
        eng._count_waiting()
        await eng.wake.wait()


async def _one(eng: FixedDelayEngine, req: SimRequest) -> None:
    t = req.arrival_ns / 1e9 + eng.fixed_ttft / eng.scale
    eng.stats.on_prefix_lookup(req.prompt_len, 0, 0, eng.offload is not None)
    while not req.aborted:
        await sleep_until(t)
        if req.aborted:
            break
        gen = 1 if req.num_out == 0 or eng.acceptance is None else 1 + eng.acceptance.draw()
        if req.num_out > 0 and eng.acceptance is not None:
            eng.stats.on_drafts(eng.k, gen - 1)
        gen, finish = eng.emit_tokens(req, gen, time.perf_counter_ns())
        if finish is not None:
            req.finish = finish
            req.state = FINISHED
            req.push(gen, finish)
            eng.stats.on_finish(req)
            return
        req.push(gen, None)
        t += eng.fixed_itl / eng.scale
    req.state = FINISHED
