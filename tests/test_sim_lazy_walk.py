"""SimpleCPUOffload's lazy store as vLLM 0.24.0 does it (sim/offload.py `OffloadTier.walk`,
`--offload-store-walk`): each step a walk over the GPU free queue takes the not-yet-stored blocks
out of the queue until their copy to the CPU completes, then frees them to the queue's tail; the
copied hashes become tier hits only then. The held blocks are not free, so a request that would
have grown into them is preempted."""
from __future__ import annotations

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.engine import SimEngine
from agentx.sim.kvcache import BlockPool
from agentx.sim.offload import OffloadTier, lazy_target_blocks
from agentx.sim.request import SimRequest

BS = 16


def test_walk_holds_blocks_until_their_copy_completes_then_frees_them_to_the_tail():
    """10 cached free blocks (queue 9..0), a walk of 4 per step, each copy 1 s per 4 blocks on
    one stream: free blocks drop by what each walk touched while copies are in flight, nothing is
    a tier hit before its copy ends, a finished copy is seen by the next step's poll and reported
    in that step's output, and a reported store comes back at the tail in walk order after the
    following schedule's walk (asynchronous scheduling): 4 schedules after its own walk, as the
    H200's probe saw for most stores (tests/data/h200-runs-7 and -8, `store_held`)."""
    pool = BlockPool(10, BS)
    hashes = list(range(100, 110))
    blocks = pool.allocate(10)
    for b, h in zip(blocks, hashes):
        pool.commit(b, h)
    pool.release(blocks)  # tail first: the queue is 9, 8, ..., 0
    tier = OffloadTier(100, BS, eager=False, walk_target=4, store_seconds=lambda tokens: tokens / 64)
    assert pool.free_blocks() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]

    tier.walk(pool)  # schedule 1
    assert pool.num_free == 6 and pool.free_blocks() == [5, 4, 3, 2, 1, 0]
    tier.launch(end=0.0)  # copy of 4 blocks: 0.0 .. 1.0
    assert tier.match(hashes[::-1], 10) == 0
    tier.walk(pool)  # schedule 2: the cursor (block 6) is held, so the walk restarts at the head
    tier.release_completed(pool)
    assert pool.num_free == 2
    tier.launch(end=0.5)  # queued behind the first: 1.0 .. 2.0
    tier.walk(pool)  # schedule 3
    tier.release_completed(pool)
    assert pool.num_free == 0 and tier.held_blocks == 10
    tier.launch(end=1.0)  # the first copy is done: the next step's poll sees it
    assert not tier._reported and tier.completed
    tier.walk(pool)  # schedule 4: nothing free to walk
    tier.release_completed(pool)  # nothing reported yet: the poll's step has not run
    assert pool.num_free == 0 and tier.match([109, 108, 107, 106], 4) == 0
    tier.launch(end=1.5)  # step 4 ran: its output reports the first copy
    tier.walk(pool)  # schedule 5
    tier.release_completed(pool)  # step 4's output: the first store completes
    assert pool.free_blocks() == [9, 8, 7, 6]
    assert tier.match([109, 108, 107, 106, 105], 5) == 4 and tier.stored_blocks == 4
    tier.walk(pool)  # the stored blocks are covered, not touched again
    assert pool.num_free == 4 and tier.held_blocks == 6


def test_walk_continues_from_its_cursor_and_skips_stored_and_unhashed_blocks():
    """The walk covers `walk_target` free blocks per step whether it copies them or not, and the
    next step goes on after the last block covered while that block is still free."""
    pool = BlockPool(12, BS)
    blocks = pool.allocate(12)
    for b in blocks[:6]:
        pool.commit(b, 1000 + b)
    pool.release(blocks)  # unhashed 6..11 to the front, then hashed 5..0
    tier = OffloadTier(100, BS, eager=False, walk_target=4, store_seconds=lambda tokens: 1.0)
    tier.walk(pool)  # covers 4 unhashed blocks: nothing to copy
    assert pool.num_free == 12 and tier.held_blocks == 0
    tier.walk(pool)  # 2 more unhashed, then blocks 5 and 4
    assert tier.held_blocks == 2 and pool.num_free == 10
    assert pool.ref[5] == 1 and pool.ref[4] == 1


def _engine(walk: bool, copy_s: float) -> SimEngine:
    cfg = SimConfig(profile="cpu-tiny", kv_pool_tokens=64 * BS, block_size=BS)
    b = build_engine(cfg)
    tier = OffloadTier(1000, BS, eager=False, walk_target=lazy_target_blocks(8192, BS) if walk else 0,
                       store_seconds=lambda tokens: copy_s)
    eng = SimEngine(num_blocks=64, block_size=BS, max_num_seqs=8, max_batched_tokens=8192,
                    timing=b.timing, stats=b.stats, offload=tier)
    eng.use_virtual_clock()
    return eng


def _serve(eng: SimEngine) -> tuple[SimRequest, SimRequest]:
    """A: 40 cached blocks, done after one token; B: 8 blocks growing to 27 by decoding. Both fit
    the 64-block pool, B's growth only if A's freed blocks can be reused."""
    a = SimRequest(rid="a", prompt_len=40 * BS, max_tokens=1, block_hashes=list(range(1, 41)))
    b = SimRequest(rid="b", prompt_len=8 * BS, max_tokens=300, block_hashes=list(range(101, 109)))
    eng.submit(a)
    eng.submit(b)
    for _ in range(10_000):
        if not eng.step_offline():
            break
    return a, b


def test_blocks_held_by_slow_stores_preempt_a_growing_request():
    """With the walk and a 10 s copy, A's 40 freed blocks are held while B decodes: B cannot grow
    into them, is preempted, and finishes after the copy; without the walk (store on eviction)
    or with a fast copy nobody is preempted. A's blocks end up in the tier either way they are
    copied."""
    a, b = _serve(eng := _engine(walk=True, copy_s=10.0))
    assert a.finish == b.finish == "length"
    assert b.preemptions >= 1 and eng.stats.num_preemptions == b.preemptions
    assert eng.offload.match(list(range(1, 41)), 40) == 40
    assert b.last_token_ns > 10e9  # waited for the copy
    for walk, copy_s in ((False, 10.0), (True, 1e-4)):
        a, b = _serve(eng := _engine(walk=walk, copy_s=copy_s))
        assert b.finish == "length" and b.preemptions == 0


def test_switch_wires_the_target_and_the_measured_store_rate():
    """--offload-store-walk: the walk covers 2 x ceil(max_num_batched_tokens / block_size)
    blocks (vLLM 0.24 `_estimate_lazy_target_blocks`) and copies at the profile's measured store
    rate; off (the default) it is the store on eviction."""
    cfg = SimConfig(profile="h200-qwen3-8b-bf16", kv_offload="simple-cpu", offload_gb=8)
    assert build_engine(cfg).engine.offload.walk_target == 0
    b = build_engine(cfg.model_copy(update={"offload_store_walk": True}))
    assert b.engine.offload.walk_target == 2 * -(-b.res.max_num_batched_tokens // b.res.block_size)
    gbps = b.res.profile.calibration.offload_store_gbps["simple-cpu"]
    assert b.timing.store_seconds(1000) == 1000 * b.timing.kv_tok / (gbps * 1e9)


def test_allocator_taking_blocks_the_walk_has_not_reached_counts_them_lost():
    """A cached GPU block the allocator takes before any walk stored it is gone from both tiers
    (what bench/stepprobe counts as `gpu_evicted_unstored` on the real server); one the walk
    stored first is only gone from the GPU. With `fates` the tier records the last thing done to
    each content: walked, stored, evicted from the GPU without a copy, evicted from the tier."""
    pool = BlockPool(6, BS)
    tier = OffloadTier(3, BS, eager=False, walk_target=2, store_seconds=lambda tokens: 0.0)
    tier.fates = {}  # follow each block's content (bench/tier_breaks.py)
    pool.on_evict = tier.on_gpu_evict
    blocks = pool.allocate(6)
    for b, h in zip(blocks, range(200, 206)):
        pool.commit(b, h)
    pool.release(blocks)  # queue 5, 4, ..., 0: hashes 205 .. 200
    tier.walk(pool)  # stores blocks 5 and 4 (hashes 205, 204)
    assert tier.fates == {205: "store in flight", 204: "store in flight"}
    for end in (0.0, 0.0, 0.0):  # polled, reported, then freed after the next schedule
        tier.launch(end=end)
    tier.release_completed(pool)
    assert tier.match([205], 1) == 1 and tier.match([204], 1) == 1
    assert pool.free_blocks() == [3, 2, 1, 0, 5, 4]
    pool.allocate(5)  # takes 3, 2, 1, 0 (never walked) and 5 (stored)
    assert (tier.gpu_evicted, tier.gpu_evicted_unstored) == (5, 4)
    tier.store_many([300, 301])  # a 3-block tier: its least recently stored (205) makes room
    assert tier.fates == {**dict.fromkeys((203, 202, 201, 200), "gpu-evicted without a CPU copy"),
                          205: "cpu-evicted", 204: "stored", 300: "stored", 301: "stored"}
