"""LMCacheConnectorV1 with LMCache's local CPU backend.

vLLM 0.32 registers it in vllm/distributed/kv_transfer/kv_connector/factory.py and names it in
--kv-transfer-config as {"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}; the connector
(kv_connector/v1/lmcache_connector.py) reads no kv_connector_extra_config key we need, so
LMCache is configured by its own LMCACHE_* environment variables. Figures, from LMCache's
configuration reference (docs.lmcache.ai/api_reference/configurations.html and
lmcache/v1/config.py `_CONFIG_DEFINITIONS`):
  * LMCACHE_CHUNK_SIZE: tokens per KV chunk, default 256;
  * LMCACHE_LOCAL_CPU: the CPU backend on/off, default true;
  * LMCACHE_MAX_LOCAL_CPU_SIZE: the CPU backend's size in "GB", default 5.0, allocated up front
    as pinned memory per worker (lmcache/v1/cache_engine.py: `max_local_cpu_size * 1024**3`
    bytes, so GiB, one allocator per rank);
  * LMCACHE_CONFIG_FILE, when set, makes LMCache ignore every LMCACHE_* variable.
Store policy (vLLM's lmcache_integration/vllm_v1_adapter.py, the same logic as LMCache's own
adapter): every prefilled token is stored as it is computed (eager), in chunks; a lookup
returns the prompt's leading tokens found chunk by chunk, so a later, longer prompt hits only
whole chunks (the last, partial chunk of the earlier prompt has a different key).
LMCacheConnectorV1 adds no family to vLLM 0.32's /metrics (it has no connector stats); its
hits show in vLLM's generic external_prefix_cache_hits and prompt_tokens_by_source."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..options import opt
from . import dram
from .base import Budgeted, Launch, StorePolicy, Tier

CHUNK_SIZE = 256  # LMCACHE_CHUNK_SIZE default


class LMCache(Budgeted):
    kind: Literal["lmcache"] = opt("lmcache", "LMCacheConnectorV1 (LMCache's CPU backend)")
    chunk_size: int = opt(CHUNK_SIZE, "LMCACHE_CHUNK_SIZE: tokens per KV chunk", ge=1)
    cpu_gib: float | None = opt(None, "fixed LMCACHE_MAX_LOCAL_CPU_SIZE per rank (GiB) instead "
                                "of the DRAM budget", gt=0.0)
    page_cache_reserve_gib: int = opt(0, "GiB left for the checkpoint's page cache", ge=0)

    vllm_name = "LMCacheConnectorV1"
    inferencex_name = "lmcache"
    store = StorePolicy(eager=True, chunk_tokens=CHUNK_SIZE)
    load_gbps = 20.0  # assumption: pinned-memory copies, capped by the profile's PCIe rate

    def store_policy(self) -> StorePolicy:
        return StorePolicy(eager=True, chunk_tokens=self.chunk_size)

    def reads_host(self) -> bool:
        return self.cpu_gib is None and super().reads_host()

    def plan(self, ranks: int, host_mib: int | None = None) -> Tier:
        """LMCACHE_MAX_LOCAL_CPU_SIZE per rank = (total GiB - page cache) // ranks: each rank's
        LMCache engine pins that much host memory."""
        if self.cpu_gib is not None:
            return Tier(self.kind, ranks, total_bytes=int(self.cpu_gib * dram.GIB) * ranks,
                        per_rank_gib=self.cpu_gib)
        b = self.budget(ranks, host_mib)
        per_rank = dram.per_rank_gib(b, ranks=ranks, page_cache_gib=self.page_cache_reserve_gib)
        b.steps.append(f"LMCACHE_MAX_LOCAL_CPU_SIZE={per_rank} (LMCache reads GB as 2^30 "
                       f"bytes: {per_rank * dram.GIB:,} bytes pinned per rank)")
        return Tier(self.kind, ranks, budget=b, total_bytes=per_rank * dram.GIB * ranks,
                    per_rank_gib=per_rank)

    def render(self, tier: Tier, *, port: int, workdir: Path) -> Launch:
        size = tier.per_rank_gib
        return Launch({"kv_connector": self.vllm_name, "kv_role": "kv_both"},
                      env={"LMCACHE_CHUNK_SIZE": str(self.chunk_size), "LMCACHE_LOCAL_CPU": "True",
                           "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{size:g}"})

    def sim_options(self) -> dict:
        return {"offload_chunk_tokens": self.chunk_size}
