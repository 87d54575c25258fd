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
from itertools import islice

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


class CursorPool(BlockPool):
    """A BlockPool whose free queue SimpleCPUOffload's lazy store walks with a cursor
    (vllm/v1/simple_kv_offload/manager.py `_prepare_lazy_store_specs`, vLLM 0.32): each step it
    visits up to `target` blocks after the cursor (from the head when the cursor block has left
    the free queue) and takes the cached ones the CPU tier lacks out of the queue for the copy
    (`gpu_pool.touch`); `unpin` frees them to the queue's end when the copy completes
    (`_process_store_completion` -> `free_blocks`). The blocks at or before the cursor are a
    prefix of the free queue (blocks are only appended, or put in front); `walked` counts it,
    kept by a sequence number each block gets when it is freed."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.seq = [0] * num_blocks  # order of freeing: the queue is sorted by it
        self._n = 0
        self.cursor: tuple[int, int] | None = None  # (block, its seq) last visited
        self.walked = 0  # free blocks at or before the cursor
        self.pinned = 0  # blocks out of the queue for an in-flight store

    def allocate(self, n: int) -> list[int] | None:
        out = super().allocate(n)
        if out is not None and self.walked:
            self.walked = max(0, self.walked - n)  # taken from the head: inside the prefix
        return out

    def touch(self, hashes: Sequence[int]) -> list[int]:
        if self.walked:
            cs, cached, ref, seq = self.cursor[1], self.cached, self.ref, self.seq
            for h in hashes:
                b = cached[h]
                if ref[b] == 0 and seq[b] <= cs:
                    self.walked -= 1
        return super().touch(hashes)

    def release(self, blocks: Sequence[int]) -> None:
        super().release(blocks)
        ref, bhash, seq = self.ref, self.bhash, self.seq
        for b in reversed(blocks):
            if ref[b] == 0:
                self._n += 1
                if bhash[b] is None:  # in front of the queue: before the cursor
                    seq[b] = -self._n
                    if self.cursor is not None:
                        self.walked += 1
                else:
                    seq[b] = self._n

    def walk(self, target: int, room: int, stored) -> list[int]:
        """One step's lazy-store walk: the blocks to copy (now out of the free queue), at most
        `room` (free CPU blocks), skipping blocks whose hash is in `stored`."""
        free = self.free
        if self.cursor is not None:
            b, s = self.cursor
            if b not in free or self.seq[b] != s:
                self.cursor = None
        if self.cursor is None:
            self.walked = 0
        out: list[int] = []
        last = None
        covered = 0
        bhash = self.bhash
        for b in islice(free, self.walked, self.walked + target):
            if len(out) >= room:
                break
            last = b
            covered += 1
            h = bhash[b]
            if h is not None and h not in stored:
                out.append(b)
        if last is not None:
            self.cursor = (last, self.seq[last])
        self.walked += covered - len(out)
        ref = self.ref
        for b in out:
            del free[b]
            ref[b] = 1
        self.pinned += len(out)
        return out

    def unpin(self, blocks: Sequence[int]) -> None:
        """A store completed: its GPU blocks go back to the free queue's end."""
        self.pinned -= len(blocks)
        self.release(blocks)
