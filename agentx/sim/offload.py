"""CPU (host DRAM) KV tier behind the GPU pool, as vLLM's offload connectors behave.

Blocks are tracked by their chained hash only: the tier holds no data, just which prefixes
could be loaded back instead of recomputed. It is an LRU of fixed capacity (in blocks).
- lazy store (SimpleCPUOffload `lazy_offload: true`): a block is copied to the CPU when the GPU
  pool evicts it, so the tier only holds what fell out of the GPU;
- eager store (Mooncake store, SimpleCPUOffload default): every newly computed full block is
  copied right away, so the tier mirrors recent GPU content too.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class OffloadTier:
    def __init__(self, capacity_blocks: int, block_size: int, eager: bool) -> None:
        self.capacity = max(0, capacity_blocks)
        self.block_size = block_size
        self.eager = eager
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.stored_blocks = 0  # cumulative GPU->CPU block copies
        self.loaded_blocks = 0  # cumulative CPU->GPU block copies
        self.evicted_blocks = 0

    def store(self, h: int) -> None:
        """Copy one block's KV to the tier (or refresh its recency if already there)."""
        if self.capacity == 0:
            return
        blocks = self.blocks
        if h in blocks:
            blocks.move_to_end(h)
            return
        blocks[h] = None
        self.stored_blocks += 1
        if len(blocks) > self.capacity:
            blocks.popitem(last=False)
            self.evicted_blocks += 1

    def on_gpu_evict(self, h: int) -> None:
        """BlockPool eviction listener: the lazy store path."""
        if not self.eager:
            self.store(h)

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """Leading blocks of `hashes` (at most `limit`) present in the tier."""
        n = 0
        blocks = self.blocks
        for h in hashes:
            if n >= limit or h not in blocks:
                break
            n += 1
        return n

    def load(self, hashes: Sequence[int]) -> None:
        """Account a CPU->GPU copy of these blocks and refresh their recency."""
        for h in hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)
        self.loaded_blocks += len(hashes)

    def usage(self) -> float:
        return len(self.blocks) / self.capacity if self.capacity else 0.0
