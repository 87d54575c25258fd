"""Drive a share of the lanes: the part of a run that one process executes.

`drive(spec)` builds the client session, token model, sender and engine for the lanes in
`spec`, runs them and returns what the parent needs to merge. The in-process run and every
worker process (agentx.engine.workers) go through this one function, so a run split across
processes has the same semantics as one process.
"""
from __future__ import annotations

import gc
import socket
import sys
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable, Iterator

from ..client.http import ClientConfig, make_session
from ..config import RunConfig
from ..prefix_cache import TieredCache
from ..prompt.blocks import BlockFactory
from ..prompt.synth import SynthConfig
from ..prompt.token_model import TokenModel, builtin_model, hf_model
from ..records import RecordWriter
from ..session_plan import Planner, SessionPick, warm_sessions
from ..tokens.words import WORDS
from ..trace.load import load_traces
from ..trace.model import TraceSet
from .lanes import EngineConfig, LaneEngine
from .open_loop import OpenLoop
from .self_measure import LoopLagSampler
from .sender import ChatSender, TokenIdsSender

# How long another thread of this process may keep the GIL once the loop asks for it back.
# A thread's Python (a token-exact fallback's full template render, sender.py; the /metrics
# scraper's parsing before it moved to a child process, ~30 ms per scrape) holds the GIL up
# to CPython's default 5 ms each time the loop wakes; 20-35 ms stalls in all when the
# scraper was a thread (bench/token_exact_lag.py --stalls). A thread that asks for nothing
# is not affected; a contended hand-over every 0.5 ms costs a few us.
SWITCH_INTERVAL_S = 0.0005


@dataclass
class Arrivals:
    """An open loop's schedule (None: closed loop, lanes)."""

    mode: str
    session_rate: float | None
    burstiness: float
    time_scale: float
    max_active: int | None


@dataclass
class Workload:
    """The engine's slice of a run's options, the same in every process (workload_of): the
    trace, the token model's thinking mode, the planner's seed and start range, the synthesis
    and engine configs (their per-process fields are set by drive()), the arrivals."""

    trace: str
    thinking: str | None
    seed: int
    start_min: float
    start_max: float
    synth: SynthConfig
    engine: EngineConfig
    arrivals: Arrivals | None = None


def workload_of(r: RunConfig, run_ns: str) -> Workload:
    """The run options the engine uses, derived once. `run_ns`: the content namespace (the
    run's salt, or the seed with --warm-cache)."""
    return Workload(
        r.trace, r.thinking, r.seed, r.start_min, r.start_max,
        SynthConfig(run_ns=run_ns, shared_prefix=r.shared_prefix,
                    context_scale=r.context_scale, live_history=r.live_history),
        EngineConfig(conc=r.conc, duration_s=r.duration_s, warmup_s=r.warmup_fixed_s(),
                     warmup_auto=r.warmup_auto(), ramp_up_s=r.ramp_up(),
                     think_scale=r.think_scale, max_think_s=r.max_think_s,
                     drain_timeout_s=r.drain_timeout_s, max_tokens=body_max_tokens(r.extra_body),
                     max_error_rate=r.max_error_rate, error_window=r.error_window),
        Arrivals(r.arrival_mode(), r.session_rate, r.burstiness, r.time_scale, r.max_active)
        if r.open_loop() else None)


@dataclass
class DriveShare:
    """Everything a process needs to run its share of the lanes (picklable; holds the API
    key in memory only, never written)."""

    workload: Workload
    client: ClientConfig
    lanes: list[int]
    max_requests: int | None
    records_path: str
    token_info: dict
    max_model_len: int | None
    pool_blocks: int | None
    offload_blocks: int | None = None  # the offload tier behind the pool (None: no tier)
    offload_eager: bool = False  # the tier stores every computed block, not only evicted ones
    worker: int = 0


@dataclass
class DriveResult:
    worker: int
    t_start_ns: int
    t_end_ns: int
    warmup_end_ns: int
    stop_reason: str
    max_sessions_active: int
    loop_lag_ms: list[float] = field(default_factory=list)
    cpu_util: float | None = None
    host: str = ""
    runqueue_wait_ms_per_s: float | None = None  # ready but another process had the core
    cache_evictions: int = 0  # blocks the pool-sized cache model evicted (working set > pool)
    first_done_ns: int = 0  # every lane here had finished its first request (0: never)
    stop_ns: int = 0  # no new request started from here (duration, signal, ...)
    # open loop: (scheduled offset s, arrival ns, admission ns or 0, planned requests, cap
    # wait ns) per arrived session (open_loop.SessionLog)
    sessions: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    backoff_s: float = 0.0  # the lanes' waits after connect failures (engine/backoff.py)


def large_allocations_to_os(threshold: int = 256 * 1024) -> bool:
    """Make glibc serve allocations >= threshold with mmap and return them on free.

    A lane's request body is ~1 MB at 150k tokens. glibc's default raises its mmap threshold
    after the first such free, so later ones come from the heap, whose freed holes keep RSS
    at its high-water mark (bench/client_rss.py, 128 lanes: 467 MB peak without, 358 MB
    with). A fixed threshold turns that off. No-op where glibc's mallopt is absent."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_mmap_threshold = -3
        return bool(libc.mallopt(m_mmap_threshold, threshold))
    except (OSError, AttributeError):
        return False


def token_model_from_info(info: dict, thinking: str | None) -> TokenModel:
    """Rebuild the parent's token model in this process (no server round trip)."""
    mode = info.get("mode")
    if mode == "hf":
        kw = {"enable_thinking": thinking == "on"} if thinking else None
        return hf_model(info["tokenizer"], kw)
    if mode == "calibrated":
        factory = BlockFactory(WORDS, tokens_per_word=info["tokens_per_word"])
        return TokenModel("calibrated", factory, dict(info["overhead"]),
                          info["generation_prompt"], info.get("base", 0), None)
    return builtin_model()


async def drive(spec: DriveShare, on_engine: Callable[[LaneEngine], None] | None = None,
                tm: TokenModel | None = None, traces: TraceSet | None = None,
                ready: Callable[[], Awaitable[int]] | None = None) -> DriveResult:
    """Run this process's lanes; `tm` and `traces` are passed in-process to avoid rebuilding
    them (workers rebuild both from the share)."""
    w = spec.workload
    large_allocations_to_os()
    traces = traces or load_traces(w.trace)
    tm = tm or token_model_from_info(spec.token_info, w.thinking)
    synth = replace(w.synth, max_prompt_tokens=(spec.max_model_len - 16)
                    if spec.max_model_len else None,
                    lazy_text=tm.kind == "hf" and tm.pieces is not None)
    ecfg = replace(w.engine, lanes=spec.lanes, max_requests=spec.max_requests,
                   max_model_len=spec.max_model_len)
    writer = RecordWriter(spec.records_path)
    lag = LoopLagSampler()
    async with make_session(spec.client, len(spec.lanes)) as session:
        sender_cls = TokenIdsSender if tm.kind == "hf" else ChatSender
        sender = sender_cls(session, spec.client, keep_text=w.synth.live_history)
        cache_model = TieredCache(spec.pool_blocks, spec.offload_blocks, spec.offload_eager,
                                  queue=True)  # look up at admission, as vLLM does
        planner = Planner(traces, w.seed, w.start_min, w.start_max)
        arrivals = open_loop(planner, w.arrivals)
        engine = LaneEngine(planner, synth, tm, sender, ecfg, writer.write, cache_model, arrivals)
        if w.arrivals is not None:
            engine.stats.lanes = w.arrivals.max_active or 0
        if on_engine:
            on_engine(engine)
        tm.factory.prepare()  # the block tape (~0.2 s) now, not in the first request
        await engine.prepare()  # every lane's first session built before the start
        # every lane's connection now, while the server is idle (HTTPClient.preconnect). A
        # server that closes idle ones sooner than a lane starts (vLLM after 5 s:
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, vllm/envs.py) makes that lane connect at its start.
        await session.preconnect(sender.url, len(spec.lanes))
        # A full collection walks every tracked object: with the real traces loaded that is
        # ~1 s during which no timestamp is taken. Frozen objects are never walked.
        gc.freeze()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        lag.start()
        try:
            # a worker reports ready and gets the shared start instant (workers.StartGate)
            await engine.run(await ready() if ready else None)
        finally:
            await lag.stop()
            writer.close()
            sys.setswitchinterval(switch)
            gc.unfreeze()
    st = engine.stats
    return DriveResult(spec.worker, engine.t_start_ns, engine.t_end_ns, engine.warmup_end_ns,
                       engine.stop_reason, st.max_sessions_active,
                       lag.lags_ms, lag.cpu_util, socket.gethostname(), lag.runqueue_wait_ms_per_s,
                       cache_model.evictions, engine.first_done_ns, engine.stop_ns,
                       [x.row() for x in arrivals.log] if arrivals else [],
                       engine.backoff_ns / 1e9)


def open_loop(planner: Planner, a: Arrivals | None) -> OpenLoop | None:
    """The run's arrival schedule (None: closed loop, lanes)."""
    if a is None:
        return None

    def schedule() -> Iterator[tuple[float, SessionPick]]:
        return planner.arrivals(a.mode, a.session_rate, a.burstiness, a.time_scale)

    warm = warm_sessions((at for at, _ in schedule()), a.max_active)
    return OpenLoop(schedule(), a.max_active, warm)


def body_max_tokens(extra_body: dict) -> int | None:
    """The output cap --extra-body sets (max_tokens, or chat's max_completion_tokens), which
    the request body takes over the trace's; None when it sets none."""
    for key in ("max_tokens", "max_completion_tokens"):
        v = extra_body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None
