"""Hardware + model profiles: YAML data files, shipped under agentx/sim/profiles/ or user-supplied.

A profile is plain data (hardware datasheet figures, model shape, engine defaults and the
calibration constants of the roofline); `resolve()` applies the command-line overrides and
derives the GPU KV pool exactly as vLLM sizes it:
    pool tokens = (HBM x gpu_memory_utilization - weights/TP - non-KV reserve) / KV bytes per token per rank
rounded down to whole blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import InputError
from ..offload import connector
from ..offload.base import StepCost
from ..options import StrictModel
from ..yamlconf import load_model, read_text
from .config import SimConfig

GB = 1e9
GIB = float(1 << 30)


class Hardware(StrictModel):
    gpu: str
    hbm_gib: float  # per GPU, as the driver reports it (GiB)
    hbm_tbps: float  # per GPU HBM bandwidth, TB/s
    peak_tflops: float  # dense tensor TFLOP/s at the weight dtype
    nvlink_gbps: float  # per GPU NVLink bandwidth (one direction), GB/s
    host_gbps: float  # achievable host->GPU copy bandwidth per GPU, GB/s
    host_dram_gb: float = 1024.0  # host DRAM (for the default offload budget)


class Model(StrictModel):
    name: str
    params_b: float  # total parameters (billions)
    active_params_b: float  # parameters used per token (MoE: shared + top-k experts)
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: float  # bytes per weight incl. quantisation scales
    kv_bytes: float  # bytes per KV element
    num_experts: int = 0  # routed experts per MoE layer (0 = dense)
    top_k: int = 0
    moe_layers: int = 0
    draft_params_b: float = 0.0  # EAGLE3 draft head (one decoder layer + reduced-vocab head)
    attn_window: int = 0  # sparse attention: KV tokens a query reads at most (0 = dense)
    index_bytes_per_token: float = 0.0  # sparse attention: selector bytes scanned per context token


class Calibration(StrictModel):
    mbu: float = 0.85  # fraction of HBM bandwidth the weight reads achieve
    attn_mbu: float = 0.6  # ... the KV reads of decode attention achieve
    mfu: float = 0.65  # fraction of peak FLOP/s prefill GEMMs achieve
    # ... prefill attention achieves (its FLOPs grow with the context); None = mfu
    attn_mfu: float | None = None
    step_overhead_ms: float = 0.8  # per step: launch, sampling, scheduler, detokenize
    per_layer_us: float = 0.0  # per layer per step: kernel floors not covered by the roofline (MoE routing)
    per_seq_overhead_us: float = 50.0  # per running sequence per step
    allreduce_us: float = 8.0  # latency of one TP all-reduce (2 per layer)
    spec_per_seq_us: float = 0.0  # extra per sequence per step under speculative decoding
    draft_pass_overhead_us: float = 40.0  # per draft forward pass
    non_kv_reserve_gib: float = 2.0  # activations, CUDA graphs, NCCL buffers per GPU
    # effective CPU->GPU load rate per GPU, by connector kind (default: the connector's own
    # figure, agentx.offload: `Connector.load_gbps`)
    offload_load_gbps: dict[str, float] = {}
    # GPU->CPU copy rate of the lazy store walk (SimConfig.offload_store_walk), by connector kind,
    # measured (default: the host link's host_gbps)
    offload_store_gbps: dict[str, float] = {}
    # CPU->GPU copy rate of a load when loads are paced by the engine's steps, as vLLM's
    # SimpleCPUOffload worker runs them (SimConfig.offload_store_walk: see sim/sched.py), by
    # connector kind, measured (default: the effective offload_load_gbps)
    offload_load_copy_gbps: dict[str, float] = {}
    # what each connector adds to an engine step, by connector kind (default: the connector's
    # own, agentx.offload: `Connector.step_cost`); written by bench/connector_steps.py --write
    offload_step_cost: dict[str, StepCost] = {}
    # host-side preparation of a step that admits requests (fixed + per token of their chunks),
    # hidden behind the step in flight unless that is a shorter decode-only step (sim/timing.py;
    # measured by sim_calibration.fit on vLLM 0.24's engine steps)
    admit_host_ms: float = 0.0
    admit_host_us_per_token: float = 0.0
    # the API server's work before a request reaches the engine (HTTP, chat template,
    # tokenisation), served requests only: fixed + per prompt token
    frontend_ms: float = 0.0
    frontend_us_per_prompt_token: float = 0.0
    # capacity of that API server, shared by the requests in it (sim/frontend.py); 0 = unlimited
    # (each request held for its own work, independently)
    frontend_servers: float = 0.0
    # requests leave that server in the order they arrived (sim/frontend.py `ordered`)
    frontend_in_order: bool = False
    # ... except a prompt whose request body needs more reads than one: each later read puts it
    # behind every request in the server (sim/frontend.py `reads`); prompt tokens the first read
    # and each later read take, 0 = one read
    frontend_first_read_tokens: int = 0
    frontend_read_tokens: int = 0

    def load_gbps(self, kind: str) -> float | None:
        """The tier's load rate into one GPU, GB/s; None for no connector (or none given)."""
        return self.offload_load_gbps.get(kind) or connector(kind).load_gbps

    def step_cost(self, kind: str) -> StepCost:
        """What connector `kind` adds to each step (nothing for no connector)."""
        return self.offload_step_cost.get(kind) or connector(kind).step_cost


class EngineDefaults(StrictModel):
    tp: int = 1
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0  # vLLM default: no per-request cap on a prefill chunk
    max_num_partial_prefills: int = 1
    reserve_full_isl: bool = True  # vLLM 0.32's scheduler_reserve_full_isl default
    offload_gb: float = 64.0  # default CPU tier size per engine when offload is on


class Profile(StrictModel):
    """A profile file: every section strict (unknown keys are errors, with file and line)."""

    name: str = ""
    description: str = ""
    hardware: Hardware
    model: Model
    engine: EngineDefaults = EngineDefaults()
    calibration: Calibration = Calibration()
    sources: dict = {}
    path: str = ""


@dataclass
class Resolved:
    """A profile with the command-line overrides applied and the KV pool derived."""

    profile: Profile
    tp: int
    block_size: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int  # as configured (0 = none); see prefill_cap()
    max_num_partial_prefills: int
    reserve_full_isl: bool
    kv_bytes_per_token_rank: float  # per GPU (KV heads split over TP, replicated below 1/rank)
    kv_pool_tokens: int
    num_gpu_blocks: int
    kv_pool_bytes_rank: float
    offload_blocks: int
    offload_bytes: float


def shipped() -> list[str]:
    d = resources.files("agentx.sim") / "profiles"
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def _locate(name: str) -> tuple[str, str]:
    """(text, source) of a shipped profile name or a YAML file path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise InputError(name, "profile file not found", field="profile")
        return read_text(p), str(p)
    f = resources.files("agentx.sim") / "profiles" / f"{name}.yaml"
    if not f.is_file():
        raise InputError("serve-sim", f"unknown profile {name!r}; shipped: {', '.join(shipped())}",
                         field="profile")
    return f.read_text(encoding="utf-8"), str(f)


def load_profile(name: str) -> Profile:
    text, src = _locate(name)
    prof = load_model(text, Profile, src)
    return prof.model_copy(update={"name": prof.name or Path(src).stem, "path": src})


def kv_bytes_per_token_rank(m: Model, tp: int) -> float:
    """2 (K,V) x layers x KV heads on this rank x head_dim x bytes; KV heads replicate when TP > heads."""
    heads_rank = max(1.0, m.kv_heads / tp)
    return 2 * m.layers * heads_rank * m.head_dim * m.kv_bytes


def _pick(override, default):
    return default if override is None else override


def prefill_cap(r: Resolved, max_model_len: int) -> int:
    """Most prompt tokens one request may prefill in a step (0 = only the step budget), as vLLM's
    SchedulerConfig derives it: with max_num_partial_prefills > 1 an unset
    long_prefill_token_threshold becomes 4% of max_model_len (vllm/config/scheduler.py)."""
    if r.max_num_partial_prefills > 1 and not r.long_prefill_token_threshold:
        return int(max_model_len * 0.04)
    return r.long_prefill_token_threshold


def resolve(cfg: SimConfig, prof: Profile | None = None) -> Resolved:
    prof = prof or load_profile(cfg.profile)
    e, hw, m, cal = prof.engine, prof.hardware, prof.model, prof.calibration
    tp = cfg.tp or e.tp
    bs = cfg.block_size or e.block_size
    util = cfg.gpu_memory_utilization or e.gpu_memory_utilization
    kvb = kv_bytes_per_token_rank(m, tp)
    if cfg.kv_pool_tokens is not None:
        blocks = cfg.kv_pool_tokens // bs
    else:
        free = hw.hbm_gib * GIB * util - m.params_b * 1e9 * m.weight_bytes / tp - cal.non_kv_reserve_gib * GIB
        if free <= 0:
            raise InputError(prof.path, f"weights do not fit: {m.params_b}B params at TP{tp} exceed "
                             f"{hw.hbm_gib} GiB x {util}", field="tp")
        blocks = int(free // (kvb * bs))
    if blocks <= 0:
        raise InputError("serve-sim", "KV pool is smaller than one block", field="kv_pool_tokens")
    off_blocks, off_bytes = 0, 0.0
    if cfg.offload_connector.enabled:
        gb = cfg.offload_gb if cfg.offload_gb is not None else e.offload_gb
        off_bytes = gb * GB
        # the tier holds every rank's share of a block: bytes per block across the TP group
        off_blocks = int(off_bytes // (kvb * tp * bs))
    return Resolved(profile=prof, tp=tp, block_size=bs, gpu_memory_utilization=util,
                    max_num_seqs=cfg.max_num_seqs or e.max_num_seqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens or e.max_num_batched_tokens,
                    long_prefill_token_threshold=_pick(cfg.long_prefill_token_threshold,
                                                       e.long_prefill_token_threshold),
                    max_num_partial_prefills=cfg.max_num_partial_prefills or e.max_num_partial_prefills,
                    reserve_full_isl=_pick(cfg.reserve_full_isl, e.reserve_full_isl),
                    kv_bytes_per_token_rank=kvb, kv_pool_tokens=blocks * bs, num_gpu_blocks=blocks,
                    kv_pool_bytes_rank=blocks * bs * kvb, offload_blocks=off_blocks, offload_bytes=off_bytes)
