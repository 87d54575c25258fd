"""The simulated engine assembled from a SimConfig, in one place for the HTTP server and the
offline runs (sim_calibration/offline.py): profile resolution, step timing, KV cache, offload tier (and its
store policy), speculative decoding, fidelity-mode delays and the /metrics state."""
from __future__ import annotations

from dataclasses import dataclass

from .config import SimConfig
from .engine import SimEngine
from .fixed import FixedDelayEngine
from .frontend import FrontEnd
from .offload import OffloadTier, lazy_target_blocks
from .profile import Resolved, prefill_cap, resolve
from .specdec import Acceptance, default_rates, rates_from_length
from .timing import StepTiming
from .vllm_metrics import EngineStats


@dataclass
class BuiltEngine:
    """The engine with what it was built from (profile, timing) and its /metrics state."""

    cfg: SimConfig
    res: Resolved
    max_model_len: int  # the configured one, capped at what the KV pool holds
    timing: StepTiming
    stats: EngineStats
    engine: SimEngine
    frontend: FrontEnd  # the API server's shared front end (served requests only)

    def describe(self) -> str:
        """One start-up line, like vLLM's KV cache log line."""
        r, cfg = self.res, self.cfg
        return (f"agentx sim: profile {r.profile.name} TP{r.tp}, GPU KV cache size: "
                f"{r.kv_pool_tokens:,} tokens ({r.num_gpu_blocks} blocks of {r.block_size}), "
                f"max_model_len {self.max_model_len:,}, spec K={cfg.spec_k}, offload "
                f"{cfg.kv_offload}"
                + (f" ({r.offload_blocks} CPU blocks)" if cfg.offload_connector.enabled else "")
                + f", time_scale {cfg.time_scale:g}")


def acceptance(cfg: SimConfig) -> Acceptance | None:
    """Draft acceptance: explicit per-position rates, else rates giving the synthetic mean
    length, else the default decay; seeded from cfg.seed + 1."""
    k = cfg.spec_k
    if not k:
        return None
    if cfg.synthetic_rates is not None:
        rates = list(cfg.synthetic_rates)
    elif cfg.synthetic_al is not None:
        rates = rates_from_length(cfg.synthetic_al, k)
    else:
        rates = default_rates(k)
    return Acceptance(k, rates, seed=cfg.seed + 1)


def offload_tier(cfg: SimConfig, r: Resolved, timing: StepTiming | None = None) -> OffloadTier | None:
    """The CPU tier; blocks are stored eagerly (as soon as computed) or lazily (on GPU
    eviction, or with --offload-store-walk by vLLM 0.24's walk over the free queue):
    --offload-store, by default the connector's store policy (agentx.offload)."""
    if not cfg.offload_connector.enabled:
        return None
    store = cfg.offload_connector.store
    eager = cfg.offload_store == "eager" if cfg.offload_store else store.eager
    walk = lazy_target_blocks(r.max_num_batched_tokens, r.block_size) if cfg.offload_store_walk else 0
    timing = timing or StepTiming(r, cfg.spec_k, offload=cfg.kv_offload)
    return OffloadTier(r.offload_blocks, r.block_size, eager=eager,
                       chunk_tokens=cfg.offload_chunk_tokens or store.chunk_tokens,
                       walk_target=walk, store_seconds=timing.store_seconds)


def build_engine(cfg: SimConfig) -> BuiltEngine:
    r = resolve(cfg)
    max_model_len = min(cfg.max_model_len, r.kv_pool_tokens)
    timing = StepTiming(r, cfg.spec_k, offload=cfg.kv_offload)
    offload = offload_tier(cfg, r, timing)
    stats = EngineStats(model=cfg.model_name, engine=cfg.engine_id, max_model_len=max_model_len,
                        max_batched=r.max_num_batched_tokens, spec_k=cfg.spec_k,
                        offload=cfg.kv_offload)
    stats.set_cache_config(cache_config_labels(cfg, r, max_model_len))
    if offload is not None:
        stats.set_offload_info(r.offload_blocks, lazy=not offload.eager)
    kw = dict(num_blocks=r.num_gpu_blocks, block_size=r.block_size, max_num_seqs=r.max_num_seqs,
              max_batched_tokens=r.max_num_batched_tokens, timing=timing, stats=stats,
              time_scale=cfg.time_scale, acceptance=acceptance(cfg), offload=offload,
              prefill_cap=prefill_cap(r, max_model_len), full_isl=r.reserve_full_isl)
    engine = (SimEngine(**kw) if cfg.fixed_ttft_ms is None else
              FixedDelayEngine(fixed_ttft_s=cfg.fixed_ttft_ms / 1e3,
                               fixed_itl_s=cfg.fixed_itl_ms / 1e3, **kw))
    return BuiltEngine(cfg, r, max_model_len, timing, stats, engine, frontend(r.profile.calibration))


def frontend(cal) -> FrontEnd:
    """The API server's front end from a profile's calibration section."""
    return FrontEnd(cal.frontend_ms / 1e3, cal.frontend_us_per_prompt_token / 1e6, cal.frontend_servers,
                    ordered=cal.frontend_in_order, first_read_tokens=cal.frontend_first_read_tokens,
                    read_tokens=cal.frontend_read_tokens)


def cache_config_labels(cfg: SimConfig, r: Resolved, max_model_len: int) -> dict[str, str]:
    """Labels of vllm:cache_config_info as vLLM's CacheConfig reports them."""
    off = cfg.offload_connector.enabled
    return {"block_size": str(r.block_size),
            "cache_dtype": "fp8" if r.profile.model.kv_bytes == 1 else "auto",
            "enable_prefix_caching": "True", "engine": cfg.engine_id,
            "gpu_memory_utilization": str(r.gpu_memory_utilization),
            "kv_cache_memory_bytes": str(int(r.kv_pool_bytes_rank)),
            "kv_cache_size_tokens": str(r.kv_pool_tokens),
            "kv_cache_max_concurrency": f"{r.kv_pool_tokens / max_model_len:.1f}",
            "kv_offloading_backend": cfg.offload_connector.vllm_name or "native",
            "kv_offloading_size": f"{r.offload_bytes / 1e9:g}" if off else "None",
            "num_cpu_blocks": str(r.offload_blocks) if off else "None",
            "num_gpu_blocks": str(r.num_gpu_blocks), "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "builtin", "sliding_window": "None",
            "user_specified_block_size": str(cfg.block_size is not None)}
