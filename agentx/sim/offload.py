"""CPU (host DRAM) KV tier behind the GPU pool, as vLLM's offload connectors behave.

Blocks are tracked by their chained hash only: the tier holds no data, just which prefixes
could be loaded back instead of recomputed. It is an LRU of fixed capacity (in blocks).
- lazy store (SimpleCPUOffload `lazy_offload: true`): a block is copied to the CPU when the GPU
  pool evicts it, so the tier only holds what fell out of the GPU;
- eager store (Mooncake store, LMCache, SimpleCPUOffload default): every newly computed full
  block is copied right away, so the tier mirrors recent GPU content too;
- chunked hits (LMCache, `chunk_tokens` = LMCACHE_CHUNK_SIZE, 256 by default): a lookup counts
  the prompt's leading tokens found in whole chunks, so a hit ends on a chunk boundary
  (agentx/offload/lmcache.py has the source). The tier still holds GPU blocks, so a chunk is
  present when all its blocks are.
Which connector does what is its store policy (agentx.offload, `Connector.store`).
The same order, over content keys, is the client's agentx.prefix_cache.TieredCache (what
validation expects; tests/test_sim_offload.py checks this tier against it, the lazy path one
eviction at a time as `PrefixCache.store_each`). Both follow SimpleCPUOffload's manager,
vllm/v1/simple_kv_offload/manager.py (vLLM 0.32; 0.24.0's lazy walk, lookup, pins and
completions are the same code before a refactor):
- lazy: each scheduler step `_prepare_lazy_store_specs` walks the GPU free queue from its head
  (or a cursor) over up to `_target_free` = 2 x ceil(max_num_batched_tokens / block_size) blocks
  (1,024 at 8,192 tokens and 16-token blocks) and copies those not in the tier yet; the copy is
  asynchronous, the GPU block is held meanwhile (still a GPU hit, not evictable), and the CPU
  block becomes a hit only when the store completes (`_process_store_completion`), which also
  puts the GPU block back at the free queue's end. Modelled by default as a store on eviction
  (free and instant; a block the allocator takes before the walk reaches it, in a pool kept
  full by waiting requests, is never stored by vLLM, but is by both models: docs/server-metrics.md);
  with `walk_target` (SimConfig.offload_store_walk) as vLLM 0.24.0 does it: `walk` touches the
  blocks, `launch` times their copy on one store stream, `release_completed` frees them to the
  queue's tail and makes them hits, and `flush_wait` is a preempting step's wait for the copies;
- the tier is a vLLM BlockPool of the GPU's block size (`_derive_cpu_config`), evicting least
  recently freed first;
- a block already in the tier is not stored again and keeps its place
  (`_classify_store_candidate` -> `_StoreAdmission.ALREADY_CACHED`; 0.24.0: the walk's
  `cached_block_hash_to_block.get_one_block(bhash) is None` test);
- a request's tier hits are pinned from its lookup until its load completes
  (`get_num_new_matched_tokens` touches them, `update_state_after_alloc` holds them for the
  copy, `_cleanup_load_request` frees them): no store, the request's own included, evicts them.
  With the walk they become the most recently used when the last pin goes (`free_blocks`
  appends them to the CPU pool's free queue when the load completes, in prompt order), after
  the stores that completed meanwhile; with the store on eviction, at the lookup, before the
  request's own GPU evictions are stored, as the client's TieredCache does.
- vLLM's tier can hold two copies of one content (two GPU copies, sim/kvcache.py, walked before
  either store completes); this one holds one (tests/test_vllm_lazy_tier.py stops there).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .kvcache import BlockPool


def lazy_target_blocks(max_num_batched_tokens: int, block_size: int) -> int:
    """GPU blocks one lazy walk covers per step: vLLM 0.24.0
    vllm/v1/simple_kv_offload/manager.py `_estimate_lazy_target_blocks` for one full-attention
    group, cdiv(max_num_batched_tokens, block_size) x (1 + WATERMARK_RATIO = 1.0)."""
    return 2 * -(-max_num_batched_tokens // block_size)


@dataclass
class _Store:
    """One step's store event (vLLM `TransferMeta` under `_store_event_to_blocks`)."""
    blocks: list[int]  # GPU blocks held (touched) until the copy completes
    hashes: list[int]
    done: float = 0.0  # when the copy finishes on the store stream
    abandoned: bool = False  # a reset came in flight: freed without becoming a hit


class OffloadTier:
    def __init__(self, capacity_blocks: int, block_size: int, eager: bool,
                 chunk_tokens: int | None = None, walk_target: int = 0,
                 store_seconds: Callable[[int], float] | None = None) -> None:
        self.capacity = max(0, capacity_blocks)
        self.block_size = block_size
        self.eager = eager
        self.chunk_tokens = chunk_tokens
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.pins: dict[int, int] = {}  # blocks a pending load reads -> loads: not evictable
        self.stored_blocks = 0  # cumulative GPU->CPU block copies
        self.loaded_blocks = 0  # cumulative CPU->GPU block copies
        self.evicted_blocks = 0
        self.gpu_evicted = 0  # hashed GPU blocks the allocator took (their content dropped)
        self.gpu_evicted_unstored = 0  # ... of which the tier held no copy: lost to both tiers
        self.walks = 0  # lazy walks that stored blocks (store events)
        self.walk_restarts = 0  # lazy walks started at the free queue's head (bench/stepprobe's walk_head)
        # hash -> the last thing done to its content, when a caller follows it (bench/tier_breaks.py;
        # bench/stepprobe's AGENTX_STEPLOG_FATES on a real server): None = not followed
        self.fates: dict[int, str] | None = None
        # lazy store as vLLM 0.24 does it (`walk_target` > 0, lazy only): see `walk`
        self.walk_target = walk_target if not eager else 0
        self.store_seconds = store_seconds  # GPU->CPU copy time of n tokens
        self.cursor: int | None = None
        self.reserved = 0  # CPU blocks taken by stores in flight (not hits yet)
        self._walked: _Store | None = None  # this step's store, launched when the step ends
        self.inflight: deque[_Store] = deque()  # launched, FIFO on one store stream
        self._polled: list[_Store] = []  # complete, seen by the next step's poll
        self._reported: list[_Store] = []  # in a step's output: freed after the next schedule
        self.stream_free = 0.0  # when the store stream finishes what it was given

    @property
    def completed(self) -> bool:
        """Stores complete that the next schedules free (a step to report them, if idle)."""
        return bool(self._reported or self._polled)

    @property
    def walking(self) -> int:
        """Blocks this schedule's walk stores (launched with its step)."""
        return len(self._walked.blocks) if self._walked else 0

    @property
    def held_blocks(self) -> int:
        """GPU blocks out of the free queue while their store is in flight."""
        held = sum(len(s.blocks) for s in (*self.inflight, *self._polled, *self._reported))
        return held + (len(self._walked.blocks) if self._walked else 0)

    def store(self, h: int) -> None:
        """Copy one block's KV to the tier (see store_many)."""
        self.store_many((h,))

    def store_many(self, hashes: Sequence[int]) -> None:
        """Copy blocks to the tier in one transfer, as the manager batches a step's stores:
        blocks already there are skipped and keep their place; then CPU blocks for the rest
        are taken from the LRU head (`get_new_blocks`), which may evict blocks of the same
        request that were skipped; pinned blocks are never taken, and what finds no CPU block
        is not stored."""
        blocks = self.blocks
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        if not new or self.capacity == 0:
            return
        self._make_room(len(new))
        new = new[:self.capacity - len(blocks) - self.reserved]
        for h in new:
            blocks[h] = None
        self.stored_blocks += len(new)
        if self.fates is not None:
            self.fates.update(dict.fromkeys(new, "stored"))

    def on_gpu_evict(self, h: int) -> None:
        """BlockPool eviction listener: the lazy store path when it is modelled as a free,
        instant store on eviction (`walk_target` 0). Also counts the GPU evictions, and those
        of blocks the tier holds no copy of (a walk that did not reach them in time)."""
        self.gpu_evicted += 1
        if h not in self.blocks:
            self.gpu_evicted_unstored += 1
            if self.fates is not None:
                self.fates[h] = "gpu-evicted without a CPU copy"
        if not self.eager and not self.walk_target:
            self.store(h)

    # --- lazy store as a walk over the GPU free queue (vLLM 0.24.0) ---
    def walk(self, pool: "BlockPool") -> None:
        """End of a schedule: vLLM 0.24.0 vllm/v1/simple_kv_offload/manager.py
        `_prepare_lazy_store_specs` (called from `build_connector_meta` at the end of
        `Scheduler.schedule`). From the block after the cursor (from the head, the eviction
        end, when there is no cursor or it is no longer free: `ref_cnt > 0`), cover up to
        `walk_target` free blocks, fewer when the CPU pool has fewer free blocks; each hashed
        block whose hash is not a CPU hit yet is touched (ref 0 -> 1: out of the free queue,
        neither allocatable nor evictable) and gets a CPU block (`get_new_blocks`, which evicts
        the CPU pool's least recently used). The cursor stays on the last block covered."""
        if not self.walk_target:
            return
        nxt, ref, bhash, tail, blocks = pool.nxt, pool.ref, pool.bhash, pool.tail, self.blocks
        cur = self.cursor
        if cur is not None and ref[cur] > 0:
            cur = None
        if cur is None:
            self.walk_restarts += 1
        node = nxt[pool.head] if cur is None else nxt[cur]
        room = self.capacity - len(self.pins) - self.reserved  # cpu_pool.get_num_free_blocks()
        out: list[int] = []
        covered, last, target = 0, cur, self.walk_target
        while node != tail and covered < target and len(out) < room:
            last = node
            h = bhash[node]
            if h is not None and h not in blocks:
                out.append(node)
            covered += 1
            node = nxt[node]
        self.cursor = last
        if not out:
            return
        self.walks += 1
        self._make_room(len(out))
        self.reserved += len(out)
        pool.hold(out)
        self._walked = _Store(out, [bhash[b] for b in out])
        if self.fates is not None:
            self.fates.update(dict.fromkeys(self._walked.hashes, "store in flight"))

    def _make_room(self, n: int) -> None:
        """Evict least recently used unpinned tier blocks so `n` more CPU blocks are free."""
        blocks, pins = self.blocks, self.pins
        evict = len(blocks) + self.reserved + n - self.capacity
        if evict <= 0:
            return
        victims = []
        for b in blocks:
            if len(victims) == evict:
                break
            if b not in pins:
                victims.append(b)
        for b in victims:
            del blocks[b]
        self.evicted_blocks += len(victims)
        if self.fates is not None:
            self.fates.update(dict.fromkeys(victims, "cpu-evicted"))

    def launch(self, end: float, scale: float = 1.0) -> None:
        """A step's compute ended at `end`: its store is copied on the store stream after it
        (worker.py `get_finished` launches it after the model runs, ordered after a
        compute-done event; one low-priority stream, FIFO). The worker polls the copies
        (`_poll_stream_events`: a high-water mark, in order) in `get_finished` as the next step
        is launched, so every copy finished by `end` is seen by the next step's poll and
        reported in that step's output; the copies the poll of the step that just ended saw
        are reported now (`release_completed` frees them after the next schedule). So a store
        walked at schedule k is freed after schedule k + 3 at the earliest: on the H200
        (tests/data/h200-runs-7 and -8, the probe's `store_held`) 3 to 5 schedules after its
        walk, 4 for most. Times are the engine clock's; copy durations are divided by `scale`
        as step durations are."""
        self._reported += self._polled
        self._polled = []
        s, self._walked = self._walked, None
        if s is not None:
            start = max(end, self.stream_free)
            s.done = start + self.store_seconds(len(s.hashes) * self.block_size) / scale
            self.stream_free = s.done
            self.inflight.append(s)
        q = self.inflight
        while q and q[0].done <= end:
            self._polled.append(q.popleft())

    def flush_wait(self, start: float) -> float:
        """Seconds a step starting at `start` waits because the schedule preempted a request:
        the worker synchronises every copy already launched before the blocks are reused
        (worker.py `handle_preemptions` -> `_flush_and_sync_all`, before the model runs)."""
        return max(0.0, self.stream_free - start) if self.inflight else 0.0

    def release_completed(self, pool: "BlockPool") -> None:
        """Stores reported in the previous step's output become CPU hits and their GPU blocks are
        freed to the free queue's tail in walk order (`_process_store_completion`; a reset
        store only frees them, `_release_transfer_refs`). With asynchronous scheduling (on in
        the H200 runs) a step's output is processed after the next step is scheduled, so this
        runs after that schedule and its walk."""
        for s in self._reported:
            self.reserved -= len(s.hashes)
            if not s.abandoned:
                blocks = self.blocks
                for h in s.hashes:
                    blocks[h] = None
                    blocks.move_to_end(h)
                self.stored_blocks += len(s.hashes)
                if self.fates is not None:
                    self.fates.update(dict.fromkeys(s.hashes, "stored"))
            pool.release(s.blocks, tail_first=False)
        self._reported.clear()

    def match(self, hashes: Sequence[int], limit: int, start: int = 0) -> int:
        """Leading blocks of `hashes` (at most `limit`) present in the tier; `hashes` begin
        `start` blocks into the prompt, which places the chunk boundaries a hit ends on."""
        n = 0
        blocks = self.blocks
        for h in hashes:
            if n >= limit or h not in blocks:
                break
            n += 1
        if self.chunk_tokens and n:
            bs, chunk = self.block_size, self.chunk_tokens
            n = max(0, (start + n) * bs // chunk * chunk // bs - start)
        return n

    def pin(self, hashes: Sequence[int]) -> None:
        """A lookup hit these blocks: not evictable until `unpin` (vLLM `touch`: out of the
        CPU pool's free queue). With the store on eviction they are the most recently used
        from now, as the client's TieredCache has it; with the walk, from `unpin`."""
        blocks, pins, now = self.blocks, self.pins, not self.walk_target
        for h in hashes:
            if now:
                blocks.move_to_end(h)
            pins[h] = pins.get(h, 0) + 1

    def unpin(self, hashes: Sequence[int]) -> None:
        """Release a lookup's pins. With the walk (vLLM's order), a block no lookup holds any
        more becomes the most recently used, in this order: `free_blocks` appends it to the CPU
        pool's free queue when the load completes (a load's blocks in prompt order), or when a
        request that could not be admitted is looked up again (and touches it again)."""
        pins, blocks, walk = self.pins, self.blocks, self.walk_target
        for h in hashes:
            n = pins[h] - 1
            if n:
                pins[h] = n
            else:
                del pins[h]
                if walk and h in blocks:
                    blocks.move_to_end(h)

    def impose(self, hashes: Sequence[int], absent: int | None) -> None:
        """Make `hashes` present (most recently used; least recently used unpinned blocks make
        room) and `absent` not: a replay's way to give a request the hit a real run recorded."""
        new = [h for h in hashes if h not in self.blocks]
        self._make_room(len(new))
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        if absent is not None and absent not in self.pins:
            self.blocks.pop(absent, None)

    def load(self, hashes: Sequence[int]) -> None:
        """Account a CPU->GPU copy of these blocks."""
        self.loaded_blocks += len(hashes)

    def reset(self) -> None:
        """Forget every block no load is reading (/reset_prefix_cache); stores in flight will
        not become hits, and the walk starts again from the head (manager.py `reset`)."""
        for s in (*self.inflight, *self._polled, *self._reported,
                  *([self._walked] if self._walked else [])):
            s.abandoned = True
        self.cursor = None
        for h in [b for b in self.blocks if b not in self.pins]:
            del self.blocks[h]

    def usage(self) -> float:
        return len(self.blocks) / self.capacity if self.capacity else 0.0
