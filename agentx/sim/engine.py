"""The simulated vLLM engine: a continuous-batching step loop over a paged, prefix-cached KV pool.

One asyncio task runs steps back to back, as vLLM's EngineCore does:
  1. schedule (vLLM v1 order): running requests first (decode, or the next chunk of a chunked
     prefill), under a per-step token budget; when the KV pool has no free block, preempt the
     newest running request (recompute policy: its KV is dropped, it re-queues at the front);
     then, only if nothing was preempted, admit waiting requests FCFS while `max_num_seqs` and
     the budget allow, after a prefix-cache lookup (GPU first, then the offload tier);
  2. price the step with the roofline (`timing.StepTiming`) and sleep until it ends
     (durations divided by `time_scale`);
  3. apply it: commit filled blocks to the prefix cache, sample 1 (+accepted drafts) tokens
     per decoding request, push them to the request's HTTP handler, retire finished ones.
All times are wall-clock (perf_counter) of this process; modelled durations are scaled.
Offline (sim/calibrate) the same steps run on a virtual clock instead: `use_virtual_clock()`,
then `step_offline()` per step, no sleeping. The fidelity mode (fixed TTFT/ITL, no batching
model) lives in sim/fixed.py; sim/build.py assembles an engine from a SimConfig.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

from ..aio import cancel_and_wait, sleep_until
from .kvcache import BlockPool
from .offload import OffloadTier
from .request import FINISHED, LOADING, RUNNING, WAITING, SimRequest
from .specdec import Acceptance
from .stats import EngineStats
from .timing import Batch, StepTiming

# A step that ends up to this late keeps the absolute schedule (the next one is shortened), so
# loop-timer and OS-scheduler jitter does not accumulate into a slower token rate; beyond it the
# schedule slips and the slip is counted in agentx_sim_late_seconds.
_SLACK_S = 0.005


class Engine:
    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int, max_batched_tokens: int,
                 timing: StepTiming, stats: EngineStats, time_scale: float = 1.0,
                 spec: Acceptance | None = None, offload: OffloadTier | None = None,
                 fixed_ttft_s: float | None = None, fixed_itl_s: float | None = None) -> None:
        self.offload = offload
        self.pool = BlockPool(num_blocks, block_size,
                              on_evict=offload.on_gpu_evict if offload is not None else None)
        self.bs = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batched = max_batched_tokens
        self.timing = timing
        self.stats = stats
        self.scale = time_scale
        self.spec = spec
        self.k = spec.k if spec is not None else 0
        self.fixed_ttft = fixed_ttft_s
        self.fixed_itl = fixed_itl_s
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.loading: list[SimRequest] = []
        self.wake = asyncio.Event()  # set when there is new work (or an abort) to look at
        self._task: asyncio.Task | None = None
        self.steps = 0
        self._stored_seen = 0
        self._link_free = 0.0
        # where request timestamps come from: the wall clock when serving, a virtual clock offline
        self.now_ns = time.perf_counter_ns
        self.virtual_ns = 0

    # ---------------------------------------------------------------- public
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.bs

    def submit(self, req: SimRequest) -> None:
        req.state = WAITING
        self.waiting.append(req)
        self.stats.num_waiting = len(self.waiting)
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
            self.offload.blocks.clear()

    def start(self) -> None:
        from .fixed import run_fixed

        loop = asyncio.get_running_loop()
        self._task = loop.create_task(run_fixed(self) if self.fixed_ttft is not None
                                      else self._run())

    async def stop(self) -> None:
        """Stop stepping; requests still in flight finish with `abort` so their handlers return."""
        for req in [*self.running, *self.waiting, *self.loading]:
            if req.finish is None:
                req.finish = "abort"
                req.push(0, "abort")
        await cancel_and_wait(self._task)
        self._task = None

    # ------------------------------------------------------------ step loop
    async def _run(self) -> None:
        start = time.perf_counter()
        while True:
            if not (self.running or self.waiting or self.loading):
                self.wake.clear()
                await self.wake.wait()
                start = time.perf_counter()
            now = start
            if self.loading:
                self._finish_loads(now)
            batch = self._schedule(now)
            st = self.stats
            st.kv_usage, st.num_running, st.num_waiting = self.pool.usage(), len(self.running), len(self.waiting)
            if batch.empty:
                # only loads in flight (or nothing admissible): wait for the earliest load
                self.wake.clear()
                delay = min((r.load_until for r in self.loading), default=now + 0.001) - now
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=max(delay, 0.0))
                except asyncio.TimeoutError:
                    pass
                start = time.perf_counter()
                continue
            dt = self.timing.step_seconds(batch) / self.scale
            end = start + dt
            await sleep_until(end)
            # lateness is measured at the wake-up: the bookkeeping of this step (_apply) runs
            # inside the next step's interval, as a real engine's CPU work overlaps the GPU's
            t = time.perf_counter()
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
            if not self.loading:
                return False
            self.virtual_ns = int(min(q.load_until for q in self.loading) * 1e9) + 1
            self._finish_loads(self.virtual_ns / 1e9)
            return True
        self.virtual_ns += int(self.timing.step_seconds(batch) * 1e9)
        self._apply(batch)
        self.steps += 1
        if self.loading:
            self._finish_loads(self.virtual_ns / 1e9)
        return True

    # ------------------------------------------------------------ scheduling
    def _schedule(self, now: float) -> Batch:
        budget = self.max_batched
        batch = self.timing.new_batch()
        k = self.k
        preempted = False
        running = self.running
        i = 0
        while i < len(running):
            req = running[i]
            if req.aborted:
                self._retire(req, None)
                running.pop(i)
                continue
            if budget <= 0:
                break
            need = req.target_len - req.num_computed
            decode = need == 1 and req.num_out > 0
            n = 1 + k if decode else min(need, budget)
            # KV slots needed once this step has run (drafts included)
            while not self._grow(req, req.num_computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                budget -= n
                if decode:
                    batch.add_decode(req, req.num_computed, n)
                else:
                    batch.add_prefill(req, req.num_computed, n)
                i += 1
                continue
            break  # the request itself was preempted
        if preempted:
            return batch
        waiting = self.waiting
        while waiting and budget > 0 and len(running) + len(self.loading) < self.max_num_seqs:
            req = waiting[0]
            if req.aborted:
                waiting.popleft()
                self._retire(req, None)
                continue
            if not req.blocks and not self._lookup(req, now):
                break
            if req.state == LOADING:
                waiting.popleft()
                self.loading.append(req)
                continue
            n = min(req.target_len - req.num_computed, budget)
            if not self._grow(req, req.num_computed + n):
                self.pool.release(req.blocks)  # do not sit on blocks while waiting
                req.blocks = []
                req.num_computed = 0
                break
            waiting.popleft()
            if not req.scheduled_ns:
                req.scheduled_ns = self.now_ns()
                self.stats.on_scheduled(req)
            req.state = RUNNING
            running.append(req)
            budget -= n
            batch.add_prefill(req, req.num_computed, n)
        self.stats.num_waiting = len(waiting)
        self.stats.num_running = len(running)
        return batch

    def _lookup(self, req: SimRequest, now: float) -> bool:
        """Prefix-cache lookup on admission: take GPU hits, start a host load for CPU hits.

        Returns False when the pool cannot even hold the host-hit blocks right now."""
        pool, bs = self.pool, self.bs
        hashes = req.block_hashes
        limit = (req.target_len - 1) // bs
        dev = pool.match(hashes, limit)
        host = 0
        if self.offload is not None:
            host = self.offload.match(hashes[dev:], limit - dev)
        blocks = pool.touch(hashes[:dev])  # reference hits before allocating can evict them
        new = pool.allocate(host) if host else []
        if new is None:
            pool.release(blocks)
            return False
        req.blocks = blocks + new
        req.num_computed = dev * bs
        if not req.counted:
            req.counted = True
            req.cached_device = dev * bs
            req.cached_host = host * bs
            self.stats.on_prefix_lookup(req.prompt_len, dev * bs, host * bs, self.offload is not None,
                                        len(hashes) - dev)
        if host:
            self.offload.load(hashes[dev:dev + host])
            req.state = LOADING
            secs = self.timing.load_seconds(host * bs)
            req.load_until = max(now, self._link_free) + secs / self.scale
            self._link_free = req.load_until  # one host->GPU copy stream: loads queue behind each other
            self.stats.on_host_load(host * bs, host * bs * self.timing.kv_tok * self.timing.tp, secs, host)
        return True

    def _finish_loads(self, now: float) -> None:
        still = []
        for req in self.loading:
            if req.aborted:
                self._retire(req, None)
            elif req.load_until <= now:
                dev = req.num_computed // self.bs
                n_loaded = len(req.blocks) - dev
                for i in range(dev, dev + n_loaded):
                    self.pool.commit(req.blocks[i], req.block_hashes[i])
                req.num_computed += n_loaded * self.bs
                req.state = WAITING
                self.waiting.appendleft(req)
            else:
                still.append(req)
        self.loading = still

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        need = -(-tokens // self.bs) - len(req.blocks)
        if need <= 0:
            return True
        new = self.pool.allocate(need)
        if new is None:
            return False
        req.blocks += new
        return True

    def _preempt(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.preemptions += 1
        req.state = WAITING
        self.waiting.appendleft(req)
        self.stats.num_preemptions += 1

    def _retire(self, req: SimRequest, finish: str | None) -> None:
        if req.aborted and req.finish is None:
            self.stats.c_success["abort"].inc()
        if req.blocks:
            self.pool.release(req.blocks)
            req.blocks = []
        req.state = FINISHED
        if finish is not None and req.finish is None:
            req.finish = finish
            req.push(0, finish)

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
        self.stats.on_tokens(req, gen, now_ns)
        req.last_token_ns = now_ns
        return gen, finish

    def _apply(self, batch: Batch) -> None:
        now_ns = self.now_ns()
        pool, bs, offload = self.pool, self.bs, self.offload
        spec = self.spec
        stats = self.stats
        finished = []
        for req, _start_tok, n, decode in batch.items:
            if req.state != RUNNING:
                continue
            if decode:
                acc = spec.draw() if spec is not None else 0
                if spec is not None:
                    stats.on_drafts(self.k, acc)
                req.num_computed += 1 + acc
                gen = 1 + acc
            else:
                before = req.num_computed
                req.num_computed = before + n
                hashes = req.block_hashes
                lo, hi = before // bs, min(req.num_computed // bs, len(hashes))
                blocks = req.blocks
                for b in range(lo, hi):
                    if pool.commit(blocks[b], hashes[b]):
                        if req.preemptions == 0:
                            req.created_cache += bs
                        if offload is not None and offload.eager:
                            offload.store(hashes[b])
                if req.num_computed < req.target_len:
                    continue  # chunked prefill continues next step
                gen = 1
            gen, finish = self.emit_tokens(req, gen, now_ns)
            if finish is not None:
                req.finish = finish
                finished.append(req)
            req.push(gen, finish)
        stats.on_step(batch.num_tokens, batch.flops, batch.read_bytes, batch.write_bytes)
        if offload is not None and offload.stored_blocks != self._stored_seen:
            n = offload.stored_blocks - self._stored_seen
            self._stored_seen = offload.stored_blocks
            tokens = n * bs
            stats.on_store(n, tokens * self.timing.kv_tok * self.timing.tp, self.timing.load_seconds(tokens))
            stats.offload_used_blocks = len(offload.blocks)
        if finished:
            keep = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in keep]
            for req in finished:
                self._retire(req, None)
                stats.on_finish(req)
        stats.num_running = len(self.running)
        stats.kv_usage = pool.usage()
