"""The scheduling half of the simulated engine: which requests run in the next step, with what
KV blocks, in vLLM v1's order (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, vLLM 0.32);
sim/engine.py runs the steps.

- Running requests first (decode, or the next chunk of a chunked prefill) under the step's
  token budget; when the pool has no free block the newest running request is preempted
  (recompute: its blocks are freed, it goes back to the front of the waiting queue).
- With a KV connector the blocks of a preempted request that ran in the step in flight return
  to the pool only once that step has run (vLLM 0.24/0.32 `Scheduler.defer_block_free`: a
  consumer connector, `kv_both` included, with asynchronous scheduling; `_free_request_blocks`
  queues them in `deferred_frees`, drained when that step's output is processed, after the next
  schedule). A request the step in flight did not run (its token budget ran out before it) is
  freed at once (`last_sched_seq <= processed_step_seq`). Otherwise preempting frees no block
  for the rest of the schedule, so one request that cannot grow preempts every running request
  behind it, itself included: the bursts of 6-13 preemptions in one step measured on the
  H200 (tests/data/h200-runs-6), where the same pool without a connector preempted none.
- A finished request's blocks return to the pool after the next schedule: with asynchronous
  scheduling (vLLM 0.24 `EngineCore.step_with_batch_queue`, a batch queue of 2) batch k+1 is
  scheduled before batch k's output is processed, and `update_from_output` frees the requests
  that finished in batch k (`_free_request`), after the deferred frees of preemptions and before
  the connector's completed stores. With nothing left to schedule the output is processed at
  once. The same processing caches the blocks a decode step filled (`_cache_output`), except a
  request that schedule preempted, and gives back the tier blocks of the loads that step's
  output completes before its completed stores (`update_connector_output`: loads first).
- With vLLM's SimpleCPUOffload as it runs (`offload_store_walk`) loads are paced by the steps
  (vLLM 0.24 `SimpleCPUOffloadWorker`: launched in `get_finished` after the forward of the step
  that scheduled them, on their own stream at the measured copy rate, `offload_load_copy_gbps`,
  once the host has launched them: all of the step's loads in one call, `load_ms_per_kblock`;
  finished when a later step's `get_finished` polls its event; that step's output is processed
  after the next schedule): a load admitted in schedule k is schedulable at schedule k + 3 at the
  earliest, later when the copy outlasts a step. Measured on the H200 (h200-runs-6): 3 steps
  from the load's schedule to its completion in the most common case (49 and 43 of the 99 and 79
  loads of two runs), with latencies set by the steps (~0.2-0.3 s), not by the 36 GB/s copies.
  When the engine idles (the last schedule was empty: no step in flight) a finished load is
  taken at once. Otherwise a load finishes at its effective rate (`offload_load_gbps`).
- Waiting requests only if nothing was preempted, while fewer than `max_num_seqs` run; requests
  loading from the offload tier do not count (`schedule` checks `len(self.running)` only).
- Requests whose host->GPU load finished hold blocks: they wait in their own queue, drained
  before new requests (`kv_holding_waiting`); the first one that cannot be allocated stops
  admission, so newer requests never take the blocks it needs.
- Admission needs blocks for the request's whole sequence free, not just the first chunk
  (`scheduler_reserve_full_isl`, default True: vllm/config/scheduler.py; `allocate_slots(...,
  full_sequence_must_fit=True)` in vllm/v1/core/kv_cache_manager.py). `full_isl=False` is the
  older rule (blocks for the hits plus this step's chunk; the rest grows step by step and
  preempts when the pool runs out).
- A prefill chunk is the rest of the prompt within the step budget, capped per request by
  `long_prefill_token_threshold` when set (vLLM v1 caps running and waiting requests alike;
  `max_num_partial_prefills` > 1 sets an unset threshold to 4% of max_model_len and is not
  otherwise consumed by the v1 scheduler). With the default (no cap) a long cold prefill takes
  every step's whole budget while it runs, and requests behind it wait.
- A request with host hits is admitted as an asynchronous load only if its loaded blocks fit in
  the free pool minus what in-flight prefills (loading, loaded, or part-way through their prompt)
  still need to finish, plus one speculative step's blocks (`_inflight_prefill_reserved_blocks`,
  `reserved_blocks=`): a loading request holds blocks without progress and cannot be preempted,
  and without the reservation loaded requests could hold the pool between them with none able to
  finish (the simulator did stop serving for good that way).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from .kvcache import BlockPool
from .offload import OffloadTier
from .request import FINISHED, LOADING, RUNNING, WAITING, SimRequest
from .timing import Batch, StepTiming
from .vllm_metrics import EngineStats


class Scheduler:
    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int, max_batched_tokens: int,
                 timing: StepTiming, stats: EngineStats, time_scale: float, k: int,
                 offload: OffloadTier | None, prefill_cap: int = 0, full_isl: bool = True) -> None:
        self.offload = offload
        self.prefill_cap = prefill_cap  # long_prefill_token_threshold as resolved (0 = none)
        self.full_isl = full_isl  # scheduler_reserve_full_isl
        self.pool = BlockPool(num_blocks, block_size,
                              on_evict=offload.on_gpu_evict if offload is not None else None)
        self.bs = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batched = max_batched_tokens
        self.timing = timing
        self.stats = stats
        self.scale = time_scale
        self.k = k
        self.waiting: deque[SimRequest] = deque()  # holding no blocks
        self.holding: deque[SimRequest] = deque()  # waiting with blocks: their load finished
        self.running: list[SimRequest] = []
        self.loading: list[SimRequest] = []
        # blocks of requests preempted in this schedule, freed after it (`defer_block_free`)
        self.defer_free = offload is not None
        # loads paced by the steps (vLLM's SimpleCPUOffload worker), with its lazy store walk
        self.paced_loads = offload is not None and offload.walk_target > 0
        self.seq = 0  # schedules so far
        self._idle = True  # the last schedule was empty: no step in flight
        self._decode_s = 0.0  # the last step's modelled time if it was decode-only, else 0
        self._deferred: list[list[int]] = []
        # blocks of requests that finished in the step in flight, freed once its output is
        # processed, after the next schedule (asynchronous scheduling; `_free_request` in
        # `update_from_output`)
        self._finished: list[list[int]] = []
        self._freed_finished = False  # the last schedule was followed by such frees
        self._link_free = 0.0
        self._out_serial = 0  # the last hash given to an output block (`_cache_output`)
        self._uncached: list[SimRequest] = []  # decoded into a new full block in the step in flight
        # where request timestamps come from: the wall clock when serving, a virtual clock offline
        self.now_ns = time.perf_counter_ns
        # called with each request before its prefix lookup; sim_calibration's replay sets it to
        # give a real run's requests their recorded hits (`replay(..., recorded_hits=True)`)
        self.before_lookup: Callable[[SimRequest], None] | None = None

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
            n = 1 + k if decode else self._chunk(need, budget)
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
                req.ran_seq = self.seq
                i += 1
                continue
            break  # the request itself was preempted
        if not preempted:
            self._admit(batch, budget, now)
        walker = self.offload if self.offload is not None and self.offload.walk_target else None
        if walker is not None:
            walker.walk(self.pool)  # build_connector_meta, at the end of the schedule
            batch.store_blocks = walker.walking
        # the step in flight has run; its output is processed (async scheduling), in the order
        # of vLLM's `update_from_output`: `_drain_deferred_frees`, then each finished request's
        # blocks, then the connector's completed stores
        for blocks in self._deferred:
            self.pool.release(blocks)
        self._deferred.clear()
        for req in self._uncached:  # not a request this schedule preempted (vLLM skips those)
            if req.state == RUNNING:
                self._cache_output(req)
        self._uncached.clear()
        self._freed_finished = bool(self._finished)
        for blocks in self._finished:
            self.pool.release(blocks)
        self._finished.clear()
        if walker is not None:
            # the loads this output completes (once this schedule is counted) give their tier
            # blocks back before its stores complete: vLLM 0.24/0.32
            # `SimpleCPUOffloadScheduler.update_connector_output` takes the load completions
            # first, then the store completions
            for req in self.loading:
                if req.tier_pin and self._load_reported(req, self.seq + 1):
                    walker.unpin(req.tier_pin)
                    req.tier_pin = []
            walker.release_completed(self.pool)
        batch.preempted = preempted
        self.seq += 1
        self._idle = batch.empty
        if batch.empty:
            self._decode_s = 0.0
        self._count_waiting()
        self.stats.num_running = len(running)
        return batch

    @property
    def has_requests(self) -> bool:
        """Requests left to schedule: running, waiting, holding loaded blocks or loading (vLLM
        `Scheduler.has_requests`)."""
        return bool(self.running or self.waiting or self.holding or self.loading)

    def _admit(self, batch: Batch, budget: int, now: float) -> None:
        running = self.running
        launched: list[SimRequest] = []  # loads this schedule starts: one launch on the host
        while budget > 0 and len(running) < self.max_num_seqs:
            queue = self.holding or self.waiting
            if not queue:
                break
            req = queue[0]
            if req.aborted:
                queue.popleft()
                self._retire(req, None)
                continue
            if queue is self.waiting:
                if not self._lookup(req, now, budget):
                    break
                if req.state == LOADING:
                    queue.popleft()
                    self.loading.append(req)
                    batch.load_blocks += len(req.tier_pin)
                    launched.append(req)
                    continue
            elif self._short(req, budget) > self.pool.num_free:
                break  # it keeps its blocks and its place; running requests will free some
            n = self._chunk(req.target_len - req.num_computed, budget)
            if not self._grow(req, req.num_computed + n):  # checked by _lookup: cannot happen
                break
            queue.popleft()
            if not req.scheduled_ns:
                req.scheduled_ns = self.now_ns()
                self.stats.on_scheduled(req)
            req.state = RUNNING
            running.append(req)
            budget -= n
            batch.add_prefill(req, req.num_computed, n)
            req.ran_seq = self.seq
            batch.admitted_tokens += n
        if launched and self.paced_loads:
            # the worker launches the step's loads on the host before their copies can start
            delay = self.timing.launch_load_s * batch.load_blocks / self.scale
            for req in launched:
                req.load_until += delay
            self._link_free = max(self._link_free, max(r.load_until for r in launched))

    def _count_waiting(self) -> None:
        """vllm:num_requests_waiting counts the waiting queue, the requests holding KV blocks
        and those still loading; the loading ones are `deferred` in
        vllm:num_requests_waiting_by_reason, the rest `capacity` (vLLM 0.32
        `Scheduler.get_request_counts` and `make_stats`, vllm/v1/core/sched/scheduler.py).
        With a tier, vllm:num_requests_kv_fetch_by_stage: `waiting_to_start` = waiting requests
        whose last lookup found tier hits but could not be admitted (they keep the pin),
        `in_progress` = loading, `completed_waiting` = loaded, not running yet
        (`_set_kv_fetch_stage`)."""
        st = self.stats
        st.num_waiting = len(self.waiting) + len(self.holding) + len(self.loading)
        st.num_deferred = len(self.loading)
        if self.offload is not None:
            fetch = st.kv_fetch
            fetch["waiting_to_start"] = sum(1 for r in self.waiting if r.tier_pin)
            fetch["in_progress"] = len(self.loading)
            fetch["completed_waiting"] = len(self.holding)

    def _chunk(self, need: int, budget: int) -> int:
        """Prompt tokens a prefilling request computes this step: what is left, within the step
        budget and the per-request cap (vLLM: `0 < long_prefill_token_threshold < num_new_tokens`
        caps it, for running and waiting requests alike)."""
        cap = self.prefill_cap
        return min(need, budget, cap) if cap else min(need, budget)

    def _short(self, req: SimRequest, budget: int) -> int:
        """Blocks `req` must get before it can run this step: its whole sequence with
        `full_isl`, else only this step's chunk."""
        if self.full_isl:
            return self._missing(req)
        upto = req.num_computed + self._chunk(req.target_len - req.num_computed, budget)
        return max(0, -(-upto // self.bs) - len(req.blocks))

    def _missing(self, req: SimRequest, extra: int = 0) -> int:
        """Blocks `req` lacks to hold its whole sequence so far (+ `extra` tokens)."""
        return max(0, -(-(req.target_len + extra) // self.bs) - len(req.blocks))

    def _reserved(self) -> int:
        """Blocks the in-flight prefills still need to finish, plus one speculative step's
        (vLLM's `_inflight_prefill_reserved_blocks()` + `_spec_decode_step_blocks`)."""
        extra = 1 + self.k if self.k else 0
        prefilling = (r for r in self.running if r.num_out == 0 or r.target_len - r.num_computed > 1)
        need = sum(self._missing(r, extra) for q in (self.loading, self.holding, prefilling) for r in q)
        return need + (-(-self.k // self.bs))

    def _lookup(self, req: SimRequest, now: float, budget: int) -> bool:
        """Prefix-cache lookup on admission: take the GPU hits; for host hits start a load.

        False (nothing taken but the tier pin, which vLLM keeps until the request's next lookup)
        when the whole sequence (with `full_isl`; else the hits plus this step's chunk), or a
        load's blocks past the reservation, do not fit now."""
        if self.before_lookup is not None:
            self.before_lookup(req)
        pool, bs, offload = self.pool, self.bs, self.offload
        hashes = req.block_hashes
        limit = (req.target_len - 1) // bs
        dev = pool.match(hashes, limit)
        host = 0
        if offload is not None:
            offload.unpin(req.tier_pin)  # a pin left by a lookup that could not be admitted
            host = offload.match(hashes[dev:], limit - dev, start=dev)
            req.tier_pin = hashes[dev:dev + host]
            offload.pin(req.tier_pin)
        # vLLM checks the fit before it takes the hits (`allocate_slots`: a hit block still in the
        # free queue counts as one to allocate; `allocate_new_computed_blocks` touches them only
        # once the request fits), so a request that cannot be admitted leaves its GPU hits where
        # they are in the free queue, to be evicted or walked like any other free block
        hits = [pool.cached[h] for h in hashes[:dev]]
        free = pool.num_free - sum(1 for b in hits if pool.ref[b] == 0)
        if self.full_isl:
            short = max(0, -(-req.target_len // bs) - dev)
        else:  # older vLLM: blocks for what this step computes (hits + loads + first chunk)
            upto = (dev + host) * bs + self._chunk(req.target_len - (dev + host) * bs, budget)
            short = max(0, -(-upto // bs) - dev)
        if short > free or (host and host > free - self._reserved()):
            return False
        # reference the hits before allocating, which could otherwise evict them
        req.blocks = pool.hold(hits) + pool.allocate(host)
        req.num_computed = dev * bs
        if not req.counted:  # recorded at admission, as vLLM does
            req.counted = True
            req.cached_device = dev * bs
            req.cached_host = host * bs
            self.stats.on_prefix_lookup(req.prompt_len, dev * bs, host * bs, offload is not None,
                                        len(hashes) - dev)
        if not req.num_out:
            req.hit_last_admission, req.hit_last_tier = (dev + host) * bs, host * bs
        if not host:
            return True
        offload.load(req.tier_pin)
        req.state = LOADING
        if self.paced_loads:
            secs = self.timing.copy_seconds(host * bs)
            req.load_seq, req.load_seen = self.seq, -1
        else:
            secs = self.timing.load_seconds(host * bs)
        req.load_until = max(now, self._link_free) + secs / self.scale
        self._link_free = req.load_until  # one host->GPU copy stream: loads queue behind each other
        self.stats.on_host_load(host * bs, host * bs * self.timing.kv_tok * self.timing.tp, secs, host)
        return True

    def _step_seconds(self, batch: Batch, start: float, scale: float | None = None) -> float:
        """The step's modelled duration on the engine clock (divided by `scale`, by default
        `time_scale`), a preemption's wait for the lazy stores in flight included
        (`OffloadTier.flush_wait`). The batch learns the previous step's time if that was
        decode-only (`Batch.after_decode_s`: what an admission's host preparation hides behind)."""
        batch.after_decode_s = self._decode_s
        model = self.timing.step_seconds(batch)
        self._decode_s = model if batch.num_decode == batch.num_seqs else 0.0
        dt = model / (scale or self.scale)
        if batch.preempted and self.offload is not None and self.offload.walk_target:
            dt += self.offload.flush_wait(start)
        return dt

    def _step_ended(self, end: float, scale: float | None = None) -> None:
        """Launch this step's lazy store and collect the copies done by `end`."""
        if self.offload is not None and self.offload.walk_target:
            self.offload.launch(end, scale or self.scale)

    def _transfer_ends(self) -> list[float]:
        """When the host->GPU loads and the lazy stores in flight finish (engine clock)."""
        ends = [r.load_until for r in self.loading]
        if self.offload is not None and self.offload.inflight:
            ends.append(self.offload.inflight[0].done)
        return ends

    def _finish_loads(self, now: float) -> None:
        still = []
        for req in self.loading:
            if req.aborted:
                self._retire(req, None)
            elif self._loaded(req, now):
                dev = req.num_computed // self.bs
                n_loaded = len(req.blocks) - dev
                for i in range(dev, dev + n_loaded):
                    self.pool.commit(req.blocks[i], req.block_hashes[i])
                req.num_computed += n_loaded * self.bs
                self.offload.unpin(req.tier_pin)
                req.tier_pin = []
                req.state = WAITING
                self.holding.append(req)
            else:
                still.append(req)
        self.loading = still

    def _loaded(self, req: SimRequest, now: float) -> bool:
        """Whether `req`'s load is over for the scheduler before the next schedule: its copy
        done by `now`, or, paced by the steps, seen by the poll of a step after the one that
        launched it and that step's output processed (two schedules later), or at once when
        the engine idles."""
        if not self.paced_loads:
            return req.load_until <= now
        if req.load_seen < 0:
            if req.load_until > now or self.seq <= req.load_seq:
                return False
            req.load_seen = self.seq
        return self._idle or self._load_reported(req, self.seq)

    @staticmethod
    def _load_reported(req: SimRequest, seq: int) -> bool:
        """Whether a paced load a step's poll saw finished has reached the scheduler by the time
        `seq` schedules have run: that step's output is processed after the next schedule."""
        return req.load_seen >= 0 and seq >= req.load_seen + 2

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        need = -(-tokens // self.bs) - len(req.blocks)
        if need <= 0:
            return True
        new = self.pool.allocate(need)
        if new is None:
            return False
        req.blocks += new
        return True

    def _cache_output(self, req: SimRequest) -> None:
        """Cache the blocks past the prompt's full blocks that steps filled with computed tokens
        (the prompt's tail and the output). vLLM caches every full block of a request's sequence:
        the asynchronous scheduler when it processes a step's output, after the next schedule
        (vLLM 0.24/0.32 `AsyncScheduler._update_request_with_output` -> `cache_blocks` up to the
        computed tokens, for a request that finishes in that step as well, but not for one that
        schedule preempted), and `allocate_slots` for a recompute after a preemption. No prompt
        repeats that content, so each gets a hash of its own (a negative serial, apart from the
        prompts' hashes), kept in the request's `block_hashes` for its recompute to find.
        Cached, they go to the free queue's back when the request finishes (uncached blocks go
        to its front), and the lazy walk stores them. A no-op when there is nothing new."""
        full = min(req.num_computed // self.bs, len(req.blocks))
        hashes = req.block_hashes
        if full <= len(hashes):
            return
        if not req.own_hashes:  # the caller's list (a replay shares its keys): copy before growing
            req.block_hashes = hashes = list(hashes)
            req.own_hashes = True
        for j in range(len(hashes), full):
            self._out_serial -= 1
            hashes.append(self._out_serial)
            self.pool.commit(req.blocks[j], self._out_serial)

    def _preempt(self, req: SimRequest) -> None:
        if self.defer_free and req.ran_seq == self.seq - 1:  # the step in flight ran it
            self._deferred.append(req.blocks)
        else:
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
        if req.tier_pin:
            self.offload.unpin(req.tier_pin)
            req.tier_pin = []
        req.state = FINISHED
        if finish is not None and req.finish is None:
            req.finish = finish
            req.push(0, finish)
