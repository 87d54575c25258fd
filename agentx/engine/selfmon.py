"""Self-measurement of the client: is the load generator itself the bottleneck?

Loop lag: a task asks to wake every `interval_s` and records how late it woke; a busy event
loop delays every timestamp it takes by about that much. CPU: process CPU time over wall time
(1.0 = one core saturated; an asyncio client cannot use more than one).
"""
from __future__ import annotations

import asyncio
import time


class LoopLagSampler:
    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None
        self._cpu0 = self._wall0 = 0.0
        self.cpu_util: float | None = None

    async def _run(self) -> None:
        iv = self.interval_s
        lags = self.lags_ms
        while True:
            t = time.perf_counter()
            await asyncio.sleep(iv)
            lags.append(max(0.0, (time.perf_counter() - t - iv) * 1e3))

    def start(self) -> None:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        wall = time.perf_counter() - self._wall0
        self.cpu_util = (time.process_time() - self._cpu0) / wall if wall > 0 else None
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
