"""What the twin glue scripts (lazy_tier_twin.py, scheduler_twin.py) print of vLLM's pools. Run by
the vLLM venv's python, which finds this file beside them; it imports nothing of vLLM's."""
from __future__ import annotations


def free_queue(pool, name) -> list[str]:
    """A vLLM BlockPool's free queue, eviction end first, each block as `name(block)`."""
    return [name(b) for b in pool.free_block_queue.get_all_free_blocks()]


def tier_order(cpu, name) -> list[str]:
    """SimpleCPUOffload's CPU BlockPool: its cached free blocks in eviction order, then its pinned
    cached ones (each content's first copy) sorted, each block as `name(block)`."""
    free = [name(b) for b in cpu.free_block_queue.get_all_free_blocks()
            if b.block_hash is not None and not b.is_null]
    pinned = sorted(name(b) for b in cpu.blocks
                    if b.ref_cnt > 0 and not b.is_null and b.block_hash is not None
                    and cpu.cached_block_hash_to_block.get_one_block(b.block_hash) is b)
    return free + pinned
