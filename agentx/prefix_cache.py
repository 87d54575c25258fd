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
`acquire` and `release`: held blocks cannot be evicted and shrink the room left for cached
ones, as in vLLM. When the held blocks alone exceed the pool, nothing is evicted until enough
are released. `observe` is one request that finishes before the next (acquire + release);
with nothing else held it takes a fast path.

`TieredCache` composes two of these for a server with a KV offload connector: the GPU pool
and the offload tier behind it (host DRAM), with the connector's lookup and store order, and
vLLM's waiting queue in front (the replay engine's model: a request is looked up and acquires
its blocks when the server would admit it, not at its send).

Cost per block (CPU time, over 350-400-block prompts each extending the previous one, gc off,
CPython 3.11 on the shared 2-core test machine, 2026-12-01): `observe` 0.50 us with int keys
(the engine's, `Conversation.block_keys`), 0.78 us with (namespace, id) tuples; `acquire` +
`release` 1.17 us / 1.75 us. The single-dict version before the shards took 0.58 / 0.84 us,
and stalled the loop for a whole-table rebuild now and then (see PrefixCache). A lazy tier's
store of each GPU eviction rebuilt the eviction heap per block (~20 us a block with a full
tier); `store_each` keeps one heap per batch of evictions: `TieredCache` acquire + release
with a full 20k-block tier, 2.2-2.8 us per block instead of 6.0-6.8 (2026-12-02, same
machine, other work running).
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence

from .aio import Steps, run_steps

# Blocks per step of a stepped operation (`*_steps`): ~0.3 ms of acquire + release. A replay
# engine runs the steps one loop turn at a time, so a request of 13k blocks (an 860k-token
# trace prompt) does not hold the loop for the ~15 ms its acquire costs in one piece.
STEP_BLOCKS = 256
SHARDS = 64  # see PrefixCache
_MASK = SHARDS - 1


def sent_keys(keys: Sequence[Hashable], prompt_tokens: int,
              block_tokens: float) -> Sequence[Hashable]:
    """The keys of the blocks a prompt of `prompt_tokens` tokens has, out of its trace turn's
    `keys` (`block_tokens` tokens each). The same keys unless the client clamped the prompt
    (to the server's max_model_len, SynthConfig.max_prompt_tokens): the server then sees,
    caches, holds and offloads only the clamped prompt's blocks. Modelling the whole turn
    instead made one 635k-token turn clamped to 300k flush 40% of a 1.6M-token tier at each
    revisit, and the theory fell to 9% against the simulator's 27% (issue 34)."""
    return keys[:math.ceil(prompt_tokens / block_tokens)]


class PrefixCache:
    """vLLM's free-queue LRU over content keys; capacity None tracks nothing (returns None).

    Free keys carry the stamp of their release (a counter), so the free queue's order is the
    order of the stamps; held keys carry their reference count. Both are spread over SHARDS
    dicts by hash (free: ordered, in stamp order), and an eviction takes the oldest of the
    free shards' first keys. One dict of every key would be simpler, but a CPython dict
    rebuilds its whole table when inserts have used up its slots: ~60-100 ms at 0.4-1M keys
    (this machine), a stall of the replay loop; a shard's rebuild is 1/SHARDS of that."""

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks
        # cached, unreferenced: key -> release stamp, in stamp order (eviction order)
        self._free: list[OrderedDict[Hashable, int]] = [OrderedDict() for _ in range(SHARDS)]
        self._held: list[dict[Hashable, int]] = [{} for _ in range(SHARDS)]  # -> references
        self._n_free = 0
        self._n_held = 0
        self._clock = 0  # release stamps
        self._uncached = 0  # blocks running requests hold that never enter the cache
        self._last: Sequence[Hashable] = ()  # keys of the last fast-path observe (see observe)
        self.evictions = 0  # > 0: the working set did not fit the pool
        # evicted keys, in eviction order, a step's worth at a time (e.g. a lazy offload store)
        self.on_evict: Callable[[list[Hashable]], None] | None = None

    def __len__(self) -> int:
        """Cached blocks (held or free)."""
        return self._n_free + self._n_held

    @property
    def held(self) -> int:
        """Blocks running requests hold (cached keys and uncached blocks)."""
        return self._n_held + self._uncached

    def __contains__(self, key: Hashable) -> bool:
        i = hash(key) & _MASK
        return key in self._free[i] or key in self._held[i]

    def eviction_order(self) -> list[Hashable]:
        """Cached, unreferenced keys, the next one to be evicted first."""
        free = [(st, k) for sh in self._free for k, st in sh.items()]
        return [k for _, k in sorted(free, key=lambda x: x[0])]

    def _hits(self, keys: Sequence[Hashable], start: int, limit: int) -> int:
        free, held = self._free, self._held
        n = start
        for k in keys[start:limit]:
            i = hash(k) & _MASK
            if k not in free[i] and k not in held[i]:
                break
            n += 1
        return n

    def _hits_steps(self, keys: Sequence[Hashable], start: int, limit: int) -> Steps[int]:
        """`_hits` in steps of STEP_BLOCKS blocks."""
        n = start
        for j in range(start, limit, STEP_BLOCKS):
            if j != start:
                yield
            end = min(limit, j + STEP_BLOCKS)
            n = self._hits(keys, j, end)
            if n < end:
                break
        return n

    def _free_key(self, k: Hashable, i: int) -> None:
        """k joins the free queue's end."""
        self._clock += 1
        self._free[i][k] = self._clock

    def _evict(self) -> None:
        run_steps(self._evict_steps())

    def _evict_steps(self) -> Steps[None]:
        over = self._n_free + self._n_held + self._uncached - self.capacity
        if over <= 0 or not self._n_free:
            return
        free, cb = self._free, self.on_evict
        heap = [(next(iter(sh.values())), i) for i, sh in enumerate(free) if sh]
        heapq.heapify(heap)
        gone: list[Hashable] = []  # for on_evict, one call per step
        done = 0
        while over > 0 and heap:
            _, i = heapq.heappop(heap)
            sh = free[i]
            k, _ = sh.popitem(last=False)
            self._n_free -= 1
            self.evictions += 1
            over -= 1
            if cb is not None:
                gone.append(k)
            if sh:
                heapq.heappush(heap, (next(iter(sh.values())), i))
            done += 1
            if done % STEP_BLOCKS == 0:
                if gone:
                    cb(gone)
                    gone = []
                if over > 0:
                    yield
        if gone:
            cb(gone)

    def acquire(self, keys: Sequence[Hashable], limit: int | None = None,
                uncached: int = 0) -> int | None:
        """A request starts: leading blocks of `keys` found cached (at most `limit`); then all
        its blocks, plus `uncached` blocks that never become cached (e.g. the partial last
        block), are held until `release`."""
        return run_steps(self.acquire_steps(keys, limit, uncached))

    def acquire_steps(self, keys: Sequence[Hashable], limit: int | None = None,
                      uncached: int = 0) -> Steps[int | None]:
        """`acquire` in steps of STEP_BLOCKS blocks (the caller runs no other operation on
        this cache until it has ended)."""
        if self.capacity is None:
            return None
        self._last = ()
        n = len(keys) if limit is None else min(limit, len(keys))
        hits = yield from self._hits_steps(keys, 0, n)
        free, held, mask = self._free, self._held, _MASK
        for j in range(0, len(keys), STEP_BLOCKS):
            if j:
                yield
            touched = taken = 0
            for k in keys[j:j + STEP_BLOCKS]:
                i = hash(k) & mask
                h = held[i]
                r = h.get(k)
                if r is None:
                    if free[i].pop(k, None) is not None:  # touch: no longer evictable
                        touched += 1
                    h[k] = 1
                    taken += 1
                else:
                    h[k] = r + 1
            self._n_free -= touched
            self._n_held += taken
        self._uncached += uncached
        yield from self._evict_steps()
        return hits

    def release(self, keys: Sequence[Hashable], uncached: int = 0) -> None:
        """The request that acquired `keys` finished: its blocks are freed tail first."""
        run_steps(self.release_steps(keys, uncached))

    def release_steps(self, keys: Sequence[Hashable], uncached: int = 0) -> Steps[None]:
        """`release` in steps of STEP_BLOCKS blocks (as `acquire_steps`)."""
        if self.capacity is None:
            return
        self._last = ()
        free, held, mask = self._free, self._held, _MASK
        clock = self._clock
        for end in range(len(keys), 0, -STEP_BLOCKS):
            if end != len(keys):
                yield
            freed = 0
            for k in reversed(keys[max(0, end - STEP_BLOCKS):end]):
                i = hash(k) & mask
                h = held[i]
                r = h[k] - 1
                if r:
                    h[k] = r
                else:  # joins the free queue's end
                    del h[k]
                    clock += 1
                    free[i][k] = clock
                    freed += 1
            self._clock = clock
            self._n_held -= freed
            self._n_free += freed
        self._uncached -= uncached
        yield from self._evict_steps()

    def observe(self, keys: Sequence[Hashable], limit: int | None = None) -> int | None:
        """One request from start to finish (acquire + release); returns its hit blocks.

        With nothing held this is a move-to-end of the keys in reverse order; and when the keys
        extend those of the previous observe(), that prefix (up to capacity) is known to be
        cached, so only the rest is looked up: replays of growing conversations stay cheap."""
        cap = self.capacity
        if cap is None:
            return None
        if self._n_held or self._uncached:
            hits = self.acquire(keys, limit)
            self.release(keys)
            return hits
        n = len(keys) if limit is None else min(limit, len(keys))
        last = self._last
        m = min(len(last), n, cap)
        known = m if keys[:m] == last[:m] else 0  # a turn usually extends the previous one
        hits = self._hits(keys, known, n)
        free = self._free
        clock = self._clock
        for k in reversed(keys):
            sh = free[hash(k) & _MASK]
            if sh.pop(k, None) is None:
                self._n_free += 1
            clock += 1
            sh[k] = clock
        self._clock = clock
        self._evict()
        self._last = keys
        return hits

    def store(self, keys: Sequence[Hashable]) -> None:
        """Copy blocks in (an offload tier's store): each key not cached yet joins the free
        queue's end, evicting from its front; a key already cached keeps its place (vLLM's
        SimpleCPUOffload skips blocks already in the CPU pool, `_StoreAdmission.ALREADY_CACHED`)."""
        run_steps(self.store_steps(keys))

    def store_steps(self, keys: Sequence[Hashable]) -> Steps[None]:
        if self.capacity is None:
            return
        self._last = ()
        free, held = self._free, self._held
        for j in range(0, len(keys), STEP_BLOCKS):
            if j:
                yield
            for k in keys[j:j + STEP_BLOCKS]:
                i = hash(k) & _MASK
                if k not in free[i] and k not in held[i]:
                    self._free_key(k, i)
                    self._n_free += 1
        yield from self._evict_steps()

    def store_each(self, keys: Sequence[Hashable]) -> None:
        """`store` one key at a time, in order: each key is its own copy, so one that the
        earlier keys' stores evicted is stored again (the lazy path, as the simulator's tier
        stores each GPU eviction: sim/offload.py `on_gpu_evict`). The same as calling
        `store((k,))` per key, without rebuilding the eviction heap each time."""
        if self.capacity is None:
            return
        self._last = ()
        free, held, cap, cb = self._free, self._held, self.capacity, self.on_evict
        heap: list[tuple[int, int]] | None = None
        for k in keys:
            i = hash(k) & _MASK
            sh = free[i]
            if k in sh or k in held[i]:
                continue
            self._free_key(k, i)
            self._n_free += 1
            if heap is not None and len(sh) == 1:
                heapq.heappush(heap, (self._clock, i))
            if self._n_free + self._n_held + self._uncached <= cap:
                continue
            if heap is None:
                heap = [(next(iter(f.values())), j) for j, f in enumerate(free) if f]
                heapq.heapify(heap)
            _, j = heapq.heappop(heap)
            f = free[j]
            gone, _ = f.popitem(last=False)
            self._n_free -= 1
            self.evictions += 1
            if f:
                heapq.heappush(heap, (next(iter(f.values())), j))
            if cb is not None:
                cb([gone])

    def touch(self, keys: Sequence[Hashable]) -> None:
        """A load read these cached blocks: they move to the free queue's end in order (vLLM
        touches the CPU blocks for the copy, then frees them in block order)."""
        if self.capacity is None:
            return
        self._last = ()
        free = self._free
        for k in keys:
            i = hash(k) & _MASK
            if free[i].pop(k, None) is not None:
                self._free_key(k, i)


class Admission:
    """One request in the modelled server from its send to its release: waiting in the
    server's queue until the pool can hold it, then running with its hits known (`hits`, GPU +
    tier, and `tier_hits`, the tier's share; None while waiting)."""

    __slots__ = ("keys", "limit", "uncached", "hits", "tier_hits")

    def __init__(self, keys: Sequence[Hashable], limit: int | None, uncached: int) -> None:
        self.keys, self.limit, self.uncached = keys, limit, uncached
        self.hits: int | None = None
        self.tier_hits = 0


class TieredCache:
    """The GPU pool and, behind it, an offload tier (host DRAM), as vLLM's offload connectors
    use them; both are `PrefixCache`s (the SimpleCPUOffload CPU pool is itself a vLLM
    `BlockPool` with the same free-queue order and the GPU's block size:
    vllm/v1/simple_kv_offload/manager.py `_derive_cpu_config`, vLLM 0.24.0 and 0.32.0).

      * lookup: the GPU's leading hit first, then the tier's leading hit from where it ended
        (`get_num_new_matched_tokens` matches the remaining block hashes only); the loaded
        blocks join the request's GPU blocks and are touched in the tier;
      * lazy store (SimpleCPUOffload `lazy_offload: true`): a GPU block is copied to the tier
        as it nears eviction (`_prepare_lazy_store_specs` walks the GPU free queue from its
        head, up to 2 x max_num_batched_tokens / block_size blocks per scheduler step, after
        the step's allocations), modelled as a store on GPU eviction — the tier holds what fell
        out of the GPU. Not modelled: what the allocator takes before the walk reaches it is
        never stored (sim/offload.py; its cost: docs/server-metrics.md);
      * eager store (SimpleCPUOffload's default, Mooncake): every newly computed block of a
        request is copied, so the tier also mirrors what the GPU holds;
      * `whole` (MooncakeStoreConnector, vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
        store/): the lookup counts the store's leading hit from the prompt's first block
        (`get_num_new_matched_tokens` -> `lookup(token_len, block_hashes)`, the longest cached
        prefix) and loads what of it lies past the GPU's hit, nothing when it ends before; the
        save puts every block of the prompt the store lacks, from the first (`RequestTracker`
        starts at `num_saved_tokens=0`; `batch_is_exist` skips those present), GPU hits
        included. Used by the tier replay (bench/tier_replay.py --store mooncake); the client's
        live model and the simulator model Mooncake as `eager`.

    The server's waiting queue (`queue=True`, the replay engine's setting): `submit` at send,
    `settle` once the response is in (its hits are then known), `finish` at completion. vLLM
    looks a request up when its scheduler admits it, not when it arrives: `Scheduler.schedule`
    takes waiting requests first come first served, calls `get_computed_blocks` and the
    connector's `get_num_new_matched_tokens` there, and records those hits as the response's
    `cached_tokens` (`prefill_stats.set`; vllm/v1/core/sched/scheduler.py, 0.24.0 and 0.32.0).
    It admits one only when its whole prompt fits in the free blocks (`allocate_slots(...,
    full_sequence_must_fit=True)`, `scheduler_reserve_full_isl` default True,
    vllm/config/scheduler.py), and stops at the first that does not fit. So here a submitted
    request waits while the blocks running requests hold plus its own would exceed the pool
    (its keys are counted whole: keys shared with a running request make it wait a little
    longer than vLLM would), its lookup and acquire happen when it is admitted, by a `finish`
    that freed room or by its own `settle` (the server has answered it, so it was admitted),
    and a waiting request holds no blocks. With a full pool the wait is long: on the H200 run
    of tests/data/h200-runs-2 the server queued requests 10.6 s on average, during which the
    tier turned over; looking up at send over-predicted the hit rate by 12 points there
    (docs/server-metrics.md). `queue=False` looks up at `submit` (the model before
    2026-12-02).

    `acquire` / `release` are one request admitted at once (no queue); `acquire` returns the
    total hit blocks (GPU + tier) and `last_tier_hits` the tier's share. With no tier
    (capacity None or 0) this is the GPU `PrefixCache` alone."""

    def __init__(self, gpu_blocks: int | None, tier_blocks: int | None = None,
                 eager: bool = False, queue: bool = True, whole: bool = False) -> None:
        self.gpu = PrefixCache(gpu_blocks)
        self.tier = PrefixCache(tier_blocks) if tier_blocks and gpu_blocks is not None else None
        self.eager = eager or whole
        self.whole = whole
        self.queue = queue
        self.waiting: deque[Admission] = deque()  # submitted, not admitted yet (FCFS)
        self.last_tier_hits = 0
        if self.tier is not None and not self.eager:
            tier = self.tier
            self.gpu.on_evict = tier.store_each

    @property
    def capacity(self) -> int | None:
        return self.gpu.capacity

    @property
    def evictions(self) -> int:
        """GPU evictions: > 0 means the working set did not fit the GPU pool."""
        return self.gpu.evictions

    def acquire(self, keys: Sequence[Hashable], limit: int | None = None,
                uncached: int = 0) -> int | None:
        return run_steps(self.acquire_steps(keys, limit, uncached))

    def acquire_steps(self, keys: Sequence[Hashable], limit: int | None = None,
                      uncached: int = 0) -> Steps[int | None]:
        if self.capacity is None:
            return None
        a = Admission(keys, limit, uncached)
        yield from self._admit_steps(a)
        return a.hits

    def release(self, keys: Sequence[Hashable], uncached: int = 0) -> None:
        self.gpu.release(keys, uncached)

    def release_steps(self, keys: Sequence[Hashable], uncached: int = 0) -> Steps[None]:
        return self.gpu.release_steps(keys, uncached)

    def _admit_steps(self, a: Admission) -> Steps[None]:
        """`a` starts running: its lookup, then its blocks are held."""
        keys, limit, tier = a.keys, a.limit, self.tier
        if tier is None:
            a.hits = yield from self.gpu.acquire_steps(keys, limit, a.uncached)
            self.last_tier_hits = 0
            return
        n = len(keys) if limit is None else min(limit, len(keys))
        dev = yield from self.gpu._hits_steps(keys, 0, n)
        if self.whole:  # the store's own leading hit, from the first block
            host = max(0, (yield from tier._hits_steps(keys, 0, n)) - dev)
        else:
            host = (yield from tier._hits_steps(keys, dev, n)) - dev
        tier.touch(keys[dev:dev + host])
        # lazy: GPU evictions store into the tier here
        yield from self.gpu.acquire_steps(keys, limit, a.uncached)
        if self.eager:
            yield from tier.store_steps(keys if self.whole else keys[dev + host:])
        a.hits, a.tier_hits = dev + host, host
        self.last_tier_hits = host

    def _admit_waiting_steps(self) -> Steps[None]:
        """Admit waiting requests in order while the first one fits (see the class doc)."""
        gpu, waiting = self.gpu, self.waiting
        while waiting:
            a = waiting[0]
            held = gpu.held
            if held and held + len(a.keys) + a.uncached > gpu.capacity:
                return
            waiting.popleft()
            yield from self._admit_steps(a)

    def submit(self, keys: Sequence[Hashable], limit: int | None = None,
               uncached: int = 0) -> Admission | None:
        return run_steps(self.submit_steps(keys, limit, uncached))

    def submit_steps(self, keys: Sequence[Hashable], limit: int | None = None,
                     uncached: int = 0) -> Steps[Admission | None]:
        """A request is sent: it joins the queue (admitted at once if it fits). None when the
        pool is unknown (nothing is tracked)."""
        if self.capacity is None:
            return None
        a = Admission(keys, limit, uncached)
        if not self.queue:
            yield from self._admit_steps(a)
            return a
        self.waiting.append(a)
        yield from self._admit_waiting_steps()
        return a

    def settle(self, a: Admission) -> None:
        run_steps(self.settle_steps(a))

    def settle_steps(self, a: Admission) -> Steps[None]:
        """The server has answered `a`, so it admitted it: if the model still has it waiting
        (it thought the pool full), admit it now, ahead of its turn."""
        if a.hits is None:
            self.waiting.remove(a)
            yield from self._admit_steps(a)

    def finish(self, a: Admission) -> None:
        run_steps(self.finish_steps(a))

    def finish_steps(self, a: Admission) -> Steps[None]:
        """`a` completed (or was given up): its blocks are freed, tail first, and the waiting
        requests that now fit are admitted. One never admitted (not settled: e.g. cancelled
        before the server took it) just leaves the queue."""
        if a.hits is None:
            self.waiting.remove(a)
        else:
            yield from self.gpu.release_steps(a.keys, a.uncached)
        yield from self._admit_waiting_steps()
