"""The trace's theoretical prefix-cache hits given the server's KV pool.

An LRU over the blocks of the prompts in the order the engine sends them, with the pool's
capacity in trace blocks: a request hits the longest run of its leading blocks still cached
(vLLM's prefix caching only reuses a prefix), then all its blocks become most recent. Blocks
are keyed by (namespace, hash_id) exactly as synthesis namespaces content, so shared-prefix
blocks are shared here too. Without a known pool the cache is unbounded.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence


class PrefixLRU:
    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks
        self._lru: OrderedDict[Hashable, None] = OrderedDict()

    def observe(self, keys: Sequence[Hashable]) -> int:
        """Leading blocks of `keys` found cached; then cache all of them."""
        lru = self._lru
        hits = 0
        for k in keys:
            if k in lru:
                hits += 1
            else:
                break
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        if self.capacity is not None:
            while len(lru) > self.capacity:
                lru.popitem(last=False)
        return hits
