"""vLLM's side of tests/test_vllm_scheduler_twin.py, run by the vLLM venv's python: vLLM's own
AsyncScheduler with the SimpleCPUOffloadConnector (lazy) and its KVCacheManager, driven the way
`EngineCore.step_with_batch_queue` drives them with a batch queue of 2 (schedule k, then process
step k-1's output), with no model. The model runner samples one token for each request whose
scheduled tokens reach the end of its sequence (`is_prefill_chunk` false); the worker reports a
load admitted in schedule s in step s+1's output and a store walked in schedule k in step k+2's
output, as the simulator's pipeline has them with copies shorter than a step
(sim/sched.py `_loaded`, sim/offload.py `launch`). Loads that finish in one step are reported in
admission order (vLLM's `finished_recving` is a set: its order is arbitrary).

Case on stdin: {"bs", "pool", "cpu", "batch", "max_seqs", "model" (a directory with a config.json),
"requests": {rid: {"tokens", "labels" (per full prompt block), "out" (max_tokens)}},
"schedules": [[["arrive", rid], ...], ...], "defer": whether a preempted request's blocks are
deferred as vLLM 0.24 does}. Per schedule it prints the scheduled requests
{rid: [first token, tokens]}, the loads it started {rid: tokens computed with the load}, the
requests it preempted, those finished in the output processed after it, the GPU free queue
(eviction end first) and the tier (evictable blocks in eviction order, then the pinned ones
sorted): a block by its label, `RID.oJ` for block J past the prompt of request RID, "-" uncached.
"""

import json
import sys
from collections import deque

import torch
from pool_view import free_queue, tier_order  # beside this script
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata
from vllm.v1.structured_output import StructuredOutputManager

case = json.load(sys.stdin)
BS, POOL, CPU, BATCH, SEQS = case["bs"], case["pool"], case["cpu"], case["batch"], case["max_seqs"]
PAGE = 1024
MAX_LEN = 1 << 14
mc = ModelConfig(model=case["model"], skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_LEN, seed=0)
sc = SchedulerConfig(max_num_seqs=SEQS, max_num_batched_tokens=BATCH, max_model_len=MAX_LEN,
                     enable_chunked_prefill=True, async_scheduling=True, is_encoder_decoder=False)
cc = CacheConfig(block_size=BS, enable_prefix_caching=True)
extra = {"cpu_bytes_to_use": (CPU + 1) * PAGE, "lazy_offload": True}
kt = KVTransferConfig(kv_connector="SimpleCPUOffloadConnector", kv_role="kv_both",
                      kv_connector_extra_config=extra) if CPU else None
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt)
spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
kcc = KVCacheConfig(num_blocks=POOL + 1,
                    kv_cache_tensors=[KVCacheTensor(size=(POOL + 1) * PAGE, layers=["layer"],
                                                    layer_stride=PAGE, block_stride=PAGE)],
                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
cc.num_gpu_blocks = POOL + 1
sched = AsyncScheduler(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
                       block_size=BS)
sched.defer_block_free = bool(case.get("defer"))
if sched.defer_block_free:
    # vLLM 0.24, the real runs' version, preempts a request whose blocks it must defer and goes on
    # preempting (the bursts sim/sched.py models); 0.32 stops there instead (the running loop's
    # `if not self._request_blocks_can_be_freed(preempted_req): break`). The check answers yes
    # to the running loop only; the deferral itself (`_free_request_blocks`, its fences) is
    # 0.24's and 0.32's alike.
    can_be_freed = sched._request_blocks_can_be_freed

    def _can_be_freed_024(request):
        return sys._getframe(1).f_code.co_name == "schedule" or can_be_freed(request)

    sched._request_blocks_can_be_freed = _can_be_freed_024
init_none_hash(sha256)
hasher = get_request_block_hasher(BS, sha256)
reqs = {rid: Request(rid, c["tokens"], SamplingParams(max_tokens=c["out"], ignore_eos=True), None, block_hasher=hasher)
        for rid, c in case["requests"].items()}
label = {}
for rid, r in reqs.items():
    label.update(zip(r.block_hashes, case["requests"][rid]["labels"]))
tier = sched.connector.scheduler_manager if sched.connector is not None else None


def relabel():
    """Label the blocks past each prompt (its tail and the output) once vLLM has hashed them."""
    for rid, r in reqs.items():
        n = len(case["requests"][rid]["labels"])
        for j, h in enumerate(r.block_hashes[n:], n):
            label.setdefault(h, f"{rid}.o{j}")


def name(block):
    """The case's label of a block's content ("-": uncached)."""
    return "-" if block.block_hash is None else label.get(get_block_hash(block.block_hash), "+")


def state():
    return (free_queue(sched.kv_cache_manager.block_pool, name),
            tier_order(tier.cpu_block_pool, name) if tier is not None else [])


batches = deque()  # (schedule index, output, requests that sample a token)
loads_at, stores_at = {}, {}  # schedule -> load request ids / store event
for k, ops in enumerate(case["schedules"]):
    for op in ops:
        if op[0] == "arrive":
            sched.add_request(reqs[op[1]])
    loading_before = {rid for rid, r in sched.requests.items() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS}
    npre = {rid: r.num_preemptions for rid, r in sched.requests.items()}
    so = sched.schedule()
    pre = sorted(rid for rid, r in sched.requests.items() if r.num_preemptions != npre.get(rid, 0))
    sampled = [rid for rid in so.num_scheduled_tokens if not sched.requests[rid].is_prefill_chunk]
    batches.append((k, so, sampled))
    loads = {rid: sched.requests[rid].num_computed_tokens for rid, r in sched.requests.items()
             if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in loading_before}
    loads_at[k] = dict.fromkeys(loads).keys()  # admission order (vLLM's is a set's: arbitrary)
    meta = so.kv_connector_metadata
    stores_at[k] = getattr(meta, "store_event", -1) if meta is not None else -1
    scheduled = {rid: [sched.requests[rid].num_computed_tokens - n, n] for rid, n in so.num_scheduled_tokens.items()}
    finished = []
    if len(batches) == 2:  # the batch queue is full: the oldest step's output is processed
        j, old, smp = batches.popleft()
        kvo = None
        if tier is not None:
            ev = stores_at.get(j - 2, -1)
            done = SimpleCPUOffloadWorkerMetadata({ev: 1}) if ev >= 0 else None
            kvo = KVConnectorOutput(finished_recving=loads_at.get(j - 1) or None,
                                    kv_connector_worker_meta=done)
        ids = list(old.num_scheduled_tokens)
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[7] if r in smp else [] for r in ids], kv_connector_output=kvo)
        for outs in sched.update_from_output(old, out).values():
            finished += [o.request_id for o in outs.outputs if o.finish_reason is not None]
    relabel()
    queue, cpu = state()
    print(json.dumps({"empty": not so.num_scheduled_tokens, "scheduled": scheduled, "loads": loads, "preempted": pre,
                      "finished": sorted(finished), "queue": queue, "cpu": cpu}), flush=True)
