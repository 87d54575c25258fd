"""One model of vLLM's prefix-cache eviction order, at block granularity.

Used by the replay engine (the pool-aware expected hits of each request), by
`agentx trace stats --lru-capacity` and, as the reference, by the simulator's and real
vLLM's cache tests. It follows vLLM v1's `BlockPool` (vllm/v1/core/block_pool.py) and
`SingleTypeKVCacheManager.free` (vllm/v1/core/single_type_kv_cache_manager.py):

  * a request hits the longest run of its leading blocks that are cached (prefix caching only
    reuses a prefix; `find_longest_cache_hit`), at most `limit` blocks (vLLM recomputes the
    prompt's last token: limit = (prompt_len - 1) // block_size);
  * the hit blocks are taken out of the free queue (`BlockPool.touch`); new blocks are popped
    from the free queue's front, which evicts the least recently freed cached block
    (`get_new_blocks`, `FreeKVCacheBlockQueue.popleft_n`);
  * when the request finishes its blocks are freed in REVERSE order onto the queue's end
    (`free_blocks(reversed(...))`), so its tail is evicted before its head; blocks without a
    hash (the partial last block) are prepended instead and reused first, so they never
    displace cached content once freed.

A block is its content key (any hashable; ints and tuples are cheapest), so a pool of N blocks
holds at most N distinct cached keys plus the uncached blocks of running requests. vLLM keeps
one block of its pool as the null block: a server started with `--num-gpu-blocks-override N`
is a model of capacity N - 1. Not modelled: duplicate copies (a recomputed block whose content
is also cached elsewhere is one key here, two blocks in vLLM) and full output blocks of
decoding (callers pass prompt blocks only).

Requests that overlap (concurrent lanes of a closed-loop replay) hold their blocks between
`acquire` at send and `release` at completion: held blocks cannot be evicted and shrink the
room left for cached ones, as in vLLM. When the held blocks alone exceed the pool (vLLM would
queue or preempt), nothing is evicted until enough are released. `observe` is one request
that finishes before the next (acquire + release); with nothing else held it takes a fast path.

`TieredCache` composes two of these for a server with a KV offload connector: the GPU pool
and the offload tier behind it (host DRAM), with the connector's lookup and store order.

Cost per block (CPU time, timeit over 350-400-block prompts each extending the previous one,
CPython 3.11 on the shared 2-core test machine): `observe` 0.16 us with int keys, 0.33 us
with (namespace, id) tuples; `acquire` + `release` 0.57 us / 0.86 us (the engine's case: a
100k-token prompt of 64-token blocks costs ~1.3 ms). The replaced head-to-tail LRU took 0.35 us
with tuples; doing the per-block work with C iterators (map/zip over dict methods) measured
slower, not faster.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence


class PrefixCache:
    """vLLM's free-queue LRU over content keys; capacity None tracks nothing (returns None)."""

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks
        self._free: OrderedDict[Hashable, None] = OrderedDict()  # cached, unreferenced: eviction order
        self._held: dict[Hashable, int] = {}  # cached blocks of running requests -> references
        self._uncached = 0  # blocks running requests hold that never enter the cache
        self._last: Sequence[Hashable] = ()  # keys of the last fast-path observe (see observe)
        self.evictions = 0  # > 0: the working set did not fit the pool
        self.on_evict: Callable[[Hashable], None] | None = None  # e.g. a lazy offload store

    def __len__(self) -> int:
        """Cached blocks (held or free)."""
        return len(self._free) + len(self._held)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._free or key in self._held

    def eviction_order(self) -> list[Hashable]:
        """Cached, unreferenced keys, the next one to be evicted first."""
        return list(self._free)

    def _hits(self, keys: Sequence[Hashable], start: int, limit: int) -> int:
        free, held = self._free, self._held
        n = start
        for k in keys[start:limit]:
            if k not in free and k not in held:
                break
            n += 1
        return n

    def _evict(self) -> None:
        over = len(self._free) + len(self._held) + self._uncached - self.capacity
        free, cb = self._free, self.on_evict
        while over > 0 and free:
            k, _ = free.popitem(last=False)
            self.evictions += 1
            over -= 1
            if cb is not None:
                cb(k)

    def acquire(self, keys: Sequence[Hashable], limit: int | None = None,
                uncached: int = 0) -> int | None:
        """A request starts: leading blocks of `keys` found cached (at most `limit`); then all
        its blocks, plus `uncached` blocks that never become cached (e.g. the partial last
        block), are held until `release`."""
        if self.capacity is None:
            return None
        self._last = ()
        hits = self._hits(keys, 0, len(keys) if limit is None else min(limit, len(keys)))
        free, held = self._free, self._held
        for k in keys:
            r = held.get(k)
            if r is None:
                free.pop(k, None)  # touch: no longer evictable
                held[k] = 1
            else:
                held[k] = r + 1
        self._uncached += uncached
        self._evict()
        return hits

    def release(self, keys: Sequence[Hashable], uncached: int = 0) -> None:
        """The request that acquired `keys` finished: its blocks are freed tail first."""
        if self.capacity is None:
            return
        self._last = ()
        free, held = self._free, self._held
        for k in reversed(keys):
            r = held[k] - 1
            if r:
                held[k] = r
            else:
                del held[k]
                free[k] = None
        self._uncached -= uncached
        self._evict()

    def observe(self, keys: Sequence[Hashable], limit: int | None = None) -> int | None:
        """One request from start to finish (acquire + release); returns its hit blocks.

        With nothing held this is a move-to-end of the keys in reverse order; and when the keys
        extend those of the previous observe(), that prefix (up to capacity) is known to be
        cached, so only the rest is looked up: replays of growing conversations stay cheap."""
        cap = self.capacity
        if cap is None:
            return None
        if self._held or self._uncached:
            hits = self.acquire(keys, limit)
            self.release(keys)
            return hits
        n = len(keys) if limit is None else min(limit, len(keys))
        last = self._last
        m = min(len(last), n, cap)
        known = m if keys[:m] == last[:m] else 0  # a turn usually extends the previous one
        hits = self._hits(keys, known, n)
        free = self._free
        move = free.move_to_end
        for k in reversed(keys):
            free[k] = None
            move(k)
        over = len(free) - cap
        if over > 0:
            self.evictions += over
            cb = self.on_evict
            for _ in range(over):
                k, _ = free.popitem(last=False)
                if cb is not None:
                    cb(k)
        self._last = keys
        return hits

    def store(self, keys: Sequence[Hashable]) -> None:
        """Copy blocks in (an offload tier's store): each key not cached yet joins the free
        queue's end, evicting from its front; a key already cached keeps its place (vLLM's
        SimpleCPUOffload skips blocks already in the CPU pool, `_StoreAdmission.ALREADY_CACHED`)."""
        if self.capacity is None:
            return
        self._last = ()
        free, held = self._free, self._held
        for k in keys:
            if k not in free and k not in held:
                free[k] = None
        self._evict()

    def touch(self, keys: Sequence[Hashable]) -> None:
        """A load read these cached blocks: they move to the free queue's end in order (vLLM
        touches the CPU blocks for the copy, then frees them in block order)."""
        if self.capacity is None:
            return
        self._last = ()
        free = self._free
        for k in keys:
            if k in free:
                free.move_to_end(k)


class TieredCache:
    """The GPU pool and, behind it, an offload tier (host DRAM), as vLLM's offload connectors
    use them; both are `PrefixCache`s (the SimpleCPUOffload CPU pool is itself a vLLM
    `BlockPool` with the same free-queue order: vllm/v1/simple_kv_offload/manager.py).

      * lookup: the GPU's leading hit first, then the tier's leading hit from where it ended
        (`get_num_new_matched_tokens` matches the remaining block hashes only); the loaded
        blocks join the request's GPU blocks and are touched in the tier;
      * lazy store (SimpleCPUOffload `lazy_offload: true`): a GPU block is copied to the tier
        as it nears eviction (`_prepare_lazy_store_specs` walks the GPU free queue from its
        head), modelled as a store on GPU eviction — the tier holds what fell out of the GPU;
      * eager store (SimpleCPUOffload's default, Mooncake): every newly computed block of a
        request is copied, so the tier also mirrors what the GPU holds.

    `acquire` returns the total hit blocks (GPU + tier); `last_tier_hits` the tier's share.
    With no tier (capacity None or 0) this is the GPU `PrefixCache` alone."""

    def __init__(self, gpu_blocks: int | None, tier_blocks: int | None = None,
                 eager: bool = False) -> None:
        self.gpu = PrefixCache(gpu_blocks)
        self.tier = PrefixCache(tier_blocks) if tier_blocks and gpu_blocks is not None else None
        self.eager = eager
        self.last_tier_hits = 0
        if self.tier is not None and not eager:
            tier = self.tier
            self.gpu.on_evict = lambda k: tier.store((k,))

    @property
    def capacity(self) -> int | None:
        return self.gpu.capacity

    @property
    def evictions(self) -> int:
        """GPU evictions: > 0 means the working set did not fit the GPU pool."""
        return self.gpu.evictions

    def acquire(self, keys: Sequence[Hashable], limit: int | None = None,
                uncached: int = 0) -> int | None:
        tier = self.tier
        if tier is None:
            return self.gpu.acquire(keys, limit, uncached)
        n = len(keys) if limit is None else min(limit, len(keys))
        dev = self.gpu._hits(keys, 0, n)
        host = tier._hits(keys, dev, n) - dev
        tier.touch(keys[dev:dev + host])
        self.gpu.acquire(keys, limit, uncached)  # lazy: GPU evictions store into the tier here
        if self.eager:
            tier.store(keys[dev + host:])
        self.last_tier_hits = host
        return dev + host

    def release(self, keys: Sequence[Hashable], uncached: int = 0) -> None:
        self.gpu.release(keys, uncached)
