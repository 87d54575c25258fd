"""Live progress while a run goes: sessions in progress and requests in flight, separately.

A rich Live panel on a terminal; on a pipe/CI a plain status line every few seconds.
"""
from __future__ import annotations

import asyncio
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..dist import percentile
from ..engine.lanes import LiveStats


def _p50(xs: list[float]) -> str:
    p = percentile(xs, 50)
    return "-" if p is None else f"{p:.1f}"


def status_line(s: LiveStats, elapsed: float) -> str:
    return (f"[{elapsed:6.1f}s] sessions {s.sessions_active}/{s.lanes} | in flight "
            f"{s.in_flight} | done {s.done} | errors {s.errors} | TTFT p50 "
            f"{_p50(s.recent_ttft_ms)} ms | TPOT p50 {_p50(s.recent_tpot_ms)} ms")


def _table(s: LiveStats, elapsed: float, title: str) -> Table:
    t = Table(title=title, show_header=False, expand=False)
    t.add_row("elapsed", f"{elapsed:.1f} s")
    t.add_row("sessions in progress", f"{s.sessions_active} / {s.lanes} lanes")
    t.add_row("requests in flight", str(s.in_flight))
    t.add_row("requests done", str(s.done))
    t.add_row("errors", str(s.errors))
    t.add_row("TTFT p50 (last 512)", f"{_p50(s.recent_ttft_ms)} ms")
    t.add_row("TPOT p50 (last 512)", f"{_p50(s.recent_tpot_ms)} ms")
    return t


async def show_progress(stats: LiveStats, stop: asyncio.Event, title: str,
                        interval_s: float = 0.5, plain_every_s: float = 10.0) -> None:
    t0 = time.monotonic()
    console = Console(stderr=True)
    if console.is_terminal:
        with Live(_table(stats, 0, title), console=console, refresh_per_second=4,
                  transient=True) as live:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), interval_s)
                except asyncio.TimeoutError:
                    pass
                live.update(_table(stats, time.monotonic() - t0, title))
        return
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), plain_every_s)
        except asyncio.TimeoutError:
            print(status_line(stats, time.monotonic() - t0), file=sys.stderr, flush=True)
