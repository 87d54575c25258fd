"""Lanes across worker processes (`--workers W|auto`).

One asyncio client saturates one core; beyond that its own delays leak into TTFT and ITL.
Each worker is a separate process with its own uvloop and aiohttp session, running
`drive()` on its share of the lanes, all starting at one shared monotonic instant
(CLOCK_MONOTONIC is system-wide, so their timestamps are comparable). Each writes its own
records file, merged by start time at the end. The parent forwards stop requests through two
Events (drain, force) and gathers live counters through a Queue for the progress display.

A worker dies with its parent (agentx.lifeline: parent-death signal and a watchdog thread): an
orphan force-stops its lanes, keeps the records it flushed (merged by the next `agentx report`)
and exits without touching the Queue, whose reader is gone (a full pipe would block its exit).
"""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from dataclasses import asdict, fields

from .. import aio
from ..lifeline import parent_alive, set_parent_death_signal, watch_parent
from .drive import DriveResult, DriveSpec, drive
from .lanes import Engine, LiveStats

LANES_PER_WORKER = 128  # one uvloop process keeps its loop lag low up to about this many
STATS_EVERY_S = 0.5
ORPHAN_EXIT_S = 5.0  # an orphan still running this long after its parent died exits anyway


def usable_cores() -> int:
    """Cores this process may run on (its affinity, e.g. under taskset), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(conc: int, cores: int | None = None, reserve: int = 0) -> int:
    """Enough processes that none drives more than LANES_PER_WORKER lanes, at most one per
    core left after `reserve` (e.g. 1 for an embedded simulator in this process)."""
    cores = cores or usable_cores()
    usable = max(1, cores - reserve)
    want = -(-conc // LANES_PER_WORKER)
    return max(1, min(usable, want, conc))


def merge_live(s: LiveStats, vals: list[dict]) -> None:
    """Fold the workers' latest counters (asdict(LiveStats) each) into `s`."""
    for f in ("sessions_active", "in_flight", "started", "done", "errors"):
        setattr(s, f, sum(v[f] for v in vals))
    s.max_in_flight = max(s.max_in_flight, s.in_flight)
    s.max_sessions_active = max(s.max_sessions_active, s.sessions_active)
    s.recent_ttft_ms = [x for v in vals for x in v["recent_ttft_ms"][-128:]]
    s.recent_tpot_ms = [x for v in vals for x in v["recent_tpot_ms"][-128:]]


class StartGate:
    """Workers start together once every one is ready: spawned, imports done, traces parsed,
    tokenizer and block tape built, connections opened. That takes seconds (~20 s per process
    for the built-in traces on a loaded 2-core host); a fixed delay either wastes it or, when
    start-up outlasts it, starts a late worker inside the measured window, its lanes bunched
    together while the other workers' start-up takes the cores."""

    MARGIN_S = 0.25  # last worker ready -> shared start: every worker is awake by then

    def __init__(self, ctx) -> None:
        self.go = ctx.Event()
        self.t0 = ctx.Value("q", 0, lock=False)

    def open(self, t0_ns: int) -> None:
        if not self.go.is_set():
            self.t0.value = t0_ns
            self.go.set()

    async def wait(self) -> int:
        """In a worker: the shared start instant, once the parent opens the gate."""
        await asyncio.get_running_loop().run_in_executor(None, self.go.wait)
        return self.t0.value


def _worker_entry(spec: DriveSpec, stop_evt, force_evt, q, parent_pid: int,
                  gate: StartGate | None = None) -> None:
    """Process entry point: run drive() (uvloop when installed); report counters and the
    result. Stops come from this process's own signals (a terminal's Ctrl-C reaches the
    whole process group), from the parent's events and from the parent's death, all through
    Engine.request_stop."""
    set_parent_death_signal(signal.SIGTERM)  # SIGTERM kills it until the engine handles it
    orphan = threading.Event()
    engine_box: list[Engine] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def on_orphan() -> None:
        orphan.set()
        if not engine_box:  # nothing sent yet: nothing to keep
            os._exit(1)
        with contextlib.suppress(RuntimeError):  # loop already closed: exiting anyway
            loops[0].call_soon_threadsafe(engine_box[0].request_stop, True)

    watch_parent(parent_pid, on_orphan, exit_after=ORPHAN_EXIT_S)

    async def main() -> DriveResult:
        loop = asyncio.get_running_loop()
        loops.append(loop)

        def on_engine(engine: Engine) -> None:
            engine_box.append(engine)
            # a SIGTERM that finds the parent gone is the parent-death signal: stop at once
            aio.install_stop_signals(
                loop, lambda force: engine.request_stop(force or not parent_alive(parent_pid)))

        async def watch() -> None:
            while not orphan.is_set():
                await asyncio.sleep(STATS_EVERY_S)
                if engine_box and not orphan.is_set():
                    e = engine_box[0]
                    q.put(("stats", spec.worker, asdict(e.stats)))
                    if stop_evt.is_set() or force_evt.is_set():
                        e.request_stop(force_evt.is_set())

        async def ready() -> int:
            q.put(("ready", spec.worker, None))
            return await gate.wait()

        w = asyncio.create_task(watch())
        try:
            return await drive(spec, on_engine, ready=ready if gate else None)
        finally:
            w.cancel()
            aio.remove_stop_signals(loop)

    try:
        result = aio.run(main())
        if not orphan.is_set():
            q.put(("done", spec.worker, asdict(result)))
    except BaseException as exc:  # report, never hang the parent
        if not orphan.is_set():
            q.put(("error", spec.worker, f"{type(exc).__name__}: {exc}"))
    if orphan.is_set() or not parent_alive(parent_pid):
        q.cancel_join_thread()  # nobody reads the queue any more
        os._exit(1)


class WorkerPool:
    """Start workers, expose merged live counters, collect their results."""

    def __init__(self, specs: list[DriveSpec]) -> None:
        self.specs = specs
        ctx = mp.get_context("spawn")
        self.stop_evt, self.force_evt = ctx.Event(), ctx.Event()
        self.q = ctx.Queue()
        self.gate = StartGate(ctx)
        self.procs = [ctx.Process(target=_worker_entry,
                                  args=(s, self.stop_evt, self.force_evt, self.q, os.getpid(),
                                        self.gate),
                                  name=f"agentx-worker-{s.worker}", daemon=True) for s in specs]
        self.stats = LiveStats(lanes=sum(len(s.lanes) for s in specs))
        self._per_worker: dict[int, dict] = {}
        self.results: dict[int, DriveResult] = {}
        self.errors: dict[int, str] = {}

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def request_stop(self, force: bool = False) -> None:
        """Every worker: drain (Engine.request_stop), or with force cancel in-flight now."""
        self.stop_evt.set()
        if force:
            self.force_evt.set()
        self.gate.open(time.perf_counter_ns())  # workers still starting begin, then stop

    def _merge_stats(self) -> None:
        merge_live(self.stats, list(self._per_worker.values()))

    async def wait(self) -> list[DriveResult]:
        loop = asyncio.get_running_loop()
        pending = {s.worker for s in self.specs}
        waiting = set(pending)  # not yet ready to start
        names = {f.name for f in fields(DriveResult)}
        while pending:
            if not waiting & pending:
                self.gate.open(time.perf_counter_ns() + int(StartGate.MARGIN_S * 1e9))
            try:
                kind, w, payload = await loop.run_in_executor(None, self.q.get, True, 1.0)
            except queue.Empty:
                for s, p in zip(self.specs, self.procs):  # died without a word
                    if s.worker in pending and not p.is_alive():
                        self.errors[s.worker] = f"worker exited with code {p.exitcode}"
                        pending.discard(s.worker)
                continue
            if kind == "ready":
                waiting.discard(w)
            elif kind == "stats":
                self._per_worker[w] = payload
                self._merge_stats()
            elif kind == "done":
                self.results[w] = DriveResult(**{k: v for k, v in payload.items() if k in names})
                pending.discard(w)
                if self.results[w].stop_reason.startswith("aborted") and pending:
                    self.request_stop(force=True)  # the run is over, not just this worker
            else:
                self.errors[w] = payload
                pending.discard(w)
        for p in self.procs:
            await loop.run_in_executor(None, p.join, 10)
        return [self.results[k] for k in sorted(self.results)]
