"""Paged KV cache with vLLM's automatic-prefix-caching semantics.

- A block's hash chains its parent's hash and its tokens; the first block also carries the
  request's `cache_salt` (see `block_hashes`). Only full blocks are hashed and cached.
- Blocks a running request references have ref_cnt > 0 and cannot be evicted. When a request
  finishes its blocks are freed tail-first into an LRU free queue, so its prefix is evicted
  last; a freed block keeps its hash (reusable) until it is popped for a new allocation.
  Blocks without a hash are freed to the queue's front. The same order, over content keys
  instead of block ids, is agentx.prefix_cache (what the client expects; the cache tests
  check this pool against it).
- Content is not de-duplicated: a request that recomputes a block whose content is still cached
  (a chain broken before it, the rest left in the free queue) caches its copy too, as vLLM's
  `BlockHashToBlockMap` keeps every block of a hash. A lookup takes the first copy cached
  (`get_one_block`); the content is evicted, for the listener, when its last copy is. Each copy
  keeps its hash, so it goes back to the free queue's tail when freed, and the lazy walk stores
  whichever it reaches first.
- A prompt may hit at most (prompt_len - 1) tokens: vLLM always recomputes the last token.
- Evictions are reported to an optional listener (the offload tier's eviction-time store).
- The free queue is a doubly linked list over block ids (`nxt`/`prv`, head and tail sentinels),
  as vLLM's `FreeKVCacheBlockQueue`: SimpleCPUOffload's lazy store walks it from a cursor block
  (sim/offload.py `OffloadTier.walk`), which an ordered dict cannot do.
"""
from __future__ import annotations

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
        self.cached: dict[int, int] = {}  # hash -> its first cached block (vLLM `get_one_block`)
        self.copies: dict[int, dict[int, None]] = {}  # hash -> its other cached blocks, oldest first
        # free queue: block ids 0..n-1, head sentinel n, tail sentinel n+1; eviction end first
        self.head, self.tail = num_blocks, num_blocks + 1
        self.nxt = [*range(1, num_blocks), self.tail, 0, -1]
        self.prv = [self.head, *range(num_blocks - 1), -1, num_blocks - 1]
        self._nfree = num_blocks
        self.on_evict = on_evict
        self.evictions = 0

    # --- queries ---
    @property
    def num_free(self) -> int:
        return self._nfree

    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self._nfree / self.num_blocks

    def free_blocks(self) -> list[int]:
        """The free queue, eviction end first."""
        out, nxt, tail = [], self.nxt, self.tail
        b = nxt[self.head]
        while b != tail:
            out.append(b)
            b = nxt[b]
        return out

    # --- free queue (linked list) ---
    def _unlink(self, b: int) -> None:
        nxt, prv = self.nxt, self.prv
        p, q = prv[b], nxt[b]
        nxt[p] = q
        prv[q] = p
        self._nfree -= 1

    def _link(self, b: int, p: int, q: int) -> None:
        """Put `b` into the free queue between neighbours `p` and `q`."""
        nxt, prv = self.nxt, self.prv
        nxt[p] = b
        prv[b] = p
        nxt[b] = q
        prv[q] = b
        self._nfree += 1

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
        return self.hold([self.cached[h] for h in hashes])

    def hold(self, blocks: list[int]) -> list[int]:
        """Take a reference on these blocks (vLLM `BlockPool.touch`): a free one leaves the free
        queue, so it is neither allocatable nor evictable until released."""
        ref, unlink = self.ref, self._unlink
        for b in blocks:
            if ref[b] == 0:
                unlink(b)
            ref[b] += 1
        return blocks

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks popped from the LRU head (evicting their cached content), or None."""
        if n > self._nfree:
            return None
        out = []
        bhash, ref, nxt, unlink = self.bhash, self.ref, self.nxt, self._unlink
        for _ in range(n):
            b = nxt[self.head]
            unlink(b)
            h = bhash[b]
            if h is not None and self._uncache(b, h):
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(h)
            ref[b] = 1
            out.append(b)
        return out

    def commit(self, block: int, h: int) -> bool:
        """Register a just-filled block under its hash; False if that content was already cached
        (the block is cached as one more copy of it)."""
        if self.bhash[block] == h:
            return False
        self.bhash[block] = h
        if h in self.cached:
            self.copies.setdefault(h, {})[block] = None
            return False
        self.cached[h] = block
        return True

    def _uncache(self, b: int, h: int) -> bool:
        """Block `b` no longer holds content `h`; True if no other copy of it stays cached. When
        `b` was the copy lookups take, the next oldest becomes it."""
        self.bhash[b] = None
        rest = self.copies.get(h)
        if rest is None:
            del self.cached[h]
            return True
        if self.cached[h] == b:
            self.cached[h] = b = next(iter(rest))
        del rest[b]
        if not rest:
            del self.copies[h]
        return False

    def release(self, blocks: Sequence[int], tail_first: bool = True) -> None:
        """Drop references: a request's tail first, so its prefix stays cached longest (a
        finished store's in its own order: `tail_first=False`); blocks without a hash go to the
        queue's front instead and are reused first (vLLM 0.24/0.32 `BlockPool.free_blocks`), so
        they never displace cached content."""
        ref, bhash, nxt, prv, link = self.ref, self.bhash, self.nxt, self.prv, self._link
        head, tail = self.head, self.tail
        for b in (reversed(blocks) if tail_first else blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if bhash[b] is None:
                    link(b, head, nxt[head])  # the front
                else:
                    link(b, prv[tail], tail)  # the back

    def forget(self, h: int) -> None:
        """Drop one content from the prefix cache (vLLM `BlockPool.evict_blocks`): its block
        keeps its data and references but no longer matches a lookup."""
        b = self.cached.pop(h, None)
        if b is not None:
            self.bhash[b] = None
        for b in self.copies.pop(h, ()):
            self.bhash[b] = None

    def reset(self) -> None:
        """Forget every cached block that is not in use (vLLM's /reset_prefix_cache)."""
        for b in self.free_blocks():
            h = self.bhash[b]
            if h is not None:
                self._uncache(b, h)
