"""Paged KV cache with vLLM's automatic-prefix-caching semantics.

- A block's hash chains its parent's hash and its tokens; the first block also carries the
  request's `cache_salt` (see `block_hashes`). Only full blocks are hashed and cached.
- Blocks a running request references have ref_cnt > 0 and cannot be evicted. When a request
  finishes its blocks are freed tail-first into an LRU free queue, so its prefix is evicted
  last; a freed block keeps its hash (reusable) until it is popped for a new allocation.
  Blocks without a hash are freed to the queue's front. The same order, over content keys
  instead of block ids, is agentx.prefix_cache (what the client expects; the cache tests
  check this pool against it).
- A prompt may hit at most (prompt_len - 1) tokens: vLLM always recomputes the last token.
- Evictions are reported to an optional listener (the offload tier's lazy store).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np


def block_hashes(token_ids: np.ndarray, block_size: int, salt: str | None = None,
                 parent: int | None = None) -> list[int]:
    """Chained hashes of every full block of `token_ids` (partial tail excluded)."""
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    data = np.ascontiguousarray(token_ids[: n_full * block_size], dtype=np.uint32).tobytes()
    step = block_size * 4
    out = []
    h = hash(("agentx-root", salt)) if parent is None else parent
    for i in range(n_full):
        h = hash((h, data[i * step:(i + 1) * step]))
        out.append(h)
    return out


class BlockPool:
    """GPU KV blocks: ref counts, hash -> block map, LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int,
                 on_evict: Callable[[int], None] | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError("KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.bhash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.on_evict = on_evict
        self.evictions = 0

    # --- queries ---
    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self.free) / self.num_blocks

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of `hashes` (at most `limit`) are cached on the GPU."""
        cached = self.cached
        n = 0
        for h in hashes:
            if n >= limit or h not in cached:
                break
            n += 1
        return n

    # --- mutations ---
    def touch(self, hashes: Sequence[int]) -> list[int]:
        """Take a reference on the cached blocks of these hashes (a prefix hit)."""
        out = []
        cached, ref, free = self.cached, self.ref, self.free
        for h in hashes:
            b = cached[h]
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
            out.append(b)
        return out

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks popped from the LRU head (evicting their cached content), or None."""
        if n > len(self.free):
            return None
        out = []
        free, bhash, cached, ref = self.free, self.bhash, self.cached, self.ref
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = bhash[b]
            if h is not None:
                bhash[b] = None
                if cached.get(h) == b:
                    del cached[h]
                    self.evictions += 1
                    if self.on_evict is not None:
                        self.on_evict(h)
            ref[b] = 1
            out.append(b)
        return out

    def commit(self, block: int, h: int) -> bool:
        """Register a just-filled block under its hash; False if that content is already cached."""
        if h in self.cached:
            return False
        self.bhash[block] = h
        self.cached[h] = block
        return True

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references, tail first, so its prefix stays cached longest; blocks
        without a hash go to the queue's front instead and are reused first (vLLM 0.32
        `BlockPool.free_blocks`), so they never displace cached content."""
        ref, free, bhash = self.ref, self.free, self.bhash
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                if bhash[b] is None:
                    free.move_to_end(b, last=False)

    def reset(self) -> None:
        """Forget every cached block that is not in use (vLLM's /reset_prefix_cache)."""
        for b in list(self.free):
            h = self.bhash[b]
            if h is not None and self.cached.get(h) == b:
                del self.cached[h]
            self.bhash[b] = None
