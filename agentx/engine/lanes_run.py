"""A run's drive phase: its lanes split over processes (this one, local worker processes or
Ray actors), each driving its share (drive.drive), and the workers' record files merged into
requests.jsonl. What comes back: every process's result, the workers lost (with why), and a
merge that failed for lack of room."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import aio
from ..errors import OutputError
from ..prompt.token_model import TokenModel
from ..rundir import merge_record_files
from ..session_plan import split_count
from ..trace.model import TraceSet
from .drive import DriveResult, DriveShare, drive
from .lanes import LaneEngine
from .workers import WorkerPool, auto_workers, usable_cores, worker_name

STOP_NOTICE = "\nagentx: stopping — draining in-flight requests (Ctrl-C again to cancel)"
Progress = Callable[[Any, asyncio.Event], Awaitable[None]]  # (live stats, done) -> display


def worker_count(workers: int | str, conc: int, ray: str | None = None,
                 local_cores: int = 0) -> int:
    """--workers as a number; `auto` keeps `local_cores` for a server on this machine."""
    if workers != "auto":
        return min(int(workers), conc)
    if ray:
        from .ray_pool import cluster_cpus, connect

        cores, where = cluster_cpus(connect(ray)), "CPUs in the Ray cluster"
        n = auto_workers(conc, cores=cores)
    else:
        cores, where = usable_cores(), "usable cores"
        n = auto_workers(conc, cores=cores, reserve=local_cores)
    kept = f", {local_cores} kept for the server beside it" if local_cores else ""
    print(f"agentx: --workers auto -> {n} process(es) for {conc} lanes "
          f"({cores} {where}{kept})", file=sys.stderr)
    return n


def split_lanes(conc: int, workers: int) -> list[list[int]]:
    """Round-robin lanes over workers (lane ids stay global, so schedules do not change)."""
    return [list(range(w, conc, workers)) for w in range(workers)]


def shares(template: DriveShare, conc: int, n_workers: int,
           worker_path: Callable[[int], Path] | None = None, tier_blocks: int | None = None
           ) -> list[DriveShare]:
    """`template` (every lane, the whole request budget and pool) split over `n_workers`
    processes: each its lanes, its part of --max-requests, of the KV pool and of the offload
    tier, and its own records file (`worker_path`) when they run in workers."""
    lanes = split_lanes(conc, n_workers)
    budgets = split_count(template.max_requests, [len(x) for x in lanes])
    pool = template.pool_blocks
    return [DriveShare(
        template.workload, template.client, lanes[w], budgets[w],
        str(worker_path(w)) if worker_path else template.records_path, template.token_info,
        template.max_model_len, (pool * len(lanes[w]) // conc) if pool else None,
        (tier_blocks * len(lanes[w]) // conc) if tier_blocks else None,
        template.offload_eager, w) for w in range(n_workers)]


@dataclass
class Driven:
    """What the drive phase gives back (see the module's docstring)."""

    results: list[DriveResult] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # `error: worker w1 (lanes 1, 3) lost: ...`
    merge_failed: OutputError | None = None

    def failed(self) -> OutputError | None:
        """A records file that could not be written (disk full), by a process or the merge."""
        return next(filter(None, map(OutputError.found_in, [x.stop_reason for x in self.results]
                                     + self.lost)), None) or self.merge_failed


async def drive_lanes(specs: list[DriveShare], tm: TokenModel, traces: TraceSet, driven: Driven,
                      *, in_workers: bool, ray: str | None = None,
                      progress: Progress | None = None,
                      ready: Callable[[], Awaitable[int]] | None = None) -> None:
    """Drive the shares into `driven`: one in this process (on this event loop, `ready` its
    start gate), or each in a worker (`in_workers`; merge_workers merges their records)."""
    if not in_workers:
        driven.results = [await _drive_here(specs[0], tm, traces, progress, ready)]
        return
    if ready:  # workers start together on their own gate, once past this one
        await ready()
    driven.results, driven.lost = await _drive_workers(specs, ray, progress)


async def _drive_here(spec: DriveShare, tm: TokenModel, traces: TraceSet,
                      progress: Progress | None,
                      ready: Callable[[], Awaitable[int]] | None = None) -> DriveResult:
    """One process: the engine runs on this event loop, progress reads its counters."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    prog: list[asyncio.Task] = []

    def on_engine(engine: LaneEngine) -> None:
        aio.install_stop_signals(loop, engine.request_stop, STOP_NOTICE)
        if progress:
            prog.append(asyncio.create_task(progress(engine.stats, done)))

    try:
        return await drive(spec, on_engine, tm, traces, ready)
    finally:
        done.set()
        if prog:
            await prog[0]
        aio.remove_stop_signals(loop)


def merge_workers(specs: list[DriveShare], requests_path: Path, results: list[DriveResult],
                  warm_merge: bool) -> OutputError | None:
    """The workers' record files into requests.jsonl (by the last warm-up's end with
    `warm_merge`: auto warm-up); a full disk leaves them as they were."""
    try:
        # workers end their warm-ups apart: the run's is the last (auto warm-up only)
        _, bad = merge_record_files([s.records_path for s in specs], requests_path,
                                    warm_until_ns=max(x.warmup_end_ns for x in results)
                                    if results and warm_merge else None)
    except OutputError as e:
        return e
    if bad:
        print(f"agentx: warning: skipped {bad} unreadable line(s) of the workers' record "
              "files (a worker killed while writing)", file=sys.stderr)
    return None


async def _drive_workers(specs: list[DriveShare], ray: str | None, progress: Progress | None
                         ) -> tuple[list[DriveResult], list[str]]:
    """The workers' results, and each lost worker (its lanes and why) as the run's stop
    reason: `error: worker w1 (lanes 1, 3) lost: ...` (none when a signal stopped the run:
    it is `signal`, and interrupted). One stderr line per lost worker."""
    if ray:
        from .ray_pool import RayPool

        pool: Any = RayPool(ray, specs)
    else:
        pool = WorkerPool(specs)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    # workers get SIGINT from the terminal themselves; the parent forwards it regardless
    aio.install_stop_signals(loop, pool.request_stop, STOP_NOTICE)
    prog = asyncio.create_task(progress(pool.stats, done)) if progress else None
    # workers and Ray actors start together once every one is ready (workers.StartGate,
    # ray_pool.RayPool._open_gate)
    pool.start()
    try:
        results = await pool.wait()
    finally:
        done.set()
        if prog:
            await prog
        aio.remove_stop_signals(loop)
    lost = [v if v.startswith("worker w") else f"{worker_name(specs[w])} lost: {v}"  # Ray's
            for w, v in sorted(pool.errors.items())]
    for why in lost:
        print(f"agentx: {why}", file=sys.stderr)
    signalled = getattr(pool, "signalled", False)  # RayPool: never
    if signalled and not results:
        raise KeyboardInterrupt  # interrupted before any worker could report: exit 130
    return results, [] if signalled else [f"error: {why}" for why in lost]
