"""Lanes across worker processes (`--workers W|auto`).

One asyncio client saturates one core; beyond that its own delays leak into TTFT and ITL.
Each worker is a separate process with its own uvloop and aiohttp session, running
`drive()` on its share of the lanes, all starting at one shared monotonic instant
(CLOCK_MONOTONIC is system-wide, so their timestamps are comparable). Each writes its own
records file, merged by start time at the end. The parent forwards stop requests through two
Events (drain, force) and gathers live counters, a heartbeat and the result through one Queue
per worker (a worker killed while writing to a shared queue would hold its lock for ever and
silence the others).

A worker that stops reporting is lost, never waited for: dead without a result, silent for
SILENT_LIMIT_S (frozen, SIGSTOPped), still running DEADLINE_MARGIN_S past the latest instant its
run can end (ramp-up + (WARMUP_LIMIT + 1) x --duration + --drain-timeout, or --drain-timeout
after a stop), or KILL_GRACE_S after a forced stop (a second Ctrl-C). The parent SIGKILLs it,
stops the others, keeps every record it wrote and names it, with its lanes, in `lost`.

A worker dies with its parent (agentx.child_process: parent-death signal and a watchdog thread): an
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
from ..child_process import (
    children_ignore_sigint,
    ignore_sigint,
    parent_alive,
    set_parent_death_signal,
    watch_parent,
)
from .drive import DriveResult, DriveShare, drive
from .lanes import WARMUP_LIMIT, LaneEngine, LiveStats

LANES_PER_WORKER = 128  # one uvloop process keeps its loop lag low up to about this many
STATS_EVERY_S = 0.5
ORPHAN_EXIT_S = 5.0  # an orphan still running this long after its parent died exits anyway
HEARTBEAT_S = 1.0  # a worker's heartbeat thread reports this often, from its first line on
SILENT_LIMIT_S = 10.0  # a started worker silent this long is lost (frozen, stopped)
STARTUP_LIMIT_S = 120.0  # a worker not heard from this long after its spawn is lost
DEADLINE_MARGIN_S = 30.0  # past the latest instant a worker's run can end: lost
KILL_GRACE_S = 5.0  # after a forced stop, a worker still running this long is killed
DEAD_GRACE_S = 2.0  # a worker found dead: its queued last words arrive within this


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
    for f in ("sessions_active", "in_flight", "started", "done", "errors", "output_tokens",
              "window_done", "window_output_tokens"):
        setattr(s, f, sum(v[f] for v in vals))
    # phases: the run's are its slowest worker's (all share the start and the settings)
    s.running, s.stopping = any(v["running"] for v in vals), any(v["stopping"] for v in vals)
    s.start_wall = min((v["start_wall"] for v in vals if v["start_wall"]), default=0.0)
    s.ramp_up_s = max((v["ramp_up_s"] for v in vals), default=0.0)
    s.duration_s = next((v["duration_s"] for v in vals if v["duration_s"] is not None), None)
    budgets = [v["max_requests"] for v in vals]  # each worker's share
    s.max_requests = None if None in budgets or not budgets else sum(budgets)
    for f in ("warmup_end_s", "limit_s"):
        ends = [v[f] for v in vals]
        setattr(s, f, None if None in ends else max(ends, default=None))
    s.max_in_flight = max(s.max_in_flight, s.in_flight)
    s.max_sessions_active = max(s.max_sessions_active, s.sessions_active)
    s.recent_ttft_ms = [x for v in vals for x in v["recent_ttft_ms"][-128:]]
    s.recent_tpot_ms = [x for v in vals for x in v["recent_tpot_ms"][-128:]]


def worker_name(spec: DriveShare) -> str:
    """`worker w1 (lanes 1, 3)`: how a lost worker is named (stderr, stop reason)."""
    return f"worker w{spec.worker} (lanes {', '.join(map(str, spec.lanes))})"


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


def _worker_entry(spec: DriveShare, stop_evt, force_evt, q, parent_pid: int,
                  gate: StartGate | None = None) -> None:
    """Process entry point: run drive() (uvloop when installed); report counters and the
    result. Stops come from this process's own signals (a terminal's Ctrl-C reaches the
    whole process group), from the parent's events and from the parent's death, all through
    LaneEngine.request_stop."""
    ignore_sigint()  # started with it blocked; the engine handles it once it runs
    set_parent_death_signal(signal.SIGTERM)  # SIGTERM kills it until the engine handles it
    orphan = threading.Event()
    beating = threading.Event()
    beating.set()

    def heartbeat() -> None:  # a thread: it goes on while the loop builds or is busy
        while beating.is_set() and not orphan.is_set():
            q.put(("beat", spec.worker, None))
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=heartbeat, name="agentx-heartbeat", daemon=True).start()
    engine_box: list[LaneEngine] = []
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

        def on_engine(engine: LaneEngine) -> None:
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
            if engine_box and not orphan.is_set():  # the final counts, for the progress line
                q.put(("stats", spec.worker, asdict(engine_box[0].stats)))

    try:
        result = aio.run(main())
        beating.clear()
        if not orphan.is_set():
            q.put(("done", spec.worker, asdict(result)))
    except BaseException as exc:  # report, never hang the parent
        beating.clear()
        if not orphan.is_set():
            q.put(("error", spec.worker, f"{type(exc).__name__}: {exc}"))
    if orphan.is_set() or not parent_alive(parent_pid):
        q.cancel_join_thread()  # nobody reads the queue any more
        os._exit(1)


class WorkerPool:
    """Start workers, expose merged live counters, collect their results; name the lost."""

    def __init__(self, specs: list[DriveShare]) -> None:
        self.specs = specs
        ctx = mp.get_context("spawn")
        self.stop_evt, self.force_evt = ctx.Event(), ctx.Event()
        self.queues = {s.worker: ctx.Queue() for s in specs}
        self.gate = StartGate(ctx)
        self.procs = [ctx.Process(target=_worker_entry,
                                  args=(s, self.stop_evt, self.force_evt, self.queues[s.worker],
                                        os.getpid(), self.gate),
                                  name=f"agentx-worker-{s.worker}", daemon=True) for s in specs]
        self.stats = LiveStats(lanes=sum(len(s.lanes) for s in specs))
        self._per_worker: dict[int, dict] = {}
        self.results: dict[int, DriveResult] = {}
        self.errors: dict[int, str] = {}  # worker -> why it gave no result (lost)
        self.signalled = False  # a stop came from outside (Ctrl-C, SIGTERM), not from a worker
        self._inbox: queue.Queue = queue.Queue()
        self._heard: dict[int, float] = {}
        self._dead_since: dict[int, float] = {}
        self._closed = threading.Event()  # wait() is over: the reader threads end
        self._spawned = 0.0
        self._deadline = float("inf")  # monotonic: a worker running after this is lost

    def start(self) -> None:
        # a terminal's Ctrl-C reaches the workers too: ignored until their engine handles it
        # (the parent forwards it), so none dies of a KeyboardInterrupt while importing
        with children_ignore_sigint():
            for p in self.procs:
                p.start()
        self._spawned = time.monotonic()
        for w, q in self.queues.items():
            threading.Thread(target=self._read, args=(q,), name=f"agentx-inbox-{w}",
                             daemon=True).start()

    def _read(self, q) -> None:
        """A reader thread per worker queue: a worker killed mid-message blocks only this."""
        while not self._closed.is_set():
            try:
                msg = q.get(True, 0.5)
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):  # queue closed, or a cut-off message
                return
            self._inbox.put(msg)

    def request_stop(self, force: bool = False) -> None:
        """Every worker: drain (LaneEngine.request_stop), or with force cancel in-flight now (a
        signal: the run is interrupted)."""
        self.signalled = True
        self._stop_all(force)

    def _stop_all(self, force: bool) -> None:
        self.stop_evt.set()
        now = time.monotonic()
        eng = self.specs[0].workload.engine
        self._deadline = min(self._deadline, now + (KILL_GRACE_S if force else
                                                    eng.drain_timeout_s + DEADLINE_MARGIN_S))
        if force:
            self.force_evt.set()
        self.gate.open(time.perf_counter_ns())  # workers still starting begin, then stop

    def _open_gate(self) -> None:
        if not self.gate.go.is_set():
            self.gate.open(time.perf_counter_ns() + int(StartGate.MARGIN_S * 1e9))
            eng = self.specs[0].workload.engine
            if eng.duration_s:  # the latest a run can end: engine.run's own timer, drained
                longest = eng.ramp_up_s + (WARMUP_LIMIT + 1) * eng.duration_s
                self._deadline = min(self._deadline, time.monotonic() + longest
                                     + eng.drain_timeout_s + DEADLINE_MARGIN_S)

    def _merge_stats(self) -> None:
        merge_live(self.stats, list(self._per_worker.values()))

    def _why_lost(self, w: int, p, now: float) -> str | None:
        if not p.is_alive():
            # its last words may still be on their way: lost only once they would be here
            if now - self._dead_since.setdefault(w, now) < DEAD_GRACE_S:
                return None
            code = p.exitcode
            how = (f"killed by {signal.Signals(-code).name}" if code and code < 0
                   and -code in signal.valid_signals() else f"exited with code {code}")
            return f"{how} before reporting its result"
        heard = self._heard.get(w)
        if heard is None and now - self._spawned > STARTUP_LIMIT_S:
            return f"not heard from within {STARTUP_LIMIT_S:g} s of its start"
        if heard is not None and now - heard > SILENT_LIMIT_S:
            return f"silent for {now - heard:.0f} s (frozen or stopped)"
        if now > self._deadline:
            return ("still running past the forced stop" if self.force_evt.is_set()
                    else "still running past the run's latest end (duration + drain-timeout "
                    f"+ {DEADLINE_MARGIN_S:g} s)")
        return None

    def _lose(self, w: int, p, why: str) -> None:
        if p.is_alive():
            p.kill()  # SIGKILL ends a stopped process too
            p.join(5)
            why += "; killed (SIGKILL)"
        self.errors[w] = f"{self._name(w)} lost: {why}; its records written so far are kept"

    def _name(self, w: int) -> str:
        return worker_name(next(s for s in self.specs if s.worker == w))

    async def wait(self) -> list[DriveResult]:
        loop = asyncio.get_running_loop()
        pending = {s.worker for s in self.specs}
        waiting = set(pending)  # not yet ready to start
        procs = {s.worker: p for s, p in zip(self.specs, self.procs)}
        try:
            while pending:
                if not waiting & pending:
                    self._open_gate()
                try:
                    kind, w, payload = await loop.run_in_executor(None, self._inbox.get, True,
                                                                  0.5)
                except queue.Empty:
                    pass
                else:
                    if w in pending:  # a lost worker's late words are not counted
                        self._heard[w] = time.monotonic()
                        if kind == "ready":
                            waiting.discard(w)
                        self._take(kind, w, payload, pending)
                now = time.monotonic()
                for w in sorted(pending):
                    why = self._why_lost(w, procs[w], now)
                    if why:
                        await loop.run_in_executor(None, self._lose, w, procs[w], why)
                        pending.discard(w)
                        if pending:
                            self._stop_all(force=True)  # the run has failed: end it now
        finally:
            self._closed.set()
        for p in self.procs:
            await loop.run_in_executor(None, p.join, 10)
        return [self.results[k] for k in sorted(self.results)]

    def _take(self, kind: str, w: int, payload, pending: set[int]) -> None:
        """One message of worker `w`: counters, its result, or its failure."""
        if kind == "stats":
            self._per_worker[w] = payload
            self._merge_stats()
        elif kind == "done":
            names = {f.name for f in fields(DriveResult)}
            self.results[w] = DriveResult(**{k: v for k, v in payload.items() if k in names})
            pending.discard(w)
            if self.results[w].stop_reason.startswith(("aborted", "error")) and pending:
                self._stop_all(force=True)  # the run is over, not just this worker
        elif kind == "error":
            self.errors[w] = f"{self._name(w)} failed: {payload}"
            pending.discard(w)
            if pending:
                self._stop_all(force=True)
