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
  puts the GPU block back at the free queue's end. Modelled as a store on eviction; a block the
  allocator takes before the walk reaches it (a pool kept full by waiting requests) is never
  stored by vLLM, but is by both models (docs/server-metrics.md: what that costs);
- the tier is a vLLM BlockPool of the GPU's block size (`_derive_cpu_config`), evicting least
  recently freed first;
- a block already in the tier is not stored again and keeps its place
  (`_classify_store_candidate` -> `_StoreAdmission.ALREADY_CACHED`; 0.24.0: the walk's
  `cached_block_hash_to_block.get_one_block(bhash) is None` test);
- a request's tier hits are pinned from its lookup until its load completes
  (`get_num_new_matched_tokens` touches them, `update_state_after_alloc` holds them for the
  copy, `_cleanup_load_request` frees them): no store, the request's own included, evicts them.
  Their recency is taken at the lookup, before the request's own GPU evictions are stored, as
  TieredCache does (vLLM requeues them when the copy completes; its lazy stores run ahead of
  eviction from a cursor over the GPU free queue, so neither order is exact there).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class OffloadTier:
    def __init__(self, capacity_blocks: int, block_size: int, eager: bool,
                 chunk_tokens: int | None = None) -> None:
        self.capacity = max(0, capacity_blocks)
        self.block_size = block_size
        self.eager = eager
        self.chunk_tokens = chunk_tokens
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.pins: dict[int, int] = {}  # blocks a pending load reads -> loads: not evictable
        self.stored_blocks = 0  # cumulative GPU->CPU block copies
        self.loaded_blocks = 0  # cumulative CPU->GPU block copies
        self.evicted_blocks = 0

    def store(self, h: int) -> None:
        """Copy one block's KV to the tier (see store_many)."""
        self.store_many((h,))

    def store_many(self, hashes: Sequence[int]) -> None:
        """Copy blocks to the tier in one transfer, as the manager batches a step's stores:
        blocks already there are skipped and keep their place; then CPU blocks for the rest
        are taken from the LRU head (`get_new_blocks`), which may evict blocks of the same
        request that were skipped; pinned blocks are never taken, and what finds no CPU block
        is not stored."""
        blocks, pins = self.blocks, self.pins
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        if not new or self.capacity == 0:
            return
        room = self.capacity - len(blocks)
        evict = len(new) - room
        if evict > 0:
            victims = []
            for b in blocks:
                if len(victims) == evict:
                    break
                if b not in pins:
                    victims.append(b)
            for b in victims:
                del blocks[b]
            self.evicted_blocks += len(victims)
            new = new[:room + len(victims)]
        for h in new:
            blocks[h] = None
        self.stored_blocks += len(new)

    def on_gpu_evict(self, h: int) -> None:
        """BlockPool eviction listener: the lazy store path."""
        if not self.eager:
            self.store(h)

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
        """A lookup hit these blocks: most recently used, and not evictable until `unpin`."""
        blocks, pins = self.blocks, self.pins
        for h in hashes:
            blocks.move_to_end(h)
            pins[h] = pins.get(h, 0) + 1

    def unpin(self, hashes: Sequence[int]) -> None:
        pins = self.pins
        for h in hashes:
            n = pins[h] - 1
            if n:
                pins[h] = n
            else:
                del pins[h]

    def load(self, hashes: Sequence[int]) -> None:
        """Account a CPU->GPU copy of these blocks."""
        self.loaded_blocks += len(hashes)

    def reset(self) -> None:
        """Forget every block no load is reading (/reset_prefix_cache)."""
        for h in [b for b in self.blocks if b not in self.pins]:
            del self.blocks[h]

    def usage(self) -> float:
        return len(self.blocks) / self.capacity if self.capacity else 0.0
