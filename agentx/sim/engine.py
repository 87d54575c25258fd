"""The simulated vLLM engine: a continuous-batching step loop over a paged, prefix-cached KV pool.

One asyncio task runs steps back to back, as vLLM's EngineCore does:
  1. schedule (vLLM v1 order, sim/sched.py): running requests first, preempting the newest
     when the KV pool runs out; then, only if nothing was preempted, waiting requests FCFS
     after a prefix-cache lookup (GPU first, then the offload tier, whose hits load
     asynchronously);
  2. price the step with the roofline (`timing.StepTiming`) and sleep until it ends
     (durations divided by `time_scale`);
  3. apply it: commit filled blocks to the prefix cache, sample 1 (+accepted drafts) tokens
     per decoding request, push them to the request's HTTP handler, retire finished ones.
All times are wall-clock (perf_counter) of this process; modelled durations are scaled.
Offline (sim_calibration/offline.py) the same steps run on a virtual clock instead: `use_virtual_clock()`,
then `step_offline()` per step, no sleeping. The fidelity mode (fixed TTFT/ITL, no batching
model) is the subclass in sim/fixed.py; sim/build.py assembles an engine from a SimConfig.
"""
from __future__ import annotations

import asyncio
import time

from ..aio import cancel_and_wait, sleep_until
from .offload import OffloadTier
from .request import FINISHED, RUNNING, WAITING, SimRequest
from .sched import Scheduler
from .specdec import Acceptance
from .timing import Batch, StepTiming
from .vllm_metrics import EngineStats

# A step that ends up to this late keeps the absolute schedule (the next one is shortened), so
# loop-timer and OS-scheduler jitter does not accumulate into a slower token rate; beyond it the
# schedule slips and the slip is counted in agentx_sim_late_seconds.
_SLACK_S = 0.005


class SimEngine(Scheduler):
    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int, max_batched_tokens: int,
                 timing: StepTiming, stats: EngineStats, time_scale: float = 1.0,
                 acceptance: Acceptance | None = None, offload: OffloadTier | None = None,
                 prefill_cap: int = 0, full_isl: bool = True) -> None:
        super().__init__(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_batched_tokens=max_batched_tokens, timing=timing, stats=stats,
                         time_scale=time_scale, k=acceptance.k if acceptance is not None else 0, offload=offload,
                         prefill_cap=prefill_cap, full_isl=full_isl)
        self.acceptance = acceptance  # the draft acceptance with speculative decoding, else None
        self.wake = asyncio.Event()  # set when there is new work (or an abort) to look at
        self._task: asyncio.Task | None = None
        self.steps = 0
        self._stored_seen = 0
        self.virtual_ns = 0

    # ---------------------------------------------------------------- public
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.bs

    def submit(self, req: SimRequest) -> None:
        req.state = WAITING
        req.queued_ns = self.now_ns()  # vLLM's queue time counts from here, not from HTTP arrival
        self.waiting.append(req)
        self._count_waiting()
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        """Client went away: the next step drops it and frees its blocks."""
        if req.state != FINISHED:
            req.aborted = True
            self.wake.set()

    def reset_prefix_cache(self) -> None:
        """POST /reset_prefix_cache: forget every cached block, on the GPU and in the tier."""
        self.pool.reset()
        if self.offload is not None:
            self.offload.reset()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop stepping; requests still in flight finish with `abort` so their handlers return."""
        for req in [*self.running, *self.waiting, *self.holding, *self.loading]:
            if req.finish is None:
                req.finish = "abort"
                req.push(0, "abort")
        await cancel_and_wait(self._task)
        self._task = None

    # ------------------------------------------------------------ step loop
    async def _run(self) -> None:
        start = time.perf_counter()
        while True:
            if not self.has_requests:
                self._decode_s = 0.0  # idle: no step in flight to hide the next one's preparation
                self.wake.clear()
                await self.wake.wait()
                start = time.perf_counter()
            now = start
            if self.loading:
                self._finish_loads(now)
            batch = self._schedule(now)
            st = self.stats
            st.kv_usage = self.pool.usage()
            if batch.empty:
                # only transfers in flight (or nothing admissible): wait for the earliest
                self._step_ended(now)
                self.wake.clear()
                delay = min(self._transfer_ends(), default=now + 0.001) - now
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=max(delay, 0.0))
                except asyncio.TimeoutError:
                    pass
                start = time.perf_counter()
                continue
            dt = self._step_seconds(batch, start)
            end = start + dt
            await sleep_until(end)
            # lateness is measured at the wake-up: the bookkeeping of this step (_apply) runs
            # inside the next step's interval, as a real engine's CPU work overlaps the GPU's
            t = time.perf_counter()
            self._step_ended(end)
            self._apply(batch)
            self.steps += 1
            late = t - end
            self.stats.on_sim_step(dt, late if late >= _SLACK_S else 0.0)
            start = end if late < _SLACK_S else t

    # ------------------------------------------------------------ offline (virtual clock)
    def use_virtual_clock(self) -> None:
        """Request timestamps from a clock only step_offline() advances (starts at 0)."""
        self.now_ns = lambda: self.virtual_ns

    def step_offline(self) -> bool:
        """One step on the virtual clock: priced, applied, no sleeping (modelled time, not
        divided by time_scale). With nothing computable yet it jumps to the end of the earliest
        host->GPU load. False when there is no work at all."""
        now = self.virtual_ns / 1e9
        batch = self._schedule(now)
        if batch.empty:
            self._step_ended(now, 1.0)
            if self.offload is not None and self.offload.completed:
                return True  # the next schedule frees their blocks
            if batch.preempted or self._freed_finished:
                return True  # blocks were freed after it (preempted, finished): the next admits
            ends = self._transfer_ends()
            if not ends:
                return False
            # a load already seen finished waits only for the next schedule (the engine idles)
            self.virtual_ns = max(self.virtual_ns, int(min(ends) * 1e9)) + 1
            self._finish_loads(self.virtual_ns / 1e9)
            self._step_ended(self.virtual_ns / 1e9, 1.0)
            return True
        self.virtual_ns += int(self._step_seconds(batch, now, 1.0) * 1e9)
        self._step_ended(self.virtual_ns / 1e9, 1.0)
        self._apply(batch)
        self.steps += 1
        if self.loading:
            self._finish_loads(self.virtual_ns / 1e9)
        return True

    # ------------------------------------------------------------ step results
    def emit_tokens(self, req: SimRequest, gen: int, now_ns: int) -> tuple[int, str | None]:
        """Count `gen` new tokens of `req` at now_ns, capped at max_tokens ("length") or its
        drawn EOS position ("stop", only without ignore_eos); the count really emitted, and
        the finish reason if this ends the request."""
        left = req.max_tokens - req.num_out
        finish = None
        if gen >= left:
            gen, finish = left, "length"
        if req.eos_at is not None and req.num_out + gen >= req.eos_at:
            gen, finish = req.eos_at - req.num_out, "stop"
        req.num_out += gen
        if not req.first_token_ns:
            req.first_token_ns = now_ns
            self.stats.on_first_token(req)
        self.stats.on_tokens(req, gen, now_ns)
        req.last_token_ns = now_ns
        return gen, finish

    def _apply(self, batch: Batch) -> None:
        now_ns = self.now_ns()
        pool, bs, offload = self.pool, self.bs, self.offload
        acceptance = self.acceptance
        stats = self.stats
        finished = []
        generated = 0
        for req, _start_tok, n, decode in batch.items:
            if req.state != RUNNING:
                continue
            if decode:
                acc = acceptance.draw() if acceptance is not None else 0
                if acceptance is not None:
                    stats.on_drafts(self.k, acc)
                req.num_computed += 1 + acc
                if req.num_computed // bs > len(req.block_hashes):
                    self._uncached.append(req)  # cached when the output is processed
                gen = 1 + acc
            else:
                before = req.num_computed
                req.num_computed = before + n
                hashes = req.block_hashes
                lo, hi = before // bs, min(req.num_computed // bs, len(hashes))
                blocks = req.blocks
                for b in range(lo, hi):
                    if pool.commit(blocks[b], hashes[b]) and req.preemptions == 0:
                        req.created_cache += bs
                if offload is not None and offload.eager:
                    offload.store_many(hashes[lo:hi])
                self._cache_output(req)  # a recompute that reached its output
                if req.num_computed < req.target_len:
                    continue  # chunked prefill continues next step
                gen = 1
            gen, finish = self.emit_tokens(req, gen, now_ns)
            generated += gen
            if finish is not None:
                req.finish = finish
                finished.append(req)
            req.push(gen, finish)
        stats.on_step(generated, batch.flops, batch.read_bytes, batch.write_bytes)
        if offload is not None and offload.stored_blocks != self._stored_seen:
            n = offload.stored_blocks - self._stored_seen
            self._stored_seen = offload.stored_blocks
            tokens = n * bs
            stats.on_store(n, tokens * self.timing.kv_tok * self.timing.tp, self.timing.store_seconds(tokens))
            stats.offload_used_blocks = len(offload.blocks)
        if finished:
            keep = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in keep]
            # with requests left to schedule, the next schedule comes before this step's output
            # is processed (asynchronous scheduling: `step_with_batch_queue`), so the finished
            # requests' blocks return to the pool only after it; with none, the engine core
            # processes the output at once
            later = self.has_requests
            for req in finished:
                self._cache_output(req)  # before its blocks go back
                if later and req.blocks:
                    self._finished.append(req.blocks)
                    req.blocks = []
                self._retire(req, None)
                stats.on_finish(req)
        stats.num_running = len(self.running)
        stats.kv_usage = pool.usage()
