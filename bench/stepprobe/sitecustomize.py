"""Per-step timing probe for a real vLLM server (bench/connector_steps.py reads what it writes).

Put this folder first on the server's PYTHONPATH and set AGENTX_STEPLOG to a folder: every Python
process then imports this file at start-up (sitecustomize), and once vLLM's engine core, scheduler,
model runner and KV connector modules are imported it wraps, without changing what they do:

- `EngineCore.step` / `step_with_batch_queue`: one row per engine step (its start, end, and the
  batch the scheduler built for it: scheduled tokens, requests, new requests, decode requests,
  the tokens of the longest and of all scheduled contexts, and of the prefill chunks apart);
- `Scheduler.schedule`: its own time (it includes the connector's scheduler-side hooks);
- `GPUModelRunner.execute_model` / `sample_tokens`: one row per call, the worker's host-side time;
- each KV connector hook (SimpleCPUOffloadConnector, MooncakeStoreConnector): time summed by hook,
  into the step's row (scheduler side) or the model runner's row (worker side), and the blocks
  (SimpleCPUOffload) or tokens (Mooncake) the step's metadata asks to load and to store.

On vLLM 0.24.0 on the H200 (tests/data/h200-runs-5) no model-runner rows appeared (the worker
there does not run this GPUModelRunner method), so the worker-side hooks went unrecorded: their
cost is inside the engine steps' times, which is what bench/connector_steps.py compares.

With the scheduler's state (what the simulator has to reproduce under a full pool), each step row
also carries, after the schedule: the free GPU blocks (`free`), the running requests, those waiting
for a connector's load (`remote`), the requests preempted (`preempted`) and, for SimpleCPUOffload,
the GPU blocks held by stores and loads in flight (`store_held`, `load_held`), the loads pending and
the free CPU blocks; the new and resumed request ids. Per step, counted as they happen
(SimpleCPUOffload): the cached blocks the GPU pool's allocator evicted (`gpu_evicted`) and of those
the ones the CPU tier held no copy of (`gpu_evicted_unstored`: a lazy walk that did not reach them
in time; their content is gone from both tiers), the cached blocks the CPU pool evicted for new
stores (`cpu_evicted`), and the lazy walks that started from the free queue's head (`walk_head`: no
cursor, or it was taken). Event rows (`ev`) mark each request's arrival (`add`), each preemption
(with the tokens it had computed), each load the connector set up (its blocks) and saw finish
(`loaded`), and each request freed (with its preemptions).

With AGENTX_STEPLOG_FATES=1 as well, the probe follows each block's content (by its hash) through
the tiers, the last thing that happened to it: walked (its store in flight), stored, evicted from
the GPU without a CPU copy, evicted from the CPU; and each SimpleCPUOffload lookup writes a
`lookup` event: the request, the tokens found on the GPU (`gpu`) and in the tier (`hit`), and
`stop`, what became of the first block it did not find ("whole" when it found all it may).
bench/tier_breaks.py counts them against the simulator's. It costs a dict of every hash seen
(a few hundred thousand entries in a 150 s run).

Rows go to AGENTX_STEPLOG/steps-<pid>.jsonl, flushed every second by a daemon thread. Nothing here
raises into vLLM: a probe that fails only stops probing. Without AGENTX_STEPLOG it does nothing.
"""
from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("AGENTX_STEPLOG")
# the connector's scheduler-side hooks (summed into the engine step's row) and worker-side ones
# (summed into the model runner's row: the worker may live in another process)
SCHED_HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
               "update_connector_output", "request_finished", "request_finished_all_groups")
WORKER_HOOKS = ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                "get_finished", "build_connector_worker_meta", "handle_preemptions",
                "bind_connector_metadata", "clear_connector_metadata")
_CONNECTORS = {
    "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector":
        "SimpleCPUOffloadConnector",
    "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector":
        "MooncakeStoreConnector",
}


class _Log:
    """The current step's accumulators and the rows written so far (one per process)."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"steps-{os.getpid()}.jsonl")
        self.rows: list[dict] = []
        self.hooks: dict[str, float] = {}
        self.worker: dict[str, float] = {}
        self.moves: dict[str, int] = {}
        self.batch: dict = {}
        self.connector = ""
        self.lock = threading.Lock()

    def add_hook(self, name: str, dt: float) -> None:
        with self.lock:
            acc = self.worker if name in WORKER_HOOKS else self.hooks
            acc[name] = acc.get(name, 0.0) + dt

    def runner(self, t0: float, dt: float, fn: str) -> None:
        """One row per model-runner call, with the worker-side hooks run since the last one."""
        with self.lock:
            self.rows.append({"t0": round(t0, 6), "dt": round(dt, 6), "fn": fn,
                              "conn": self.connector,
                              "hooks": {k: round(v, 6) for k, v in self.worker.items()}})
            self.worker = {}

    def forked(self) -> None:
        """In a forked child: its own file, no parent's rows, its own flusher thread."""
        self.path = os.path.join(os.path.dirname(self.path), f"steps-{os.getpid()}.jsonl")
        self.rows, self.hooks, self.worker, self.moves, self.batch = [], {}, {}, {}, {}
        self.lock = threading.Lock()
        self.flush_every(1.0)

    def event(self, row: dict) -> None:
        with self.lock:
            self.rows.append({"t0": round(time.perf_counter(), 6), **row})

    def step(self, t0: float, t1: float, fn: str) -> None:
        with self.lock:
            row = {"t0": round(t0, 6), "dt": round(t1 - t0, 6), "fn": fn, "conn": self.connector,
                   **self.batch,
                   "hooks": {k: round(v, 6) for k, v in self.hooks.items()}, **self.moves}
            self.rows.append(row)
            self.hooks, self.moves, self.batch = {}, {}, {}

    def flush(self) -> None:
        with self.lock:
            rows, self.rows = self.rows, []
        if rows:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))

    def flush_every(self, seconds: float) -> None:
        """A daemon thread: the engine process may end by a signal, without atexit."""
        def loop() -> None:
            while True:
                time.sleep(seconds)
                try:
                    self.flush()
                except Exception:  # noqa: BLE001
                    return
        threading.Thread(target=loop, name="agentx-stepprobe", daemon=True).start()


LOG: _Log | None = None
_MGR = None  # the SimpleCPUOffload scheduler-side manager, once it binds the GPU pool
# AGENTX_STEPLOG_FATES: block hash (without its group id) -> the last thing done to its content
_FATES: dict | None = {} if os.environ.get("AGENTX_STEPLOG_FATES") == "1" else None


def _timed(cls, name: str, record) -> None:
    """Replace cls.name by a wrapper that times it and hands (result, dt, args) to record."""
    orig = cls.__dict__.get(name)
    if orig is None or getattr(orig, "_agentx_probe", False):
        return

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = orig(*args, **kwargs)
        try:
            record(out, time.perf_counter() - t0, args, t0)
        except Exception:  # noqa: BLE001 - the probe never breaks the server
            pass
        return out

    wrapper._agentx_probe = True
    setattr(cls, name, wrapper)


def _before(cls, name: str, record) -> None:
    """Replace cls.name by a wrapper that hands its arguments to record before it runs (the
    state the call is about to change)."""
    orig = cls.__dict__.get(name)
    if orig is None or getattr(orig, "_agentx_probe", False):
        return

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        try:
            record(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the probe never breaks the server
            pass
        return orig(*args, **kwargs)

    wrapper._agentx_probe = True
    setattr(cls, name, wrapper)


def _batch(so, scheduler) -> dict:
    """What the scheduler scheduled this step (vLLM's SchedulerOutput), and the context the
    scheduled requests had computed before it (attention reads it). The prefill chunks (requests
    scheduled more than one token) apart: their number, tokens, the context they start from, and
    their attention work sum(n x (start + n / 2)) (token pairs, over 2), so a step's time can be
    regressed on what its prefill and its decode each cost."""
    per_req = getattr(so, "num_scheduled_tokens", {}) or {}
    new = getattr(so, "scheduled_new_reqs", []) or []
    reqs = getattr(scheduler, "requests", {})
    ctx = [getattr(reqs.get(r), "num_computed_tokens", 0) - n for r, n in per_req.items()]
    pre = [(c, n) for c, n in zip(ctx, per_req.values()) if n > 1]
    return {"tokens": int(getattr(so, "total_num_scheduled_tokens", 0)), "reqs": len(per_req),
            "new": len(new), "decode": sum(1 for n in per_req.values() if n == 1),
            "ctx": int(sum(ctx)), "ctx_max": int(max(ctx, default=0)),
            "pre_reqs": len(pre), "pre_tokens": sum(n for _, n in pre),
            "pre_ctx": sum(c for c, _ in pre), "pre_attn": int(sum(n * (c + n / 2) for c, n in pre)),
            "waiting": len(getattr(scheduler, "waiting", ()) or ())}


def _status(request) -> str:
    return getattr(getattr(request, "status", None), "name", "")


def _state(so, scheduler) -> dict:
    """The scheduler's state after it built this step (vLLM 0.24 attribute names)."""
    out: dict = {"running": len(getattr(scheduler, "running", ()) or ())}
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    if pool is not None:
        out["free"] = pool.get_num_free_blocks()
    reqs = getattr(scheduler, "requests", {}) or {}
    out["remote"] = sum(1 for r in reqs.values() if _status(r) == "WAITING_FOR_REMOTE_KVS")
    out["preempted"] = len(getattr(so, "preempted_req_ids", None) or ())
    out["new_ids"] = [r.req_id for r in getattr(so, "scheduled_new_reqs", []) or []]
    cached = getattr(so, "scheduled_cached_reqs", None)
    resumed = getattr(cached, "resumed_req_ids", None)
    if resumed:
        out["resumed_ids"] = sorted(resumed)
    mgr = getattr(getattr(scheduler, "connector", None), "scheduler_manager", None)
    if mgr is not None:
        stores = getattr(mgr, "_store_event_to_blocks", {}) or {}
        loads = getattr(mgr, "_reqs_to_load", {}) or {}
        out["store_held"] = sum(len(t.gpu_block_ids) for t in stores.values())
        out["stores"] = len(stores)
        out["load_held"] = sum(len(s.transfer_meta.gpu_block_ids) for s in loads.values()
                               if s.transfer_meta is not None)
        out["loads"] = len(loads)
        cpu = getattr(mgr, "cpu_block_pool", None)
        if cpu is not None:
            out["cpu_free"] = cpu.get_num_free_blocks()
    return out


def _moves(meta) -> dict:
    """Blocks (SimpleCPUOffload) or tokens (Mooncake) the connector metadata moves this step."""
    if meta is None:
        return {}
    if hasattr(meta, "load_gpu_blocks"):
        return {"load_blocks": len(meta.load_gpu_blocks or ()),
                "store_blocks": len(getattr(meta, "store_gpu_blocks", ()) or ())}
    reqs = getattr(meta, "requests", None)
    if reqs is None:
        return {}
    load = save = 0
    for r in reqs:
        ls = getattr(r, "load_spec", None)
        if ls is not None and getattr(ls, "can_load", False):
            load += max(0, ls.kvpool_cached_tokens - ls.vllm_cached_tokens)
        if getattr(r, "can_save", False):
            save += int(getattr(r, "token_len_chunk", 0) or 0)
    return {"load_tokens": load, "store_tokens": save, "meta_reqs": len(reqs)}


def _patch_core(mod) -> None:
    for fn in ("step", "step_with_batch_queue"):
        _timed(mod.EngineCore, fn,
               lambda out, dt, args, t0, fn=fn: LOG.step(t0, t0 + dt, fn))


def _patch_scheduler(mod) -> None:
    def record(so, dt, args, t0):
        LOG.batch = {**_batch(so, args[0]), "sched": round(dt, 6)}
        LOG.moves.update(_moves(getattr(so, "kv_connector_metadata", None)))
        try:
            LOG.batch.update(_state(so, args[0]))
        except Exception as e:  # noqa: BLE001
            LOG.batch["state_error"] = repr(e)[:120]
    _timed(mod.Scheduler, "schedule", record)
    _before(mod.Scheduler, "_preempt_request", lambda self, request, *a, **k: LOG.event({
        "ev": "preempt", "req": request.request_id, "computed": request.num_computed_tokens,
        "prompt": request.num_prompt_tokens, "out": request.num_output_tokens,
        "free": self.kv_cache_manager.block_pool.get_num_free_blocks()}))
    _before(mod.Scheduler, "add_request", lambda self, request, *a, **k: LOG.event({
        "ev": "add", "req": request.request_id, "prompt": request.num_prompt_tokens}))
    _before(mod.Scheduler, "_free_request", lambda self, request, *a, **k: LOG.event({
        "ev": "free", "req": request.request_id, "out": request.num_output_tokens,
        "preemptions": request.num_preemptions}))


def _patch_offload_manager(mod) -> None:
    """SimpleCPUOffload's scheduler side: each load it sets up and sees finish."""
    def alloc(out, dt, args, t0):
        mgr, request = args[0], args[1]
        state = mgr._reqs_to_load.get(request.request_id)
        if state is not None and state.load_event is None and state.transfer_meta is not None:
            LOG.event({"ev": "load", "req": request.request_id,
                       "blocks": len(state.transfer_meta.gpu_block_ids), "ext": args[3]})
    _timed(mod.SimpleCPUOffloadScheduler, "update_state_after_alloc", alloc)
    _before(mod.SimpleCPUOffloadScheduler, "bind_gpu_block_pool", _bind)
    _before(mod.SimpleCPUOffloadScheduler, "_prepare_lazy_store_specs", _walk_start)
    if _FATES is not None:
        _timed(mod.SimpleCPUOffloadScheduler, "build_connector_meta", _walked)
        _before(mod.SimpleCPUOffloadScheduler, "_process_store_completion", _stored)
        _timed(mod.SimpleCPUOffloadScheduler, "get_num_new_matched_tokens", _looked_up)
    _before(mod.SimpleCPUOffloadScheduler, "update_connector_output",
            lambda self, output, *a, **k: [LOG.event({"ev": "loaded", "req": r})
                                           for r in (output.finished_recving or ())])


def _count(key: str) -> None:
    LOG.moves[key] = LOG.moves.get(key, 0) + 1


def _evicting(pool, block) -> None:
    """Before a BlockPool drops a block's hash for reuse: which tier it is, and whether the CPU
    tier holds a copy of a GPU block's content (vLLM 0.24 `_maybe_evict_cached_block`)."""
    mgr = _MGR
    bhash = block.block_hash
    if mgr is None or bhash is None:
        return
    cpu = mgr.cpu_block_pool
    if pool is mgr._gpu_block_pool:
        if pool.cached_block_hash_to_block.get_one_block(bhash) is None:
            return  # not cached: nothing is evicted
        _count("gpu_evicted")
        if cpu.cached_block_hash_to_block.get_one_block(bhash) is None:
            _count("gpu_evicted_unstored")
            _fate(bhash, "gpu-evicted without a CPU copy")
    elif pool is cpu and cpu.cached_block_hash_to_block.get_one_block(bhash) is not None:
        _count("cpu_evicted")
        _fate(bhash, "cpu-evicted")


def _fate(key, what: str) -> None:
    """Record what happened to a block's content; `key` is a BlockHashWithGroupId (its last 4
    bytes the group id, vllm/v1/core/kv_cache_utils.py), the request's hashes have none."""
    if _FATES is not None and key is not None:
        _FATES[bytes(key[:-4])] = what


def _walked(meta, dt, args, t0) -> None:
    mgr = args[0]
    pool = mgr._gpu_block_pool
    for bid in getattr(meta, "store_gpu_blocks", None) or ():
        _fate(pool.blocks[bid].block_hash, "store in flight")


def _stored(mgr, gpu_block_ids, cpu_block_ids, *a, **k) -> None:
    for bid in cpu_block_ids:
        _fate(mgr.cpu_block_pool.blocks[bid].block_hash, "stored")


def _looked_up(out, dt, args, t0) -> None:
    """A tier lookup (`get_num_new_matched_tokens(request, num_computed_tokens)`): where it stopped,
    and why."""
    mgr, request, gpu = args[0], args[1], args[2]
    hit = (out[0] if out else 0) or 0
    bs = mgr.hash_block_size  # request.block_hashes are of this size
    k = (gpu + hit) // bs
    limit = (request.num_tokens - 1) // bs
    hashes = request.block_hashes
    stop = "whole" if k >= min(limit, len(hashes)) else _FATES.get(bytes(hashes[k]), "new content")
    LOG.event({"ev": "lookup", "req": request.request_id, "gpu": gpu, "hit": hit, "stop": stop})


def _patch_block_pool(mod) -> None:
    _before(mod.BlockPool, "_maybe_evict_cached_block", _evicting)


def _bind(mgr, *a, **k) -> None:
    global _MGR
    _MGR = mgr


def _walk_start(mgr, *a, **k) -> None:
    cur = mgr._cursor
    if cur is None or cur.ref_cnt > 0:
        _count("walk_head")


def _patch_runner(mod) -> None:
    for fn in ("execute_model", "sample_tokens"):
        _timed(mod.GPUModelRunner, fn, lambda out, dt, args, t0, fn=fn: LOG.runner(t0, dt, fn))


def _patch_connector(cls_name: str):
    def patch(mod) -> None:
        cls = getattr(mod, cls_name)
        LOG.connector = cls_name
        for hook in SCHED_HOOKS + WORKER_HOOKS:
            _timed(cls, hook, lambda out, dt, args, t0, hook=hook: LOG.add_hook(hook, dt))
    return patch


_PATCHES = {"vllm.v1.engine.core": _patch_core, "vllm.v1.core.sched.scheduler": _patch_scheduler,
            "vllm.v1.worker.gpu_model_runner": _patch_runner,
            "vllm.v1.simple_kv_offload.manager": _patch_offload_manager,
            "vllm.v1.core.block_pool": _patch_block_pool,
            **{m: _patch_connector(c) for m, c in _CONNECTORS.items()}}


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a module's patch right after the module executes (a post-import hook)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader, patch = spec.loader, _PATCHES[name]
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                patch(module)
            except Exception as e:  # noqa: BLE001
                print(f"agentx stepprobe: {name} not patched: {e!r}", file=sys.stderr)
        loader.exec_module = exec_and_patch
        return spec


if _DIR:
    LOG = _Log(_DIR)
    sys.meta_path.insert(0, _Finder())
    LOG.flush_every(1.0)
    atexit.register(LOG.flush)
    os.register_at_fork(after_in_child=LOG.forked)
