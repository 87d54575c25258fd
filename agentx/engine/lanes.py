"""Closed-loop replay engine: N session lanes, each replaying sessions turn by turn.

A lane picks a session (Planner), rebuilds its history up to the start turn without sending,
sends the turn before the start as a flagged warm-up ("prime") request, then per turn: sleep
the (scaled, capped) think time, send, await the full response, next. A subagent step runs
the child session inside the lane; the parent continues when it has finished. When the
session ends the lane picks a new one. Only N lanes exist, so at most N sessions are in
progress and at most N requests are in flight.

Start-up: lane i starts at i x --ramp-up / conc. Warm-up: requests sent before the warm-up
ends are flagged (and the primes always): after --warmup seconds, or with --warmup auto when
every lane's first request has ended (`first_done_ns`), --duration then counting from there.

Stopping: at --duration or --max-requests no new request starts; in-flight requests finish
within --drain-timeout, the rest are cancelled and recorded as `cancelled`. From outside (a
signal, the parent of a worker process, a Ray driver) the one way in is `request_stop()`:
the same drain, or with force=True the cancellation at once; a failure share above
--max-error-rate forces it too (engine/abort.py). Every request that started is recorded
exactly once.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

from ..client.facts import StreamFacts
from ..plan import Planner, split_count
from ..prefix_cache import PrefixCache, TieredCache
from ..prompt.synth import Conversation, PreparedTurn, SynthConfig
from ..prompt.token_model import TokenModel
from ..records import RequestRecord, assemble
from ..trace.model import Subagent, Trace, Turn
from .abort import ErrorWindow

perf_ns = time.perf_counter_ns
NEVER = 1 << 62  # an auto warm-up's end until it is known (no request is sent that late)
# An auto warm-up still going this many durations after the ramp-up stops the run. Every lane's
# first request is a cold prompt: 64 lanes of the swe trace at --context-scale 0.2 send 1.74M
# prompt tokens at once (plan.Planner, seed 0), and their working set exceeds the 759k-token KV
# pool of the simulated H200 with Qwen3-8B, which then prefills every request cold at ~20k tok/s:
# its last lane finished its first request 218 s into a 60 s run (bench/steady_state.py,
# 2026-12-01), so the warm-up can outlast the duration several times.
WARMUP_LIMIT = 5.0


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
    max_error_rate: float = 0.0  # abort above this failure share (engine/abort.py); 0: never
    error_window: int = 50


class Sender(Protocol):
    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord) -> str | None:
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

    def note(self, rec: RequestRecord) -> None:
        self.done += 1
        if not rec.ok:
            self.errors += 1
            return
        if rec.ttft_ms is not None:
            self.recent_ttft_ms.append(rec.ttft_ms)
            del self.recent_ttft_ms[:-512]
        if rec.tpot_ms is not None:
            self.recent_tpot_ms.append(rec.tpot_ms)
            del self.recent_tpot_ms[:-512]


class _LaneDone(Exception):
    """This lane has started its share of --max-requests."""


class Engine:
    def __init__(self, planner: Planner, synth: SynthConfig, token_model: TokenModel,
                 sender: Sender, cfg: EngineConfig,
                 on_record: Callable[[RequestRecord], None | Awaitable[None]],
                 cache_model: PrefixCache | TieredCache | None = None) -> None:
        self.planner, self.synth, self.tm = planner, synth, token_model
        self.cache_model = cache_model or PrefixCache(None)
        self.sender, self.cfg, self.on_record = sender, cfg, on_record
        self.stats = LiveStats(lanes=len(cfg.lanes) if cfg.lanes is not None else cfg.conc)
        self._stop = asyncio.Event()
        self._forced = False
        self._inflight: dict[str, asyncio.Task] = {}
        self._req_seq = 0
        self._budget: dict[int, int] | None = None  # lane -> requests it may still start
        self.t_start_ns = 0
        self.t_end_ns = 0
        self.warmup_end_ns = 0
        self.first_done_ns = 0  # when every lane here had finished its first request (0: never)
        self.stop_ns = 0  # when no new request could start any more
        self._first_pending: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.stop_reason = ""
        self._errors = ErrorWindow(cfg.max_error_rate, cfg.error_window)

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
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self, t0_ns: int | None = None) -> None:
        """Run the lanes; with t0_ns (a monotonic instant shared by worker processes) start
        at that instant so every worker's duration and warm-up windows line up."""
        cfg = self.cfg
        lanes = cfg.lanes if cfg.lanes is not None else list(range(cfg.conc))
        if t0_ns is not None and t0_ns > perf_ns():
            await asyncio.sleep((t0_ns - perf_ns()) / 1e9)
        self.t_start_ns = t0_ns if t0_ns is not None else perf_ns()
        # auto: unknown until every lane's first request has ended (_first_ended)
        self.warmup_end_ns = NEVER if cfg.warmup_auto else self.t_start_ns + int(cfg.warmup_s * 1e9)
        self._first_pending = set(lanes)
        if cfg.max_requests is not None:
            # each lane gets a fixed share, so which requests run never depends on timing
            self._budget = dict(zip(lanes, split_count(cfg.max_requests, [1] * len(lanes))))
        tasks = [asyncio.create_task(self._lane(lane), name=f"lane-{lane}") for lane in lanes]
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

    def _first_ended(self, lane: int) -> None:
        """`lane`'s first request has ended (or the lane ended without one). When it is the
        last lane to get there, the start-up is over: an auto warm-up ends now and --duration
        counts from here."""
        if lane not in self._first_pending:
            return
        self._first_pending.discard(lane)
        if self._first_pending or self.stopping:
            return
        self.first_done_ns = perf_ns()
        if self.cfg.warmup_auto:
            self.warmup_end_ns = self.first_done_ns
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
            self._first_ended(lane)  # a lane that sent nothing holds up no one

    async def _lane_sessions(self, lane: int) -> None:
        cfg = self.cfg
        if cfg.ramp_up_s:  # evenly spread, by global lane id: the same with any --workers
            start = self.t_start_ns + int(lane * cfg.ramp_up_s / cfg.conc * 1e9)
            await self._pause((start - perf_ns()) / 1e9)
        n = 0
        while not self.stopping:
            pick = self.planner.pick(lane, n)
            n += 1
            self.stats.sessions_active += 1
            self.stats.max_sessions_active = max(self.stats.max_sessions_active,
                                                 self.stats.sessions_active)
            try:
                await self._session(lane, pick.trace, pick.instance, pick.start_turn, "")
            except _LaneDone:
                if not any(self._budget.values()):
                    self._end("max_requests")
                return
            except Exception as exc:  # a bug must not silently leave the run a lane short
                self._end(f"error: lane {lane} ({pick.trace.id}): {type(exc).__name__}: {exc}")
                raise
            finally:
                self.stats.sessions_active -= 1

    async def _session(self, lane: int, trace: Trace, instance: str, start_turn: int,
                       subagent: str) -> None:
        conv = Conversation(trace, instance, self.synth, self.tm)
        sid = f"{self.synth.run_ns[:8]}-{instance}{'/' + subagent if subagent else ''}"
        turn_no = -1
        sent = False
        for step in trace.steps:
            if self.stopping:
                return
            if isinstance(step, Subagent):
                if sent:  # spawned after this replay started sending: run it, then go on
                    await self._subagents(lane, step, instance)
                continue
            turn_no += 1
            if turn_no < start_turn - 1 or (turn_no == start_turn - 1 and not self.cfg.prime):
                prepared = conv.next_turn(step, turn_no)  # history only, not sent
                conv.answered(prepared.max_tokens)
                # one turn's build at a time: a lane starting deep into a long session builds
                # its whole history here, which in one piece held the loop (and every other
                # lane's timestamps) for hundreds of ms
                await asyncio.sleep(0)
                continue
            prime = turn_no == start_turn - 1
            if sent:  # the lane's first request goes at once; later ones after think time
                await self._think(step.think_time)
                if self.stopping:
                    return
            await self._request(lane, conv, step, turn_no, sid, trace.id, subagent, prime, sent)
            sent = True

    async def _subagents(self, lane: int, step: Subagent, instance: str) -> None:
        child = f"{instance}.{step.agent_id}"
        await self._session(lane, step.trace, child, 0, step.agent_id)

    async def _think(self, think_s: float) -> None:
        await self._pause(min(think_s * self.cfg.think_scale, self.cfg.max_think_s))

    async def _pause(self, delay: float) -> None:
        """Sleep `delay` s, or less if the run stops meanwhile."""
        if delay > 0:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    def _expect_pool(self, rec: RequestRecord, keys: list, block_size: int) -> None:
        """The server holds the prompt's blocks from its send until the response ends: acquire
        them in the pool model (released in _request) and record the pool-aware expected hit
        (the infinite-cache figure when the server's pool is unknown)."""
        hit_blocks = self.cache_model.acquire(keys)
        if hit_blocks is None:
            return
        bs_tokens = block_size * self.synth.context_scale
        rec.cached_expected_pool = min(rec.isl_intended, int(hit_blocks * bs_tokens))
        tier_blocks = getattr(self.cache_model, "last_tier_hits", 0)
        rec.cached_expected_offload = min(rec.cached_expected_pool, int(tier_blocks * bs_tokens))

    async def _request(self, lane: int, conv: Conversation, step: Turn, turn_no: int, sid: str,
                       trace_id: str, subagent: str, prime: bool, warm: bool) -> None:
        """Send one turn; `warm` says this conversation already sent a request (so the
        trace's prefix hit applies to it; the first request of a replay finds a cold cache)."""
        cfg = self.cfg
        if self._budget is not None:
            if self._budget[lane] <= 0:
                raise _LaneDone
            self._budget[lane] -= 1
        intended = perf_ns()
        prepared = conv.next_turn(step, turn_no)
        expected = prepared.expected_cached if warm else 0
        max_tokens = prepared.max_tokens
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
        task = asyncio.create_task(self.sender.send(conv, prepared, rec))
        self._inflight[rid] = task
        live_text = None
        keys: list | None = None
        try:
            # the request's first step (build and write) runs before the cache-model
            # bookkeeping below, which costs ~1 us per prompt block and is not the request's
            await asyncio.sleep(0)
            keys = conv.block_keys(step.hash_ids)
            self._expect_pool(rec, keys, conv.trace.block_size)
            live_text = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # this lane itself was cancelled: let the request record
                task.cancel()  # what it saw (the client assembles a cancelled record)
                await asyncio.wait({task}, timeout=1.0)
            if not rec.start_ns:  # cancelled before it was sent: nothing was measured
                assemble(rec, StreamFacts(error="cancelled"))
        except Exception as exc:  # a bug in rendering/sending must not lose the record
            rec.error = rec.error or type(exc).__name__
            rec.error_detail = str(exc)[:300]
            rec.ok = False
        finally:
            if keys is not None:
                self.cache_model.release(keys)
            self._inflight.pop(rid, None)
            self.stats.in_flight -= 1
            self.stats.note(rec)
            self._first_ended(lane)
            abort = self._errors.note(rec.ok, rec.error)
            if abort:  # the server fails most requests: stop now, cancel the rest
                self.request_stop(force=True, reason=abort)
            res = self.on_record(rec)
            if asyncio.iscoroutine(res):
                await res
        conv.answered(rec.osl or max_tokens, live_text)
