"""Self-measurement of the client: is the load generator itself the bottleneck?

Loop lag: a task asks to wake every `interval_s` and records how late it woke; a busy event
loop delays every timestamp it takes by about that much. CPU: process CPU time over wall time
(1.0 = one core saturated; an asyncio client cannot use more than one). Run-queue wait: time
the loop's thread was ready but another process had its core (Linux schedstat) — other load
on the client's cores delays timestamps just like a busy loop, without showing up as CPU.
"""
from __future__ import annotations

import asyncio
import time

from ..aio import cancel_and_wait


def runqueue_wait_ns(native_tid: int | None = None) -> int | None:
    """Total ns a thread (default: the calling one; else a `threading.get_native_id()` of this
    process) has waited for a CPU while runnable (None: not Linux)."""
    path = "/proc/thread-self/schedstat" if native_tid is None else f"/proc/self/task/{native_tid}/schedstat"
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class LoopLagSampler:
    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None
        self._cpu0 = self._wall0 = 0.0
        self._wait0: int | None = None
        self.cpu_util: float | None = None
        self.runqueue_wait_ms_per_s: float | None = None

    async def _run(self) -> None:
        iv = self.interval_s
        lags = self.lags_ms
        while True:
            t = time.perf_counter()
            await asyncio.sleep(iv)
            lags.append(max(0.0, (time.perf_counter() - t - iv) * 1e3))

    def start(self) -> None:
        """Call on the event loop's thread (the run-queue wait is per thread)."""
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._wait0 = runqueue_wait_ns()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        wall = time.perf_counter() - self._wall0
        self.cpu_util = (time.process_time() - self._cpu0) / wall if wall > 0 else None
        w1 = runqueue_wait_ns()
        if w1 is not None and self._wait0 is not None and wall > 0:
            self.runqueue_wait_ms_per_s = (w1 - self._wait0) / 1e6 / wall
        await cancel_and_wait(self._task)
