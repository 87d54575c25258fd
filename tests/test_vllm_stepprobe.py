"""bench/stepprobe's block counters and content fates on vLLM's own BlockPool (the vLLM CPU venv).

On the H200 the probe runs inside vLLM 0.24's engine core; here it wraps the BlockPool of the CPU
venv's vLLM, whose `_maybe_evict_cached_block`, `cached_block_hash_to_block` and block hashes
(BlockHashWithGroupId) are the ones it reads there. The SimpleCPUOffload manager is a stand-in
holding the two pools (what `bind_gpu_block_pool` hands the probe), so this checks the probe's
reading of the pools, not the connector."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

PROBE = Path(__file__).resolve().parents[1] / "bench" / "stepprobe"

SCRIPT = r'''
import json
import sitecustomize as probe
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

gpu, cpu = BlockPool(8, True, 16), BlockPool(8, True, 16)

class Manager:  # what the probe reads of SimpleCPUOffload's scheduler-side manager
    _cursor = None
    hash_block_size = 16

mgr = Manager()
mgr._gpu_block_pool, mgr.cpu_block_pool = gpu, cpu
probe._bind(mgr)
raw = [BlockHash(bytes([i]) * 32) for i in range(4)]
keys = [make_block_hash_with_group_id(h, 0) for h in raw]
blocks = gpu.get_new_blocks(4)
for b, k in zip(blocks, keys):
    b._block_hash = k
    gpu.cached_block_hash_to_block.insert(k, b)

class Meta:  # a lazy walk's store: blocks 0, 1, 2
    store_gpu_blocks = [b.block_id for b in blocks[:3]]

probe._walked(Meta, 0.0, (mgr,), 0.0)
copies = cpu.get_new_blocks(2)  # the copies of 0 and 1 complete; 2's is still in flight
for c, k in zip(copies, keys):
    c._block_hash = k
    cpu.cached_block_hash_to_block.insert(k, c)
probe._stored(mgr, [b.block_id for b in blocks[:2]], [c.block_id for c in copies])
cpu.free_blocks(copies)
gpu.free_blocks([blocks[1], blocks[3]])  # 1 (stored) and 3 (never walked) become evictable
gpu.get_new_blocks(gpu.get_num_free_blocks())  # evicts 1 (a CPU copy exists) and 3 (none)
cpu.get_new_blocks(cpu.get_num_free_blocks())  # evicts the CPU copies of 0 and 1


class Request:
    request_id = "cmpl-s-1-0-abcd1234"
    num_tokens = 16 * 6
    block_hashes = raw + [BlockHash(b"n" * 32)]

for gpu_hit, tier_hit in ((0, 0), (16, 0), (32, 0), (48, 0), (64, 0), (64, 16)):
    probe._looked_up((tier_hit, True), 0.0, (mgr, Request, gpu_hit), 0.0)
print(json.dumps({"moves": probe.LOG.moves,
                  "stops": [(r["gpu"], r["hit"], r["stop"]) for r in probe.LOG.rows]}))
'''


def test_probe_counts_evictions_and_follows_content_on_vllms_block_pool(vllm_python, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROBE), "AGENTX_STEPLOG": str(tmp_path),
           "AGENTX_STEPLOG_FATES": "1"}
    p = subprocess.run([str(vllm_python), "-c", SCRIPT], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # GPU: 1 and 3 evicted, 3 with no CPU copy; CPU: the copies of 0 and 1
    assert out["moves"] == {"gpu_evicted": 2, "gpu_evicted_unstored": 1, "cpu_evicted": 2}
    assert [tuple(s) for s in out["stops"]] == [
        (0, 0, "cpu-evicted"),  # 0: stored, then its CPU copy evicted (its GPU block still holds it)
        (16, 0, "cpu-evicted"),  # 1: its GPU block evicted while the CPU held it, then the CPU's
        (32, 0, "store in flight"),  # 2: walked, its copy not complete
        (48, 0, "gpu-evicted without a CPU copy"),  # 3: never walked
        (64, 0, "new content"),  # 4: no request computed it
        (64, 16, "whole"),  # 5 blocks found of the 5 a 96-token prompt may hit
    ]
