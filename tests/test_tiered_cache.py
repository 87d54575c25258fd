"""The tiered prefix-cache model (agentx.prefix_cache.TieredCache): the GPU pool and an offload
tier behind it, with vLLM's SimpleCPUOffload lookup and store order, worked by hand; and the
pool-aware theory it gives against the simulator's own GPU pool + CPU tier."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agentx.prefix_cache import PrefixCache, TieredCache
from agentx.sim.kvcache import BlockPool
from agentx.sim.offload import OffloadTier


def test_lazy_tier_holds_what_fell_out_of_the_gpu():
    c = TieredCache(3, 10, eager=False)
    assert c.acquire(list("abc")) == 0
    c.release(list("abc"))
    assert c.tier.eviction_order() == []  # nothing evicted yet: a lazy tier is empty
    assert c.acquire(list("xyz")) == 0  # evicts c, b, a (tail first) into the tier
    c.release(list("xyz"))
    assert c.tier.eviction_order() == ["c", "b", "a"]
    assert c.acquire(list("abcd")) == 3 and c.last_tier_hits == 3  # all three from the tier
    c.release(list("abcd"))


def test_gpu_hit_first_then_tier_from_where_it_ended():
    c = TieredCache(4, 10, eager=False)
    c.acquire(list("abcd"))
    c.release(list("abcd"))
    c.acquire(list("wxy"))  # evicts d, c, b into the tier; a stays on the GPU
    c.release(list("wxy"))
    assert c.acquire(list("abcdq")) == 4
    assert c.last_tier_hits == 3  # a from the GPU, b c d from the tier


def test_eager_tier_stores_every_computed_block():
    c = TieredCache(2, 10, eager=True)
    c.acquire(list("ab"))
    assert sorted(c.tier.eviction_order()) == ["a", "b"]  # stored at once, not on eviction
    c.release(list("ab"))


def test_no_tier_is_the_gpu_model_alone():
    t, p = TieredCache(5, None), PrefixCache(5)
    for keys in (list("abc"), list("abcd"), list("xyzw"), list("abcde")):
        assert t.acquire(keys) == p.acquire(keys)
        t.release(keys)
        p.release(keys)
    assert t.evictions == p.evictions and t.last_tier_hits == 0


def test_tier_capacity_bounds_it():
    c = TieredCache(2, 3, eager=False)
    for i in range(10):
        keys = [f"s{i}-{j}" for j in range(2)]
        c.acquire(keys)
        c.release(keys)
    assert len(c.tier) == 3


def _sim_hits(prompts: list[list[int]], gpu: int, tier: int, eager: bool) -> list[tuple[int, int]]:
    """The simulator's GPU pool and CPU tier, one request after another (engine._lookup's
    order: GPU match, tier match after it, load, compute the rest, release)."""
    off = OffloadTier(tier, 1, eager=eager)
    pool = BlockPool(gpu, 1, on_evict=off.on_gpu_evict)
    out = []
    for hashes in prompts:
        limit = len(hashes)
        dev = pool.match(hashes, limit)
        host = off.match(hashes[dev:], limit - dev)
        blocks = pool.touch(hashes[:dev]) + pool.allocate(len(hashes) - dev)
        off.load(hashes[dev:dev + host])
        for b, h in zip(blocks[dev:], hashes[dev:]):
            pool.commit(b, h)
            if eager and h not in hashes[dev:dev + host]:
                off.store(h)
        pool.release(blocks)
        out.append((dev, host))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_agrees_with_the_simulator_pool_and_tier(seed, eager):
    """Growing sessions interleaved at random, one request at a time: the model's GPU and tier
    hits equal the simulator's, request by request (lazy: exactly; eager: the total). The tier
    is large enough never to evict; tests/test_sim_offload.py compares the two with a tier
    that evicts (re-stores skipped, a request's tier hits pinned, as vLLM 0.32 does)."""
    rng = np.random.default_rng(seed)
    ctx: dict[int, list[int]] = {s: [] for s in range(6)}
    prompts, fresh = [], 0
    for _ in range(40):
        s = int(rng.integers(0, 6))
        if len(ctx[s]) > 15:  # the session ends; a new one starts in that slot
            ctx[s], fresh = [], fresh + 1
        base = (fresh * 10 + s) * 10_000
        ctx[s] = ctx[s] + [base + len(ctx[s]) + j for j in range(int(rng.integers(1, 6)))]
        prompts.append(list(ctx[s]))
    model = TieredCache(24, 400, eager=eager)
    got = []
    for keys in prompts:
        total = model.acquire(keys)
        model.release(keys)
        got.append((total - model.last_tier_hits, model.last_tier_hits))
    want = _sim_hits(prompts, 24, 400, eager)
    if eager:
        assert [sum(x) for x in got] == [sum(x) for x in want]
    else:
        assert got == want


def test_a_request_that_does_not_fit_waits_and_is_looked_up_when_admitted():
    """vLLM looks a request up when its scheduler admits it (whole prompt free), so what the
    running requests evict meanwhile is not a hit (Scheduler.schedule, vLLM 0.24 and 0.32)."""
    c = TieredCache(4, 2, eager=False)
    first = c.submit(list("ab"))
    c.finish(first)  # a b cached on the GPU
    big = c.submit(list("wxyz"))  # admitted (room), evicts b then a into the tier (a newest)
    late = c.submit(list("abq"))  # does not fit beside big: waits, holds nothing
    assert late.hits is None and list(c.waiting) == [late]
    filler = c.submit(list("mn"))  # behind it in the queue, FCFS
    assert filler.hits is None
    c.finish(big)  # frees room: late is admitted now, its lookup sees the tier
    assert late.hits == 2 and late.tier_hits == 2
    assert filler.hits is None  # m n do not fit beside late (3 held + 2 > 4)
    c.finish(late)
    assert filler.hits == 0
    c.finish(filler)
    assert not c.waiting and c.gpu.held == 0


def test_send_time_lookup_is_the_old_model():
    """queue=False looks up at submit whatever the pool holds (the model before 2026-12-02)."""
    c = TieredCache(4, 10, eager=False, queue=False)
    a = c.submit(list("abcd"))
    b = c.submit(list("abce"))  # admitted beside a although the pool cannot hold both
    assert (a.hits, b.hits) == (0, 3) and c.gpu.held == 5 and not c.waiting
    c.finish(a)
    c.finish(b)
    assert c.gpu.held == 0


def test_settle_admits_an_answered_request_and_finish_drops_an_unsent_one():
    c = TieredCache(2, 10, eager=False)
    running = c.submit(list("ab"))
    answered = c.submit(list("cd"))
    unsent = c.submit(list("ef"))
    assert answered.hits is None and unsent.hits is None
    c.settle(answered)  # the server answered it, so it ran: admitted now, out of turn
    assert answered.hits == 0 and list(c.waiting) == [unsent]
    c.finish(unsent)  # cancelled before the server took it: leaves the queue, no lookup
    assert unsent.hits is None and not c.waiting
    c.finish(running)
    c.finish(answered)
    assert c.gpu.held == 0


def test_unknown_pool_tracks_nothing():
    c = TieredCache(None, 10)
    assert c.submit(list("abc")) is None and c.acquire(list("abc")) is None
