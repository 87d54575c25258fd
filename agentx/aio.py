"""Small asyncio helpers shared by the client, the worker processes and the simulator: one
place that picks the event loop, runs a coroutine on it, installs the stop signals, sleeps to
a deadline, runs stepped computations and cancels background tasks."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Generator
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _uvloop() -> ModuleType | None:
    """uvloop when installed (cheaper per socket read and per chunk written), else None.

    Imported here, before any loop runs: an ImportError raised later, inside a run, is that
    run's error and must surface as such, not be taken for a missing uvloop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop: uvloop's when installed, else asyncio's default."""
    uv = _uvloop()
    return uv.new_event_loop() if uv is not None else asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on a uvloop loop when installed. A Ctrl-C before the loop starts
    the coroutine (while uvloop imports or the loop is made) closes it unstarted: else Python
    prints "coroutine ... was never awaited" under agentx's one-line "interrupted"."""
    try:
        uv = _uvloop()
        return uv.run(coro) if uv is not None else asyncio.run(coro)
    except BaseException:
        if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            coro.close()
        raise


def install_stop_signals(loop: asyncio.AbstractEventLoop, request_stop: Callable[[bool], None],
                         notice: str | None = None) -> None:
    """First SIGINT/SIGTERM: `request_stop(False)` (stop and drain, bounded); any later one:
    `request_stop(True)` (cancel in-flight now). `notice` is printed on the first."""
    count = 0

    def handler() -> None:
        nonlocal count
        count += 1
        if count == 1 and notice:
            print(notice, file=sys.stderr)
        request_stop(count > 1)

    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


def remove_stop_signals(loop: asyncio.AbstractEventLoop) -> None:
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(sig)
    if _term_interrupts:  # the loop put back SIG_DFL: SIGTERM interrupts again, as before it
        signal.signal(signal.SIGTERM, _interrupt)


_term_interrupts = False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def term_interrupts() -> None:
    """From now on SIGTERM interrupts this process as SIGINT does (KeyboardInterrupt where no
    loop handles it, the run's drain where one does): a SIGTERM during start-up or after the
    drain exits 130 with one line, not 143 in silence. Main thread only."""
    global _term_interrupts
    _term_interrupts = True
    signal.signal(signal.SIGTERM, _interrupt)


SPIN_S = 0.0003  # wake this early and yield-spin to the deadline (loop timers: 1 ms granularity)


async def sleep_until(deadline: float) -> None:
    """Sleep to an absolute time.perf_counter() deadline: a timer sleep to just before it,
    then yield-spin. Always yields at least once, so other tasks (HTTP handlers between
    simulator steps) run."""
    while True:
        d = deadline - time.perf_counter()
        if d > SPIN_S:
            await asyncio.sleep(d - SPIN_S)
            continue
        await asyncio.sleep(0)
        if d <= 0:
            return


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has really finished."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# A stepped computation is a generator that yields (None) between steps of bounded cost and
# returns its result: the loop runs it one step per turn (`run_steps_async`), so a long build
# delays the other lanes' timestamps by one step, not by all of it; tests and one-off callers
# run it at once (`run_steps`).
Steps = Generator[None, None, T]


def run_steps(steps: Steps[T]) -> T:
    """A stepped computation run to its end at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


async def run_steps_async(steps: Steps[T]) -> T:
    """A stepped computation run to its end, yielding to the loop between its steps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)
