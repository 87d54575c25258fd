"""The trace's theoretical prefix-cache hits given the server's KV pool.

An LRU over the blocks of the prompts in the order the engine sends them, with the pool's
capacity in trace blocks: a request hits the longest run of its leading blocks still cached
(vLLM's prefix caching only reuses a prefix), then all its blocks become most recent. Blocks
are keyed by (namespace, hash_id) exactly as synthesis namespaces content, so shared-prefix
blocks are shared here too. Without a known pool nothing is tracked (an unbounded LRU would
grow with every block of the run): the expectation is then the in-session one.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence


class PrefixLRU:
    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks
        self._lru: OrderedDict[Hashable, None] = OrderedDict()
        self.evictions = 0  # > 0: the replayed working set did not fit the pool

    def observe(self, keys: Sequence[Hashable]) -> int | None:
        """Leading blocks of `keys` found cached, then cache all of them; None when the pool
        is unknown."""
        if self.capacity is None:
            return None
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
        while len(lru) > self.capacity:
            lru.popitem(last=False)
            self.evictions += 1
        return hits
