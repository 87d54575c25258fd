"""The simulator's whole scheduler against vLLM's own, schedule by schedule.

tests/test_vllm_lazy_tier.py checks the pool and the tier on the waiting queue's decisions alone.
Here the simulated engine runs whole steps (`Scheduler._schedule`, then `SimEngine._apply`: the
running loop with decodes and chunked prefills, preemption, admission, loads, the lazy walk and
the output blocks cached), and the same arrivals go to vLLM's AsyncScheduler with its
SimpleCPUOffloadConnector (tests/vllm_env/scheduler_twin.py, which says how it stands in for the
engine core, the model runner and the worker). Each engine decides for itself when a request has
its `max_tokens`; the sessions' next turns arrive a few schedules after the simulator finishes
their last one, so the two get the same arrivals only while they agree. After every schedule the
scheduled requests with their tokens, the loads started, the preemptions, the GPU free queue and
the tier's eviction order must be the same, up to the first schedule that schedules nothing
(vLLM's engine core polls the transfers with empty steps; the simulator jumps to the next
transfer's end) or the case's end.

Each seed runs twice: without deferring a preempted request's blocks, and with it as vLLM 0.24
does (a KV connector with asynchronous scheduling on a GPU: the blocks of a request the step in
flight ran come back after the next schedule, and the running loop goes on preempting: the
bursts measured on the H200, which sim/sched.py models). vLLM 0.32 stops its running loop at a
request whose blocks it would have to defer instead; the glue gives that one check 0.24's
answer and leaves the deferral itself (`_free_request_blocks` and its fences, the same in both
versions) to vLLM.
"""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.request import SimRequest
from vllm_env.sessions import GrowingSessions

pytestmark = pytest.mark.vllm

BS, POOL, CPU, BATCH, SEQS = 16, 64, 48, 64, 8  # block, GPU blocks, tier blocks, budget, seqs
TWIN = Path(__file__).parent / "vllm_env" / "scheduler_twin.py"
# the smallest model config vLLM's ModelConfig accepts: nothing is loaded or run
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": 65536,
         "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}


def run_sim(seed: int, schedules: int, defer: bool = False):
    """Five sessions growing their prompts from a shared two-block system prompt, 1-40 output
    tokens a turn, the next turn 0-3 schedules after the last one finished, through the
    simulated engine on a step of fixed length (copies shorter than a step), deferring a
    preempted request's blocks or not (`defer`). Returns the case for vLLM and the simulator's
    per-schedule states."""
    rng = random.Random(seed)
    gen = GrowingSessions(rng, BS)
    case_reqs: dict[str, dict] = {}
    out_label: dict[int, str] = {}  # an output block's hash -> RID.oJ

    def next_request(s: int) -> str:
        rid, toks, labels = gen.next_request(s)
        case_reqs[rid] = {"tokens": toks, "labels": labels, "out": rng.randint(1, 40)}
        return rid

    def label(h) -> str:
        return "-" if h is None else h if isinstance(h, str) else out_label.get(h, "+")

    eng = build_engine(SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=POOL * BS,
                                 kv_offload="simple-cpu", offload_store_walk=True, block_size=BS,
                                 max_num_batched_tokens=BATCH, max_num_seqs=SEQS)).engine
    pool, tier = eng.pool, eng.offload
    assert pool.num_blocks == POOL
    tier.capacity = CPU
    tier.store_seconds = lambda tokens: 0.5
    eng.timing.copy_seconds = lambda tokens: 0.1
    eng._step_seconds = lambda batch, start, scale=None: 1.0
    eng.use_virtual_clock()
    eng.defer_free = defer
    reqs: dict[str, SimRequest] = {}
    live = {gen.new_session(): None for _ in range(5)}
    idle = {s: i for i, s in enumerate(live)}
    ops_all, states = [], []
    preemptions: dict[str, int] = {}
    t = 0.0
    for _ in range(schedules):
        ops = []
        for s in list(live):
            rid = live[s]
            if rid is not None and reqs[rid].finish is not None:
                live[s], idle[s] = None, rng.randint(0, 3)
                if gen.tokens(s) > 24 * BS:
                    del live[s], idle[s]
                    s = gen.new_session()
                    live[s], idle[s] = None, rng.randint(0, 3)
        for s in live:
            if live[s] is None and idle[s] == 0:
                rid = live[s] = next_request(s)
                ops.append(["arrive", rid])
                reqs[rid] = SimRequest(rid=rid, prompt_len=len(case_reqs[rid]["tokens"]),
                                       max_tokens=case_reqs[rid]["out"],
                                       block_hashes=list(case_reqs[rid]["labels"]))
                eng.submit(reqs[rid])
            elif live[s] is None:
                idle[s] -= 1
        ops_all.append(ops)
        loading_before = set(map(id, eng.loading))
        done_before = {r.rid for r in reqs.values() if r.finish is not None}
        batch = eng._schedule(t)
        state = {"empty": batch.empty,
                 "scheduled": {r.rid: [start, n] for r, start, n, _ in batch.items},
                 "loads": {r.rid: (r.num_computed // BS + len(r.tier_pin)) * BS
                           for r in eng.loading if id(r) not in loading_before},
                 "preempted": sorted(r.rid for r in reqs.values() if r.preemptions != preemptions.get(r.rid, 0))}
        preemptions = {r.rid: r.preemptions for r in reqs.values()}
        if not batch.empty:
            t += 1.0
            eng._step_ended(t, 1.0)
            eng._apply(batch)
            if eng.loading:
                eng._finish_loads(t)
        for r in reqs.values():
            for j, h in enumerate(r.block_hashes):
                if not isinstance(h, str):
                    out_label[h] = f"{r.rid}.o{j}"
        state["finished"] = sorted(r.rid for r in reqs.values() if r.finish is not None and r.rid not in done_before)
        state["queue"] = [label(pool.bhash[b]) for b in pool.free_blocks()]
        state["cpu"] = ([label(h) for h in tier.blocks if h not in tier.pins]
                        + sorted(label(h) for h in tier.blocks if h in tier.pins))
        states.append(state)
        if batch.empty:
            break
    case = {"bs": BS, "pool": POOL, "cpu": CPU, "batch": BATCH, "max_seqs": SEQS,
            "requests": case_reqs, "schedules": ops_all, "defer": defer}
    return case, states


@pytest.mark.parametrize(("seed", "defer"), [(1, False), (5, False), (8, False), (1, True), (5, True),
                                            (7, True)], ids=lambda v: str(v).lower())
def test_the_simulated_engine_schedules_as_vllm_schedule_by_schedule(vllm_python, tmp_path, seed, defer):
    case, sim = run_sim(seed, 300, defer)
    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    case["model"] = str(tmp_path)
    p = subprocess.run([str(vllm_python), str(TWIN)], input=json.dumps(case), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    real = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(real) == len(sim)
    compared = 0
    for k, (r, s) in enumerate(zip(real, sim)):
        if r["empty"] or s["empty"]:
            break
        for key in ("scheduled", "loads", "preempted", "queue", "cpu"):
            assert s[key] == r[key], (f"schedule {k}, {key}: ops {case['schedules'][k]}\n"
                                      f"vLLM {r[key]}\nsim  {s[key]}")
        compared += 1
    assert compared >= 180, compared
    seen = sim[:compared]
    # the case exercised what it is for: preemptions, loads from the tier, output blocks cached
    assert sum(len(s["preempted"]) for s in seen) >= 3
    assert sum(len(s["loads"]) for s in seen) >= 5
    assert any(".o" in b for s in seen for b in s["queue"] + s["cpu"])
