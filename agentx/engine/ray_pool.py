"""Lanes across hosts: the same worker processes as `--workers`, placed by Ray (`--ray ADDR`).

Optional (`pip install 'agentx-bench[ray]'`, on every node). Each worker is a Ray actor that runs
`drive()` (uvloop, its own HTTP client) on its share of the lanes, exactly like a local worker
process; the driver gathers the records. What differs from local workers is what a host does
not share:
- files: the trace (and an HF tokenizer directory) are shipped as bytes and unpacked into a
  temp dir on the actor's host;
- the monotonic clock: each actor reports its (wall − monotonic) offset; the shared start
  instant goes out in each actor's own monotonic base, and records of actors on other hosts
  are shifted into the driver's base (wall clocks must be NTP-synced; durations inside a
  record never cross hosts, so TTFT/ITL/TPOT are exact whatever the sync).
Actors on the driver's host share its clock and are not shifted.
- liveness: the driver pulls each actor's finished records every STATS_EVERY_S, so an actor
  whose node dies keeps what it had finished until then, like a dead local worker's file; its
  error names the Ray node. See docs/scale-out.md.
"""
from __future__ import annotations

import asyncio
import io
import os
import socket
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import orjson

from .. import aio
from ..rundir import RunDir
from .drive import DriveResult, DriveShare, drive
from .lanes import LiveStats
from .workers import merge_live

STATS_EVERY_S = 0.5
READY_POLL_S = 0.1  # how often the driver asks actors still starting whether they are ready
START_MARGIN_S = 0.5  # last actor ready -> shared start: covers one go() call's round trip
PLACE_TRIES = 3  # placements of one actor that dies before its first answer, before the run fails
# monotonic-ns fields of a record that are instants (offsets inside a record are relative)
INSTANT_FIELDS = ("intended_send_ns", "start_ns", "first_token_ns", "first_content_ns", "end_ns")


def require_ray():
    try:
        import ray
    except ImportError:
        from ..errors import InputError

        raise InputError("command line", "Ray is not installed: pip install 'agentx-bench[ray]'",
                         field="--ray") from None
    return ray


def connect(address: str) -> Any:
    """`local`: start a private single-node Ray; anything else goes to ray.init(address=...)
    (`auto`, `HOST:6379`, `ray://HOST:10001`)."""
    ray = require_ray()
    if not ray.is_initialized():
        kw: dict = {"include_dashboard": False, "log_to_driver": False,
                    "ignore_reinit_error": True}
        if address == "local":
            ray.init(**kw)
        else:
            ray.init(address=address, **kw)
    return ray


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


# ---------------------------------------------------------------- shipping files
def pack(path: str) -> tuple[str, bytes]:
    """A file as (name, bytes); a directory as an uncompressed tar of it."""
    p = Path(path)
    if p.is_dir():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            tf.add(str(p), arcname=p.name)
        return p.name + ".dir.tar", buf.getvalue()
    return p.name, p.read_bytes()


def unpack(name: str, data: bytes, dest: str) -> str:
    """Inverse of pack(): the local path of the file or directory."""
    if name.endswith(".dir.tar"):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tf:
            try:
                tf.extractall(dest, filter="data")  # no paths outside dest, no devices
            except TypeError:  # Python without extraction filters: our own tar, from pack()
                tf.extractall(dest)
        return os.path.join(dest, name[: -len(".dir.tar")])
    out = os.path.join(dest, name)
    with open(out, "wb") as f:
        f.write(data)
    return out


def clock() -> dict:
    return {"host": socket.gethostname(), "offset_ns": time.time_ns() - time.perf_counter_ns()}


def shift_record_line(line: bytes, delta_ns: int) -> bytes:
    """Move a record's monotonic instants into another host's monotonic base."""
    r = orjson.loads(line)
    for k in INSTANT_FIELDS:
        if r.get(k):
            r[k] += delta_ns
    return orjson.dumps(r) + b"\n"


# ---------------------------------------------------------------- the actor
class LaneWorker:
    """Body of the Ray actor (wrapped by ray.remote in `actor_class`): one drive() per call,
    with ready(), go(), stats() and stop() callable from the driver while it runs (threaded
    actor). Like a local worker (workers.StartGate) it reports ready once its lanes' first
    sessions are built and connections opened, then waits for the driver's shared start."""

    def __init__(self) -> None:
        self._engine = None
        self._records: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: bool | None = None  # None, or force for an engine not yet built
        self._ready = threading.Event()
        self._go = threading.Event()
        self._t0_ns = 0

    def clock(self) -> dict:
        import ray

        return {**clock(), "node": ray.get_runtime_context().get_node_id()}

    def ready(self, timeout_s: float = 0.0) -> bool:
        """True once the lanes are ready to start (waits up to timeout_s for it)."""
        return self._ready.wait(timeout_s)

    def go(self, t0_ns: int) -> None:
        """Start the lanes at t0_ns, an instant of this actor's monotonic clock."""
        if not self._go.is_set():
            self._t0_ns = t0_ns
            self._go.set()

    def records_since(self, offset: int) -> bytes:
        """The complete record lines written from byte `offset` on (streamed to the driver)."""
        path = self._records
        if path is None or not os.path.exists(path):
            return b""
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        return data[: data.rfind(b"\n") + 1]

    def run(self, spec: DriveShare, files: dict[str, tuple[str, bytes]]) -> tuple[dict, bytes]:
        with tempfile.TemporaryDirectory(prefix="agentx-ray-") as tmp:
            workload = spec.workload
            info = dict(spec.token_info)
            if "trace" in files:
                workload = replace(workload, trace=unpack(*files["trace"], tmp))
            if "tokenizer" in files:
                info["tokenizer"] = unpack(*files["tokenizer"], tmp)
            local = replace(spec, workload=workload, token_info=info,
                            records_path=os.path.join(tmp, RunDir.REQUESTS))
            self._records = local.records_path
            result = self._run_loop(local)
            self._records = None
            with open(local.records_path, "rb") as f:
                return asdict(result), f.read()

    def _run_loop(self, spec: DriveShare) -> DriveResult:
        loop = aio.new_event_loop()
        self._loop = loop

        def on_engine(engine) -> None:
            self._engine = engine
            if self._stop_requested is not None:
                engine.request_stop(self._stop_requested)

        # a closure, not a method: an `async def` method would make Ray run this actor's
        # methods on its own event loop (an async actor), where run_until_complete fails
        async def ready() -> int:
            self._ready.set()
            await asyncio.get_running_loop().run_in_executor(None, self._go.wait)
            return self._t0_ns

        try:
            return loop.run_until_complete(drive(spec, on_engine, ready=ready))
        finally:
            self._loop = None
            loop.close()

    def stats(self) -> dict | None:
        e = self._engine
        return asdict(e.stats) if e is not None else None

    def stop(self, force: bool = False) -> None:
        """LaneEngine.request_stop on the actor's loop: drain, or with force cancel in-flight."""
        self._stop_requested = bool(self._stop_requested) or force
        self.go(time.perf_counter_ns())  # lanes still waiting to start begin, then stop
        e, loop = self._engine, self._loop
        if e is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(e.request_stop, force)
        except RuntimeError:  # loop already closed: the run is over
            pass


def actor_class(ray: Any):
    # run() holds one thread for the whole run; the driver's calls (ready, go, stats,
    # records_since, stop) may overlap
    return ray.remote(num_cpus=1, max_concurrency=8)(LaneWorker)


# ---------------------------------------------------------------- the driver
class RayPool:
    """Ray counterpart of workers.WorkerPool (same interface: start, request_stop, wait,
    stats, errors): actors instead of local processes, records gathered by the driver."""

    def __init__(self, address: str, specs: list[DriveShare]) -> None:
        self.ray = connect(address)
        self.specs = specs
        self.stats = LiveStats(lanes=sum(len(s.lanes) for s in specs))
        self.errors: dict[int, str] = {}
        self.hosts: dict[int, str] = {}
        self.nodes: dict[int, str] = {}  # worker -> Ray node id
        self._received: dict[int, int] = {}  # worker -> bytes of its records file gathered
        self._done: set[int] = set()
        self.actors: list = []
        self._refs: list = []
        self._deltas: list[int] = []
        self._per_worker: dict[int, dict] = {}
        self._stopping = False

    def start(self) -> None:
        """Place the actors (SPREAD over nodes), learn each one's clock, hand each its lanes.
        They start together once every one is ready (`wait` opens the gate): start-up (trace
        parse, tokenizer, first sessions) takes seconds and differs between hosts, so a fixed
        instant either wastes it or starts a late actor inside the measured window."""
        ray = self.ray
        s0 = self.specs[0]
        files = files_to_ship(s0.workload.trace, s0.token_info)
        self.actors, clocks = self._place(actor_class(ray))
        me = clock()
        files_ref = ray.put(files)
        for s, a, c in zip(self.specs, self.actors, clocks):
            self.hosts[s.worker] = c["host"]
            self.nodes[s.worker] = c["node"]
            self._received[s.worker] = 0
            open(s.records_path, "wb").close()  # records are appended as they arrive
            # same host: same monotonic clock; else local = driver + (driver off - actor off)
            d = 0 if c["host"] == me["host"] else me["offset_ns"] - c["offset_ns"]
            self._deltas.append(d)
            self._refs.append(a.run.remote(s, files_ref))

    def _place(self, cls: Any) -> tuple[list, list[dict]]:
        """One actor per spec, and each one's clock. An actor that dies before it answers (its
        worker process failed to start, its node went away; Ray 2.60 on a loaded 2-core host
        has reported a fresh actor dead as "all references removed") is placed again, up to
        PLACE_TRIES times: nothing of the run was given to it yet."""
        ray = self.ray
        actors = [cls.options(scheduling_strategy="SPREAD").remote() for _ in self.specs]
        pending = [a.clock.remote() for a in actors]
        clocks: list[dict] = []
        for i in range(len(actors)):
            for attempt in range(1, PLACE_TRIES + 1):
                try:
                    clocks.append(ray.get(pending[i]))
                    break
                except ray.exceptions.RayActorError:
                    if attempt == PLACE_TRIES:
                        raise
                    actors[i] = cls.options(scheduling_strategy="SPREAD").remote()
                    pending[i] = actors[i].clock.remote()
        return actors, clocks

    def request_stop(self, force: bool = False) -> None:
        self._stopping = True
        for a in self.actors:
            a.stop.remote(force)

    async def _open_gate(self) -> None:
        """Once every actor still running is ready, start them all at one instant (each in
        its own clock). An actor whose run ended while starting (it failed, or its node died)
        is left out; a stop opens the gate actor by actor (LaneWorker.stop)."""
        waiting = {s.worker: a for s, a in zip(self.specs, self.actors)}
        ref_of = {s.worker: r for s, r in zip(self.specs, self._refs)}
        while waiting and not self._stopping:
            ended, _ = self.ray.wait([ref_of[w] for w in waiting], num_returns=len(waiting),
                                     timeout=0)
            for w in [w for w in waiting if ref_of[w] in ended]:
                del waiting[w]
            ws = list(waiting)
            got = await asyncio.gather(*[waiting[w].ready.remote(READY_POLL_S) for w in ws],
                                       return_exceptions=True)  # a dead actor: see wait()
            for w, ok in zip(ws, got):
                if ok is True or isinstance(ok, BaseException):
                    del waiting[w]
        if self._stopping:
            return
        t0 = time.perf_counter_ns() + int(START_MARGIN_S * 1e9)
        for s, a, d in zip(self.specs, self.actors, self._deltas):
            if s.worker not in self._done:
                a.go.remote(t0 + d)

    def _merge_stats(self) -> None:
        merge_live(self.stats, list(self._per_worker.values()))

    async def wait(self) -> list[DriveResult]:
        """Gather every actor's result; its records go to its spec's records_path, instants
        in this process's monotonic base."""
        poll = asyncio.create_task(self._poll())
        gate = asyncio.create_task(self._open_gate())
        out: list[DriveResult] = []
        names = {f.name for f in fields(DriveResult)}
        try:
            for s, ref, d in zip(self.specs, self._refs, self._deltas):
                try:
                    res, recs = await ref
                except Exception as exc:  # an actor or its node died: report it, keep the others
                    self._done.add(s.worker)
                    cause = getattr(exc, "cause", None) or exc  # RayTaskError: the actor's own
                    self.errors[s.worker] = (f"{type(exc).__name__} on Ray node "
                                             f"{self.nodes[s.worker][:12]}: "
                                             f"{type(cause).__name__}: {str(cause)[:300]}")
                    continue
                self._done.add(s.worker)
                r = DriveResult(**{k: v for k, v in res.items() if k in names})
                r.host = f"{r.host}/{self.nodes[s.worker][:12]}"  # one entry per Ray node
                if d:  # actor clock -> driver clock
                    r.t_start_ns -= d
                    r.t_end_ns -= d
                    r.warmup_end_ns -= d
                    r.first_done_ns -= d if r.first_done_ns else 0
                    r.stop_ns -= d if r.stop_ns else 0
                self._append(s, recs[self._received[s.worker]:], d)
                out.append(r)
                if r.stop_reason.startswith("aborted"):
                    self.request_stop(force=True)  # the run is over, not just this actor
        finally:
            poll.cancel()
            gate.cancel()
            for a in self.actors:
                self.ray.kill(a)
        return out

    def _append(self, s: DriveShare, data: bytes, delta_ns: int) -> None:
        """Add an actor's record lines to its spec's file, in this process's clock."""
        self._received[s.worker] += len(data)
        if delta_ns:
            data = b"".join(shift_record_line(ln, -delta_ns) for ln in data.splitlines()
                            if ln.strip())
        with open(s.records_path, "ab") as f:
            f.write(data)

    async def _poll(self) -> None:
        """Live stats and the records finished so far, from every actor still running."""
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            live = [(s, a, d) for s, a, d in zip(self.specs, self.actors, self._deltas)
                    if s.worker not in self._done]
            offsets = [self._received[s.worker] for s, _, _ in live]
            vals = await asyncio.gather(*[a.stats.remote() for _, a, _ in live],
                                        *[a.records_since.remote(o)
                                          for (_, a, _), o in zip(live, offsets)],
                                        return_exceptions=True)  # a dead actor: see wait()
            for (s, _, d), v, recs, o in zip(live, vals, vals[len(live):], offsets):
                if isinstance(v, dict):
                    self._per_worker[s.worker] = v
                # wait() may have taken the final records meanwhile: never append twice
                if isinstance(recs, bytes) and recs and s.worker not in self._done \
                        and self._received[s.worker] == o:
                    self._append(s, recs, d)
            self._merge_stats()


def files_to_ship(trace: str, token_info: dict) -> dict[str, tuple[str, bytes]]:
    """The trace (unless a built-in name every node resolves itself) and an HF tokenizer."""
    from ..trace.load import BUILTIN_TRACES

    files = {}
    if trace not in BUILTIN_TRACES:
        files["trace"] = pack(trace)
    if token_info.get("mode") == "hf":
        files["tokenizer"] = pack(token_info["tokenizer"])
    return files
