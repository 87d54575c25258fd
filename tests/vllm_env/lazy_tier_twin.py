"""vLLM's side of tests/test_vllm_lazy_tier.py, run by the vLLM venv's python: vLLM's own
KVCacheManager and SimpleCPUOffloadScheduler (lazy mode) driven through a list of schedules, with
no engine and no model. Reads the case as JSON on stdin, prints one JSON line per schedule.

The glue is the waiting-queue branch of vLLM's `Scheduler.schedule` reduced to what the pool and
the tier see: requests whose load finished first (they hold blocks), then the waiting queue in
order, each looked up on the GPU (`get_computed_blocks`) and in the tier
(`get_num_new_matched_tokens`), admitted by `allocate_slots(..., full_sequence_must_fit=True)`
(a load: no new tokens, `delay_cache_blocks`, the in-flight prefills' blocks reserved), the first
that does not fit stopping admission; then `build_connector_meta` (the lazy walk) at the end of
the schedule; a store walked in schedule k completes after schedule k + 3's walk, as the
simulator's pipeline has it (`OffloadTier.launch`). A request that is computed is computed whole
at once (its blocks are cached at allocation, as vLLM does), and finishes when the case says.

Case: {"bs", "pool", "cpu", "batch", "prompts": {rid: [tokens]}, "labels": {rid: [label per full
block]}, "schedules": [[op, ...], ...]}, op one of ["arrive", rid], ["finish", rid], ["loaded"]
(every load in flight completes). Per schedule it prints the admissions [rid, GPU hit tokens,
tier hit tokens], the GPU free queue (eviction end first: a block's label, "-" without one) and
the tier's blocks (evictable ones in eviction order, then the pinned ones sorted).
"""
import json
import sys
from types import SimpleNamespace

import torch
from pool_view import free_queue, tier_order  # beside this script
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.simple_kv_offload.manager import SimpleCPUOffloadScheduler
from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

case = json.load(sys.stdin)
BS, POOL, CPU, BATCH = case["bs"], case["pool"], case["cpu"], case["batch"]
PAGE = 1024  # bytes a block, any: only the GPU/CPU ratio sizes the tier
init_none_hash(sha256)
hasher = get_request_block_hasher(BS, sha256)
spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
config = KVCacheConfig(  # + 1: vLLM's null block, in the GPU pool and in the tier's
    num_blocks=POOL + 1,
    kv_cache_tensors=[KVCacheTensor(size=(POOL + 1) * PAGE, layers=["layer"], layer_stride=PAGE,
                                   block_stride=PAGE)],
    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
)
MAX_LEN = 1 << 16
mgr = KVCacheManager(config, max_model_len=MAX_LEN, scheduler_block_size=BS, hash_block_size=BS)
vllm_config = SimpleNamespace(
    kv_events_config=None,
    parallel_config=SimpleNamespace(decode_context_parallel_size=1, world_size=1),
    speculative_config=None,
    model_config=SimpleNamespace(max_model_len=MAX_LEN),
    scheduler_config=SimpleNamespace(max_num_batched_tokens=BATCH),
    max_in_flight_tokens=BATCH,
    num_prefill_lookahead_tokens=0,
)
tier = SimpleCPUOffloadScheduler(vllm_config, config, cpu_capacity_bytes=(CPU + 1) * PAGE,
                                 scheduler_block_size=BS, hash_block_size=BS, lazy_offload=True)
tier.bind_gpu_block_pool(mgr.block_pool)

requests = {rid: Request(rid, toks, SamplingParams(max_tokens=1), None, block_hasher=hasher)
            for rid, toks in case["prompts"].items()}
label = {}  # vLLM block hash -> the case's label of that content
for rid, r in requests.items():
    label.update(zip(r.block_hashes, case["labels"][rid]))

waiting, loading, holding, running = [], [], [], set()
walked = []  # store event of each schedule (-1: none)


def blocks_of(r):
    return mgr.get_blocks(r.request_id).blocks[0]


def missing(r):
    """Blocks `r` still lacks for its whole prompt."""
    return max(0, -(-r.num_tokens // BS) - len(blocks_of(r)))


def admit():
    out = []
    while holding or waiting:
        queue = holding or waiting
        r = queue[0]
        if queue is holding:  # its load finished: allocate the rest of the prompt
            if mgr.allocate_slots(r, r.num_tokens - r.num_computed_tokens,
                                  full_sequence_must_fit=True) is None:
                break
        else:
            hits, n = mgr.get_computed_blocks(r)[:2]
            ext, _ = tier.get_num_new_matched_tokens(r, n)
            ext = ext or 0
            reserved = sum(missing(q) for q in loading + holding) if ext else 0
            new = mgr.allocate_slots(r, 0 if ext else r.num_tokens - n, n, hits,
                                     num_external_computed_tokens=ext, delay_cache_blocks=bool(ext),
                                     full_sequence_must_fit=True, reserved_blocks=reserved)
            if new is None:
                break
            tier.update_state_after_alloc(r, mgr.get_blocks(r.request_id), ext)
            out.append([r.request_id, n, ext])
            if ext:
                r.num_computed_tokens = n + ext
                waiting.pop(0)
                loading.append(r)
                continue
        queue.pop(0)
        r.num_computed_tokens = r.num_tokens
        running.add(r.request_id)
    return out


def name(block):
    """The case's label of a block's content ("-": none, or content the case did not name)."""
    return "-" if block.block_hash is None else label.get(get_block_hash(block.block_hash), "-")


def state():
    return free_queue(mgr.block_pool, name), tier_order(tier.cpu_block_pool, name)


for k, ops in enumerate(case["schedules"]):
    for op in ops:
        if op[0] == "arrive":
            waiting.append(requests[op[1]])
        elif op[0] == "finish" and op[1] in running:
            running.discard(op[1])
            r = requests[op[1]]
            mgr.free(r)
            tier.request_finished(r, [])
        elif op[0] == "loaded" and loading:
            for r in loading:  # one by one in admission order: vLLM's is a set's
                tier.update_connector_output(KVConnectorOutput(finished_recving={r.request_id}))
            for r in loading:
                mgr.cache_blocks(r, r.num_computed_tokens)
            holding.extend(loading)
            loading.clear()
    admitted = admit()
    meta = tier.build_connector_meta(SimpleNamespace(preempted_req_ids=set()))
    walked.append(meta.store_event)
    if k >= 3 and walked[k - 3] >= 0:
        tier.update_connector_output(KVConnectorOutput(
            kv_connector_worker_meta=SimpleCPUOffloadWorkerMetadata({walked[k - 3]: 1})))
    queue, cpu = state()
    print(json.dumps({"admitted": admitted, "queue": queue, "cpu": cpu}))
