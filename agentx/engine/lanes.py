"""Closed-loop replay engine: N session lanes, each replaying sessions turn by turn.

A lane picks a session (Planner) and opens it: rebuilds its history up to the start turn
without sending and builds its first request, the turn before the start, sent as a flagged
warm-up ("prime") request. Then per turn: build the request, wait out the rest of the
(scaled, capped) think time counted from the previous response's end, send, await the full
response, next. A subagent step runs the child session inside the lane; the parent continues
when it has finished. When the session ends the lane goes on with the next one at once.
Only N lanes exist, so at most N sessions are in progress and at most N requests are in
flight.

Building never sits between a request's intended send time and its send where it can be
avoided: every lane's first session is opened before the start (`prepare`), the next
session is opened while the current one's last turn runs, and a turn is built inside its
think time. The intended send time is the think time's end (a session's first request: the
previous session's end, or the lane's start), so `dispatch_lag_ms` counts what did not fit.

Start-up: lane i starts at i x --ramp-up / conc. Warm-up: requests sent before the warm-up
ends are flagged (and the primes always): after --warmup seconds, or with --warmup auto when
every lane's first request has ended (`first_done_ns`), --duration then counting from there.

Open loop (--session-rate, --arrivals trace): no lanes; sessions start at their arrival times
(open_loop.py) and each runs as a lane's session does.

Stopping: at --duration or --max-requests no new request starts; in-flight requests finish
within --drain-timeout, the rest are cancelled and recorded as `cancelled`. From outside (a
signal, the parent of a worker process, a Ray driver) the one way in is `request_stop()`:
the same drain, or with force=True the cancellation at once; a failure share above
--max-error-rate forces it too (engine/abort.py). Every request that started is recorded
exactly once. A request ends within --request-timeout (client/wire.py), so a run ends within
the bound docs/reliability.md gives, whatever the server does. A 429 or 503 with Retry-After
holds the lane's next request back that long (at most RETRY_AFTER_MAX_S, never past the stop);
a request that could not connect holds it back by the lane's back-off (engine/backoff.py).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from ..aio import Steps, run_steps, run_steps_async
from ..client.assemble import assemble
from ..client.facts import StreamFacts
from ..prefix_cache import Admission, TieredCache, sent_keys
from ..prompt.synth import Conversation, PreparedTurn, SynthConfig
from ..prompt.token_model import TokenModel
from ..records import RequestRecord
from ..session_plan import Planner, split_count
from ..trace.model import Subagent, Trace, Turn
from .abort import ErrorWindow
from .backoff import Backoff
from .open_loop import OpenLoop

perf_ns = time.perf_counter_ns
NEVER = 1 << 62  # an auto warm-up's end until it is known (no request is sent that late)
# An auto warm-up still going this many durations after the ramp-up stops the run. Every lane's
# first request is a cold prompt: 64 lanes of the swe trace at --context-scale 0.2 send 1.74M
# prompt tokens at once (plan.Planner, seed 0), and their working set exceeds the 759k-token KV
# pool of the simulated H200 with Qwen3-8B, which then prefills every request cold at ~20k tok/s:
# its last lane finished its first request 218 s into a 60 s run (bench/steady_state.py,
# 2026-12-01), so the warm-up can outlast the duration several times.
WARMUP_LIMIT = 5.0
# A 429's or 503's Retry-After is honoured up to this: the lane sends its next request no
# earlier (the wait ends at the run's stop too). A server asking for more is, for a benchmark,
# as good as down; a longer wait would only idle the lane while the run's clock goes on.
RETRY_AFTER_MAX_S = 60.0
OPEN_BUDGET = -1  # the --max-requests key of an open-loop run (one budget, not per lane)


@dataclass
class EngineConfig:
    conc: int = 8
    lanes: list[int] | None = None  # lane ids this engine runs (a worker's share); default all
    duration_s: float | None = 60.0
    max_requests: int | None = None
    warmup_s: float = 0.0
    warmup_auto: bool = False  # the warm-up ends when every lane has finished its first request
    ramp_up_s: float = 0.0  # lane i starts at i * ramp_up_s / conc (global lane ids)
    think_scale: float = 1.0
    max_think_s: float = 300.0
    drain_timeout_s: float = 30.0
    prime: bool = True  # send the turn before the start turn as a warm-up request
    max_model_len: int | None = None
    # --extra-body's max_tokens, which the request body takes over the trace's: the record's
    # osl_intended must be what was asked, or a full answer reads as the server's lie
    max_tokens: int | None = None
    max_error_rate: float = 0.0  # abort above this failure share (engine/abort.py); 0: never
    error_window: int = 50


class Sender(Protocol):
    async def prepare(self, conv: Conversation, turn: PreparedTurn) -> Any:
        """What `send` needs, made before the send time (the body, or None)."""

    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord,
                   prepared: Any = None) -> str | None:
        """Send one turn, fill rec; return the generated text when live history is on."""


@dataclass
class LiveStats:
    """Counters the progress display and the self-measurement read while the run goes."""

    lanes: int = 0
    sessions_active: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    max_sessions_active: int = 0
    started: int = 0
    done: int = 0
    errors: int = 0
    recent_ttft_ms: list[float] = field(default_factory=list)
    recent_tpot_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0  # of the requests done so far (warm-up included)
    # done since the warm-up ended: the live throughput's counts (the headline's rule, so
    # the slow start-up does not drag the figure down: report/progress.py)
    window_done: int = 0
    window_output_tokens: int = 0
    # the run's phases for the progress display (report/progress.py), in seconds since the
    # lanes started: relative, so worker processes and Ray actors on other clocks agree
    running: bool = False  # the lanes have started
    start_wall: float = 0.0  # when (time.time(): the one clock the driver and workers share)
    ramp_up_s: float = 0.0
    warmup_end_s: float | None = None  # None: an auto warm-up not over yet
    duration_s: float | None = None  # --duration (None: --max-requests only)
    limit_s: float | None = None  # when the duration timer stops the run (None: no timer)
    max_requests: int | None = None
    stopping: bool = False  # no new request: in-flight ones draining

    def note(self, rec: RequestRecord) -> None:
        self.done += 1
        self.output_tokens += rec.osl or 0
        if self.warmup_end_s is not None and time.time() - self.start_wall >= self.warmup_end_s:
            self.window_done += 1
            self.window_output_tokens += rec.osl or 0
        if not rec.ok:
            self.errors += rec.error != "cancelled"  # the run's own stop is no server error
            return
        if rec.ttft_ms is not None:
            self.recent_ttft_ms.append(rec.ttft_ms)
            del self.recent_ttft_ms[:-512]
        if rec.tpot_ms is not None:
            self.recent_tpot_ms.append(rec.tpot_ms)
            del self.recent_tpot_ms[:-512]


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _LaneDone(Exception):
    """This lane has started its share of --max-requests."""


@dataclass
class _Opened:
    """A session ready to send: history built, its first request built (`prepared`, `body`)
    from its step `pos` (None: the session has no turn to send)."""

    conv: Conversation
    instance: str
    sid: str
    subagent: str
    start_turn: int
    pos: int | None = None
    turn_no: int = -1
    prepared: PreparedTurn | None = None
    body: Any = None


class LaneEngine:
    def __init__(self, planner: Planner, synth: SynthConfig, token_model: TokenModel,
                 sender: Sender, cfg: EngineConfig,
                 on_record: Callable[[RequestRecord], None | Awaitable[None]],
                 cache_model: TieredCache | None = None,
                 open_loop: OpenLoop | None = None) -> None:
        self.planner, self.synth, self.tm = planner, synth, token_model
        self.open_loop = open_loop  # sessions arrive on a schedule instead of lanes
        self.cache_model = cache_model or TieredCache(None)
        self.sender, self.cfg, self.on_record = sender, cfg, on_record
        self.stats = LiveStats(lanes=len(cfg.lanes) if cfg.lanes is not None else cfg.conc)
        self._stop = asyncio.Event()
        self._sleepers: set[asyncio.Future] = set()  # lanes in _pause, woken by a stop
        self._forced = False
        self._inflight: dict[str, asyncio.Task] = {}
        self._req_seq = 0
        self._budget: dict[int, int] | None = None  # lane -> requests it may still start
        self.t_start_ns = 0
        self.t_end_ns = 0
        self.warmup_end_ns = 0
        self.first_done_ns = 0  # when every lane here had finished its first request (0: never)
        self._first_end_max = 0  # the latest end of a lane's first request so far
        self.stop_ns = 0  # when no new request could start any more
        self._first_pending: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.stop_reason = ""
        self._errors = ErrorWindow(cfg.max_error_rate, cfg.error_window)
        # the cache model's operations run one at a time, each in steps (prefix_cache.py)
        self._cache_lock = asyncio.Lock()
        self._opened: dict[int, _Opened] = {}  # lanes' first sessions, opened by `prepare`
        self._not_before: dict[int, int] = {}  # lane -> no request before (a Retry-After)
        self._backoff = Backoff(cfg.lanes[0] if cfg.lanes else 0)  # jitter differs per worker
        self._backoff_until: dict[int, int] = {}  # lane -> no request before (connect failed)
        self.backoff_ns = 0  # the lanes' back-off waits, summed

    # -- control ----------------------------------------------------------------------------
    def request_stop(self, force: bool = False, reason: str = "signal") -> None:
        """Stop the run from outside. The first call starts no new request and lets in-flight
        ones finish within cfg.drain_timeout_s; force=True (at any time) cancels them now.
        Repeating a call is harmless; must run on the engine's loop."""
        self._end(reason)
        if force and not self._forced:
            self._forced = True
            self._cancel_inflight()

    def _end(self, reason: str) -> None:
        """No new requests from now on; the first reason given is the run's stop_reason."""
        if not self._stop.is_set():
            self.stop_reason = reason
            self.stop_ns = perf_ns()
            self.stats.stopping = True
            self._stop.set()
            for fut in self._sleepers:
                _wake(fut)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    def _lane_ids(self) -> list[int]:
        if self.open_loop is not None:
            return []
        return self.cfg.lanes if self.cfg.lanes is not None else list(range(self.cfg.conc))

    async def prepare(self) -> None:
        """Open every lane's first session before the start, so the first requests are sent
        at the start, not after their histories are built (~10 ms of work each, one lane
        after another on this loop: at 64 lanes 0.6 s that would fall inside the run)."""
        for lane in self._lane_ids():
            self._opened[lane] = await self._open_pick(lane, 0)

    async def run(self, t0_ns: int | None = None) -> None:
        """Run the lanes; with t0_ns (a monotonic instant shared by worker processes) start
        at that instant so every worker's duration and warm-up windows line up."""
        cfg = self.cfg
        lanes = self._lane_ids()
        if t0_ns is not None and t0_ns > perf_ns():
            await asyncio.sleep((t0_ns - perf_ns()) / 1e9)
        self.t_start_ns = t0_ns if t0_ns is not None else perf_ns()
        # auto: unknown until every lane's first request has ended (_first_ended)
        self.warmup_end_ns = NEVER if cfg.warmup_auto else self.t_start_ns + int(cfg.warmup_s * 1e9)
        self.stats.ramp_up_s, self.stats.duration_s = cfg.ramp_up_s, cfg.duration_s
        self.stats.warmup_end_s = None if cfg.warmup_auto else cfg.warmup_s
        self.stats.max_requests, self.stats.running = cfg.max_requests, True
        self.stats.start_wall = time.time() - (perf_ns() - self.t_start_ns) / 1e9
        self._first_pending = set(lanes)
        if cfg.max_requests is not None and lanes:
            # each lane gets a fixed share, so which requests run never depends on timing
            self._budget = dict(zip(lanes, split_count(cfg.max_requests, [1] * len(lanes))))
        tasks = [asyncio.create_task(self._lane(lane), name=f"lane-{lane}") for lane in lanes]
        if self.open_loop is not None:  # sessions 0..warm_n-1 stand for the lanes
            self._first_pending = set(range(self.open_loop.warm_n))
            if cfg.max_requests is not None:  # one budget shared in arrival order
                self._budget = {OPEN_BUDGET: cfg.max_requests}
            tasks = [asyncio.create_task(self.open_loop.run(self), name="arrivals")]
        if cfg.duration_s:  # an auto warm-up may take WARMUP_LIMIT x duration after the ramp
            limit = (cfg.ramp_up_s + WARMUP_LIMIT * cfg.duration_s if cfg.warmup_auto
                     else cfg.duration_s)
            self._arm(limit - (perf_ns() - self.t_start_ns) / 1e9)
        await self._stop.wait()
        # no new requests from here; lanes sleeping in think time stop at once
        pending = [t for t in self._inflight.values() if not t.done()]
        if pending and not self._forced:  # a forced stop ends the wait by cancelling them
            await asyncio.wait(pending, timeout=cfg.drain_timeout_s)
        self._cancel_inflight()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._timer:
            self._timer.cancel()
        self.t_end_ns = perf_ns()
        self.warmup_end_ns = min(self.warmup_end_ns, self.t_end_ns)

    def _arm(self, seconds: float) -> None:
        """(Re)start the --duration timer: `seconds` from now the run stops."""
        if self._timer:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, seconds), self._end,
                                                            "duration")
        self.stats.limit_s = (perf_ns() - self.t_start_ns) / 1e9 + max(0.0, seconds)

    def _first_ended(self, lane: int, end_ns: int) -> None:
        """`lane`'s first request ended at `end_ns` (or the lane ended without one). When it
        is the last lane to get there, the start-up is over: an auto warm-up ends at the
        latest of those ends (not at this call, a little later: the lane's next request,
        due at that end with no think time, is in the window, not the warm-up) and
        --duration counts from here."""
        if lane not in self._first_pending:
            return
        self._first_pending.discard(lane)
        self._first_end_max = max(self._first_end_max, end_ns)
        if self._first_pending or self.stopping:
            return
        self.first_done_ns = self._first_end_max
        if self.cfg.warmup_auto:
            self.warmup_end_ns = self.first_done_ns
            self.stats.warmup_end_s = (self.first_done_ns - self.t_start_ns) / 1e9
            if self.cfg.duration_s:
                self._arm(self.cfg.duration_s)

    def _cancel_inflight(self) -> None:
        """Cancel requests still running (recorded as `cancelled`)."""
        for t in list(self._inflight.values()):
            if not t.done():
                t.cancel()

    # -- lanes and sessions -----------------------------------------------------------------
    async def _lane(self, lane: int) -> None:
        try:
            await self._lane_sessions(lane)
        finally:
            self._first_ended(lane, perf_ns())  # a lane that sent nothing holds up no one

    async def _lane_sessions(self, lane: int) -> None:
        cfg = self.cfg
        if cfg.ramp_up_s:  # evenly spread, by global lane id: the same with any --workers
            start = self.t_start_ns + int(lane * cfg.ramp_up_s / cfg.conc * 1e9)
            await self._pause((start - perf_ns()) / 1e9)
        n = 0
        ahead: _Opened | asyncio.Task | None = self._opened.pop(lane, None)

        def open_next() -> None:  # called when the current session's last turn is built
            nonlocal ahead
            if ahead is None and not self.stopping:
                ahead = asyncio.create_task(self._open_pick(lane, n))

        try:
            while not self.stopping:
                ready_ns = perf_ns()  # the previous session's end: this one is due now
                this = n
                self.stats.sessions_active += 1
                self.stats.max_sessions_active = max(self.stats.max_sessions_active,
                                                     self.stats.sessions_active)
                try:
                    if isinstance(ahead, asyncio.Task):
                        op = await ahead
                    else:
                        op = ahead or await self._open_pick(lane, n)
                    ahead = None
                    n += 1
                    await self._run_session(lane, op, ready_ns, open_next)
                except _LaneDone:
                    if not any(self._budget.values()):
                        self._end("max_requests")
                    return
                except Exception as exc:  # a bug must not silently leave the run a lane short
                    trace_id = self.planner.pick(lane, this).trace.id
                    self._end(f"error: lane {lane} ({trace_id}): {type(exc).__name__}: {exc}")
                    raise
                finally:
                    self.stats.sessions_active -= 1
        finally:
            if isinstance(ahead, asyncio.Task):  # the run stopped before that session began
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)

    async def _arrived_session(self, k: int, op: _Opened, ready_ns: int) -> None:
        """Run open-loop session k (open_loop.py), its first request due at `ready_ns`; the
        budget's end or a bug ends the run as in a lane."""
        self.stats.sessions_active += 1
        self.stats.max_sessions_active = max(self.stats.max_sessions_active,
                                             self.stats.sessions_active)
        try:
            await self._run_session(k, op, ready_ns)
        except _LaneDone:
            self._end("max_requests")
        except Exception as exc:
            self._end(f"error: session {op.instance} ({op.conv.trace.id}): "
                      f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.stats.sessions_active -= 1
            self._first_ended(k, perf_ns())  # a session that sent nothing holds up no one

    async def _open_pick(self, lane: int, n: int) -> _Opened:
        pick = self.planner.pick(lane, n)
        return await self._open(pick.trace, pick.instance, pick.start_turn, "")

    async def _open(self, trace: Trace, instance: str, start_turn: int,
                    subagent: str) -> _Opened:
        """Build a session's history up to its first request to send, and that request."""
        conv = Conversation(trace, instance, self.synth, self.tm)
        sid = f"{self.synth.run_ns[:8]}-{instance}{'/' + subagent if subagent else ''}"
        op = _Opened(conv, instance, sid, subagent, start_turn)
        for pos, step in enumerate(trace.steps):
            if isinstance(step, Subagent):  # spawned before this replay starts sending
                continue
            op.turn_no += 1
            if op.turn_no < start_turn - 1 or (op.turn_no == start_turn - 1
                                               and not self.cfg.prime):
                prepared = conv.next_turn(step, op.turn_no)  # history only, not sent
                conv.answered(prepared.max_tokens)
                # one turn's build at a time: a lane starting deep into a long session builds
                # its whole history here, which in one piece held the loop (and every other
                # lane's timestamps) for hundreds of ms
                await asyncio.sleep(0)
                continue
            op.pos, op.prepared = pos, conv.next_turn(step, op.turn_no)
            op.body = await self.sender.prepare(conv, op.prepared)
            return op
        return op

    async def _run_session(self, lane: int, op: _Opened, ready_ns: int,
                           on_last_turn: Callable[[], None] | None = None) -> None:
        """Send an opened session's requests from its first, due at `ready_ns`."""
        if op.pos is None:
            return
        conv, steps = op.conv, op.conv.trace.steps
        last = max(i for i, st in enumerate(steps) if not isinstance(st, Subagent))
        turn_no, prepared, body, due = op.turn_no, op.prepared, op.body, ready_ns
        for pos in range(op.pos, len(steps)):
            step = steps[pos]
            if self.stopping:
                return
            if isinstance(step, Subagent):  # spawned while this replay sends: run it, go on
                await self._session(lane, step.trace, f"{op.instance}.{step.agent_id}", 0,
                                    step.agent_id)
                ready_ns = perf_ns()
                continue
            if pos != op.pos:  # built inside its think time, counted from the last response
                turn_no += 1
                due = ready_ns + self._think_ns(step.think_time)
                prepared = conv.next_turn(step, turn_no)
                body = await self.sender.prepare(conv, prepared)
            if pos == last and on_last_turn is not None:
                on_last_turn()
            if self._budget is not None:
                key = OPEN_BUDGET if self.open_loop is not None else lane
                if self._budget[key] <= 0:
                    raise _LaneDone
                self._budget[key] -= 1
            due = max(due, self._not_before.get(lane, 0))  # the wait a Retry-After asked
            hold = self._backoff_until.get(lane, 0)  # the server could not be reached
            if hold > due:
                self.backoff_ns += hold - max(due, perf_ns())
                due = hold
            await self._pause((due - perf_ns()) / 1e9)
            if self.stopping:
                return
            ready_ns = await self._request(lane, conv, step, turn_no, op.sid, conv.trace.id,
                                           op.subagent, turn_no == op.start_turn - 1,
                                           pos != op.pos, prepared, body, due)
            body = None

    async def _session(self, lane: int, trace: Trace, instance: str, start_turn: int,
                       subagent: str) -> None:
        """Open a session and run it (a subagent's: its first request is due now)."""
        ready_ns = perf_ns()
        await self._run_session(lane, await self._open(trace, instance, start_turn, subagent),
                                ready_ns)

    def _think_ns(self, think_s: float) -> int:
        return int(min(think_s * self.cfg.think_scale, self.cfg.max_think_s) * 1e9)

    async def _pause(self, delay: float) -> None:
        """Sleep `delay` s, or less if the run stops meanwhile. One timer and one future:
        `wait_for(event.wait())` took a task, a cancellation and several loop turns to wake,
        all of it dispatch lag."""
        if delay <= 0 or self.stopping:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        handle = loop.call_later(delay, _wake, fut)
        self._sleepers.add(fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._sleepers.discard(fut)

    async def _cache_op(self, steps: Steps[Any]) -> Any:
        """One cache-model operation, in steps, after those already queued (so the model goes
        through the same states as if each ran at once, in call order)."""
        async with self._cache_lock:
            try:
                return await run_steps_async(steps)
            except asyncio.CancelledError:
                run_steps(steps)  # finish it now: a half-done operation would corrupt the model
                raise

    async def _expect_pool(self, conv: Conversation, step: Turn,
                           tokens: int) -> Admission | None:
        """The prompt's blocks (of its `tokens` as sent: `sent_keys`) join the pool model's
        queue at send, as the request joins the server's; the model looks it up when it
        admits it (TieredCache). None when the server's pool is unknown: the record keeps the
        infinite-cache figure."""
        keys = sent_keys(conv.block_keys(step.hash_ids), tokens,
                         conv.trace.block_size * self.synth.context_scale)
        return await self._cache_op(self.cache_model.submit_steps(keys))

    async def _note_expected(self, rec: RequestRecord, conv: Conversation,
                             ticket: Admission) -> None:
        """The response is in, so the server admitted the request: record the pool-aware
        expected hit, as the model saw it at the admission."""
        await self._cache_op(self.cache_model.settle_steps(ticket))
        bs_tokens = conv.trace.block_size * self.synth.context_scale
        rec.cached_expected_pool = min(rec.isl_intended, int((ticket.hits or 0) * bs_tokens))
        rec.cached_expected_offload = min(rec.cached_expected_pool,
                                          int(ticket.tier_hits * bs_tokens))

    async def _request(self, lane: int, conv: Conversation, step: Turn, turn_no: int, sid: str,
                       trace_id: str, subagent: str, prime: bool, warm: bool,
                       prepared: PreparedTurn, body: Any, intended: int) -> int:
        """Send one built turn that was due at `intended`; `warm` says this conversation
        already sent a request (so the trace's prefix hit applies to it; the first request of
        a replay finds a cold cache). Returns when the response ended."""
        cfg = self.cfg
        expected = prepared.expected_cached if warm else 0
        max_tokens = cfg.max_tokens or prepared.max_tokens
        if cfg.max_model_len:
            max_tokens = max(1, min(max_tokens, cfg.max_model_len - prepared.intended_in))
        self._req_seq += 1
        rid = f"{self.synth.run_ns[:8]}-{lane}-{self._req_seq}"
        rec = RequestRecord(request_id=rid, session_id=sid, lane=lane, turn=turn_no,
                            warmup=prime or intended < self.warmup_end_ns, trace_id=trace_id,
                            subagent=subagent, kind="prime" if prime else "turn",
                            intended_send_ns=intended, isl_intended=prepared.intended_in,
                            osl_intended=max_tokens,
                            cached_expected=expected, cached_expected_pool=expected)
        prepared.max_tokens = max_tokens
        self.stats.started += 1
        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        # the lane sends itself, so the write happens in this loop turn (a request task would
        # start a turn or two later: dispatch lag); a stop cancels the lane while in flight
        self._inflight[rid] = asyncio.current_task()
        # the cache-model bookkeeping (~1 us per prompt block) starts after the write
        acquire = asyncio.create_task(self._expect_pool(conv, step, prepared.intended_in))
        live_text = None
        ticket: Admission | None = None
        end_ns = 0
        try:
            live_text = await self.sender.send(conv, prepared, rec, body)
        except asyncio.CancelledError:
            if not rec.start_ns:  # cancelled before it was sent: nothing was measured
                assemble(rec, StreamFacts(error="cancelled"))
        except Exception as exc:  # a bug in rendering/sending must not lose the record
            rec.error = rec.error or type(exc).__name__
            rec.error_detail = str(exc)[:300]
            rec.ok = False
        finally:
            end_ns = perf_ns()
            self._inflight.pop(rid, None)
            try:
                ticket = await acquire
                if ticket is not None and rec.start_ns:  # sent: the server took it
                    await self._note_expected(rec, conv, ticket)
            except Exception as exc:  # the record matters more than the model
                rec.error_detail = rec.error_detail or f"cache model: {exc}"[:300]
            self.stats.in_flight -= 1
            self.stats.note(rec)
            self._first_ended(lane, end_ns)
            abort = self._errors.note(rec.ok, rec.error)
            if abort:  # the server fails most requests: stop now, cancel the rest
                self.request_stop(force=True, reason=abort)
            if rec.error == "connect":  # the lane backs off before its next request
                self._backoff_until[lane] = end_ns + int(self._backoff.failed(lane) * 1e9)
            elif rec.status:
                self._backoff.answered(lane)
            if rec.retry_after_s is not None:  # the lane's next request waits (_run_session)
                rec.retry_after_s = min(rec.retry_after_s, RETRY_AFTER_MAX_S)
                self._not_before[lane] = end_ns + int(rec.retry_after_s * 1e9)
            res = self.on_record(rec)
            if asyncio.iscoroutine(res):
                await res
            if ticket is not None:
                await self._cache_op(self.cache_model.finish_steps(ticket))
        conv.answered(rec.osl or max_tokens, live_text)
        return end_ns
