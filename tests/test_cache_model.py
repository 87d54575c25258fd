"""The prefix-cache model (agentx.prefix_cache): vLLM's eviction order, worked by hand.

vLLM v1 frees a finished request's blocks tail first onto the end of its free queue and
evicts from the front (vllm/v1/core/block_pool.py, single_type_kv_cache_manager.py `free`),
so a prompt's head outlives its tail. tests/test_vllm_cache.py checks the same model against
a real vLLM's prefix_cache_hits counter.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentx.prefix_cache import PrefixCache
from agentx.trace.load import load_traces
from agentx.trace.shape import _replay_order, lru_hit_rate
from helpers import write_trace


def test_growing_prompt_keeps_its_head_when_the_pool_is_one_block_short():
    """abcd then abcde with room for 3: after abcd the free queue is d,c,b,a (tail first), the
    4th block evicts d, so abcde hits a,b,c. (An LRU that refreshes head to tail would have
    evicted a and hit nothing.)"""
    c = PrefixCache(3)
    assert c.observe(list("abcd")) == 0
    assert c.eviction_order() == ["c", "b", "a"]
    assert c.observe(list("abcde")) == 3
    assert c.eviction_order() == ["c", "b", "a"]  # e and d, its tail, went first again
    assert c.evictions == 3


def test_eviction_order_is_least_recently_freed_tail_first():
    c = PrefixCache(4)
    c.observe(["a", "b"])
    c.observe(["x", "y"])
    assert c.eviction_order() == ["b", "a", "y", "x"]
    c.observe(["a"])  # a hit refreshes a alone
    assert c.eviction_order() == ["b", "y", "x", "a"]
    c.observe(["n"])  # one new block: b, the least recently freed, goes
    assert c.eviction_order() == ["y", "x", "a", "n"]
    assert c.observe(["a", "b"]) == 1
    assert c.observe(["x", "y"]) == 1  # y was evicted by b, x survived as the older head


def test_limit_caps_the_hit_but_not_the_refresh():
    c = PrefixCache(10)
    c.observe([1, 2, 3])
    assert c.observe([1, 2, 3], limit=2) == 2  # vLLM recomputes the last token's block
    assert c.eviction_order() == [3, 2, 1]


def test_blocks_of_a_running_request_are_not_evicted():
    """Two overlapping requests: the first one's blocks are held, so the second must evict
    older free blocks; were the first released at send time, its tail would have gone."""
    c = PrefixCache(5)
    c.observe(["old1", "old2"])
    assert c.acquire(["a", "b", "c"]) == 0
    assert c.acquire(["x", "y"]) == 0  # 3 + 2 held = 5: both old blocks evicted
    assert c.eviction_order() == [] and len(c) == 5
    assert c.evictions == 2
    c.release(["x", "y"])
    c.release(["a", "b", "c"])
    assert c.eviction_order() == ["y", "x", "c", "b", "a"]
    assert c.observe(["a", "b", "c"]) == 3


def test_held_blocks_beyond_the_pool_evict_nothing_until_released():
    c = PrefixCache(2)
    c.acquire([1, 2, 3])  # vLLM would not schedule this; the model over-commits
    assert len(c) == 3 and c.evictions == 0
    c.release([1, 2, 3])
    assert c.eviction_order() == [2, 1]  # the tail went when the blocks were freed


def test_uncached_blocks_take_room_only_while_running():
    """The partial last block holds a slot while the request runs, then is reused first."""
    c = PrefixCache(4)
    c.observe(["p", "q"])
    assert c.acquire(["a", "b"], uncached=1) == 0  # 2 + 1 held: one of p, q must go
    assert c.eviction_order() == ["p"]
    c.release(["a", "b"], uncached=1)
    assert c.eviction_order() == ["p", "b", "a"]


def test_shared_blocks_are_freed_by_their_last_user():
    c = PrefixCache(3)
    c.acquire(["s", "a"])
    assert c.acquire(["s", "b"]) == 1
    c.release(["s", "a"])
    assert c.eviction_order() == ["a"]  # s is still held by the second request
    c.release(["s", "b"])
    assert c.eviction_order() == ["a", "b", "s"]


def test_unknown_capacity_tracks_nothing():
    c = PrefixCache(None)
    assert c.observe([1, 2]) is None
    assert c.acquire([1, 2]) is None
    c.release([1, 2])
    assert len(c) == 0 and c.evictions == 0


def test_zero_capacity_never_hits():
    c = PrefixCache(0)
    c.observe([1, 2])
    assert c.observe([1, 2]) == 0 and len(c) == 0


prompts = st.lists(st.lists(st.integers(0, 12), max_size=8), max_size=25)


@given(cap=st.integers(0, 10), seq=prompts)
@settings(max_examples=300, deadline=None)
def test_observe_fast_path_equals_acquire_then_release(cap, seq):
    """observe's shortcut (move-to-end, known prefix of the previous prompt) is exactly one
    request acquired and released with nothing else running."""
    fast, slow = PrefixCache(cap), PrefixCache(cap)
    for keys in seq:
        keys = list(dict.fromkeys(keys))  # a prompt's blocks are distinct (chained hashes)
        hit = slow.acquire(keys)
        slow.release(keys)
        assert fast.observe(keys) == hit
        assert fast.eviction_order() == slow.eviction_order()
    assert fast.evictions == slow.evictions


def test_trace_stats_and_the_engine_api_agree(tmp_path):
    """`agentx trace stats` (observe, integer keys) and the engine's acquire/release with its
    (namespace, id) tuple keys give the same hit tokens on a trace with subagents."""
    ts = load_traces(str(write_trace(tmp_path / "tr", sessions=4, turns=6, subagent_at=2)))
    total_in = sum(t.in_tokens for tr in ts.traces for _, t in _replay_order(tr))
    rates = set()
    for cap_tokens in (20 * 64, 45 * 64, 60 * 64, 10**6):
        engine = PrefixCache(cap_tokens // ts.block_size)
        hit_tok = 0
        for tr in ts.traces:
            for owner, turn in _replay_order(tr):
                keys = [(tr.id, h) for h in turn.hash_ids]  # local scope: per parent session
                hits = engine.acquire(keys)
                engine.release(keys)
                hit_tok += min(hits * owner.block_size, turn.in_tokens)
        rate = lru_hit_rate(ts, cap_tokens)
        assert rate == hit_tok / total_in
        rates.add(rate)
    assert len(rates) == 4  # each capacity keeps a different share: eviction matters
