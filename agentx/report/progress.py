"""Live progress while a run goes, answering "how long, and is it healthy?": the phase
(starting, ramp-up, warm-up, measuring, draining), elapsed and remaining time, sessions in
progress and requests in flight, throughput since the warm-up ended, errors so far, recent
TTFT and TPOT.

A rich Live panel on a terminal; on a pipe/CI a plain status line at every phase change and
every few seconds between, and one when the run ends. The engine's LiveStats carries the
phases as seconds since its lanes started and that start as wall time (engine/lanes.py): the
one clock the driver shares with worker processes and Ray actors.
"""
from __future__ import annotations

import asyncio
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..distribution import percentile
from ..engine.lanes import LiveStats

PHASES = ("starting", "ramp-up", "warm-up", "measuring", "draining", "done")


def run_elapsed(s: LiveStats) -> float:
    """Seconds since the lanes started (0 before)."""
    return max(0.0, time.time() - s.start_wall) if s.running and s.start_wall else 0.0


def phase(s: LiveStats, elapsed: float, finished: bool = False) -> str:
    """Where the run is: before the lanes start, in the ramp-up (lanes still starting), the
    warm-up (requests flagged and left out of the statistics), the measurement window,
    draining (no new request; in-flight ones finishing), or done."""
    if finished:
        return "done"
    if not s.running:
        return "starting"
    if s.stopping:
        return "draining"
    if elapsed < s.ramp_up_s:
        return "ramp-up"
    if s.warmup_end_s is None or elapsed < s.warmup_end_s:
        return "warm-up"
    return "measuring"


def remaining(s: LiveStats, elapsed: float, finished: bool = False) -> str:
    """Time left until no new request starts: the duration timer's, else estimated from the
    rate so far against --max-requests (`~`); `?` while that cannot be known yet."""
    if finished:
        return "0 s"
    if not s.running:
        return "?"
    if s.stopping:
        return f"0 s (draining {s.in_flight} in flight)"
    if s.warmup_end_s is None and s.duration_s:  # an auto warm-up: its end is not known yet
        return f"warm-up, then {s.duration_s:g} s"
    left = None if s.limit_s is None else max(0.0, s.limit_s - elapsed)
    if s.max_requests and s.started and elapsed > 0:
        est = (s.max_requests - s.started) * elapsed / s.started
        if left is None or est < left:
            return f"~{est:.0f} s ({s.started}/{s.max_requests} requests)"
    return "?" if left is None else f"{left:.0f} s"


def _p50(xs: list[float]) -> str:
    p = percentile(xs, 50)
    return "-" if p is None else f"{p:.1f}"


def _rates(s: LiveStats, elapsed: float) -> str:
    """Requests and output tokens done per second since the warm-up ended (the headline's
    window; the start-up's cold prompts left out), `-` before."""
    span = elapsed - s.warmup_end_s if s.warmup_end_s is not None else 0.0
    if span <= 0:
        return "- req/s, - output tok/s"
    return (f"{s.window_done / span:.2f} req/s, {s.window_output_tokens / span:,.0f} "
            "output tok/s")


def _sessions(s: LiveStats, sep: str = "/", unit: str = "") -> str:
    """In progress out of the lanes; an open-loop run (no lanes) has no ceiling to show."""
    return f"{s.sessions_active}{sep}{s.lanes}{unit}" if s.lanes else f"{s.sessions_active}"


def _errors(s: LiveStats) -> str:
    return f"{s.errors}" + (f" ({100 * s.errors / s.done:.1f}%)" if s.done else "")


def status_line(s: LiveStats, elapsed: float, finished: bool = False, tag: str = "") -> str:
    """One line for logs: `[  12.0s] measuring | left 48 s | sessions 8/8 | ...`; `tag`
    first (an A/B side's `side gpu-only:`), so two runs' lines are told apart."""
    return (f"{tag + ' ' if tag else ''}[{elapsed:6.1f}s] {phase(s, elapsed, finished)} | left "
            f"{remaining(s, elapsed, finished)} | sessions "
            f"{_sessions(s)} | in flight {s.in_flight} | done {s.done} | since warm-up "
            f"{_rates(s, elapsed)} | errors {_errors(s)} | TTFT p50 {_p50(s.recent_ttft_ms)} ms"
            f" | TPOT p50 {_p50(s.recent_tpot_ms)} ms")


def _table(s: LiveStats, elapsed: float, title: str) -> Table:
    t = Table(title=title, show_header=False, expand=False)
    t.add_row("phase", phase(s, elapsed))
    t.add_row("elapsed", f"{elapsed:.1f} s")
    t.add_row("remaining", remaining(s, elapsed))
    t.add_row("sessions in progress", _sessions(s, " / ", " lanes"))
    t.add_row("requests in flight", str(s.in_flight))
    t.add_row("requests done", str(s.done))
    t.add_row("throughput since the warm-up", _rates(s, elapsed))
    t.add_row("errors", _errors(s))
    t.add_row("TTFT p50 (last 512)", f"{_p50(s.recent_ttft_ms)} ms")
    t.add_row("TPOT p50 (last 512)", f"{_p50(s.recent_tpot_ms)} ms")
    return t


async def _tick(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass


async def show_progress(stats: LiveStats, stop: asyncio.Event, title: str,
                        interval_s: float = 0.5, plain_every_s: float = 10.0,
                        tag: str = "") -> None:
    console = Console(stderr=True)
    if console.is_terminal:
        with Live(_table(stats, 0, title), console=console, refresh_per_second=4,
                  transient=True) as live:
            while not stop.is_set():
                await _tick(stop, interval_s)
                live.update(_table(stats, run_elapsed(stats), title))
        return
    shown, last = "starting", time.monotonic()
    while not stop.is_set():
        await _tick(stop, interval_s)
        now, t = time.monotonic(), run_elapsed(stats)
        now_phase = phase(stats, t, stop.is_set())
        if now_phase != shown or now - last >= plain_every_s:
            print(status_line(stats, t, stop.is_set(), tag), file=sys.stderr, flush=True)
            shown, last = now_phase, now
