"""SimpleCPUOffloadConnector (vLLM 0.32,
vllm/distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py): a vLLM
BlockPool in pinned host memory, `cpu_bytes_to_use` server-wide, enabled with
VLLM_USE_SIMPLE_KV_OFFLOAD=1 as InferenceX's agentic scripts do."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from .. import vllm_names as vn
from ..options import opt
from . import dram
from .base import Budgeted, Launch, Signal, SimMetrics, StorePolicy, Tier


class SimpleCPUMetrics(SimMetrics):
    """vllm/v1/simple_kv_offload/metrics.py's families (vLLM 0.24 did not expose them yet)."""

    def __init__(self, registry, labelnames, labels) -> None:
        from prometheus_client import Counter, Gauge
        super().__init__(registry, labelnames, labels)
        L, r = labelnames, registry
        self.load = Counter(vn.SIMPLE_LOAD_BLOCKS, "Blocks loaded from the CPU tier.",
                            L + ["phase"], registry=r).labels(phase="completed", **labels)
        self.save = Counter(vn.SIMPLE_SAVE_OUTCOMES, "Outcomes of block saves to the CPU tier.",
                            L + ["outcome"], registry=r).labels(outcome="stored", **labels)
        self.used = Gauge(vn.SIMPLE_USED_BLOCKS, "CPU tier blocks in use.", L,
                          registry=r).labels(**labels)
        Gauge(vn.SIMPLE_PENDING_STORE, "Blocks waiting to be stored.", L,
              registry=r).labels(**labels).set(0)
        self.info = Gauge(vn.SIMPLE_INFO, "SimpleCPUOffload configuration.",
                          L + ["backend", "page_cache", "lazy_offload", "capacity_blocks"],
                          registry=r)

    def on_load(self, blocks: int, nbytes: float, seconds: float) -> None:
        self.load.inc(blocks)

    def on_store(self, blocks: int, nbytes: float, seconds: float) -> None:
        self.save.inc(blocks)

    def set_info(self, capacity_blocks: int, lazy: bool) -> None:
        self.info.labels(backend="cpu", page_cache="False", lazy_offload=str(lazy),
                         capacity_blocks=str(capacity_blocks), **self.labels).set(1)

    def before_render(self, used_blocks: int) -> None:
        self.used.set(used_blocks)


class SimpleCPU(Budgeted):
    kind: Literal["simple-cpu"] = opt("simple-cpu", "SimpleCPUOffloadConnector")
    lazy_offload: bool = opt(True, "store blocks lazily, as the GPU pool evicts them")
    cpu_bytes: int | None = opt(None, "fixed cpu_bytes_to_use instead of the DRAM budget",
                                ge=1)

    vllm_name = "SimpleCPUOffloadConnector"
    inferencex_name = "vllm-simple"
    store = StorePolicy(eager=False)  # the recipes' lazy_offload: true
    loads = (Signal("simple_kv_offload_blocks_loaded", vn.total(vn.SIMPLE_LOAD_BLOCKS),
                    {"phase": "completed"}),)
    stores = (Signal("simple_kv_offload_blocks_stored", vn.total(vn.SIMPLE_SAVE_OUTCOMES),
                     {"outcome": "stored"}),)
    sim_metrics = SimpleCPUMetrics
    load_gbps = 14.0  # assumption before the H200 fit (the profiles set their own, docs/simulator.md)

    def store_policy(self) -> StorePolicy:
        return StorePolicy(eager=not self.lazy_offload)

    def reads_host(self) -> bool:
        return self.cpu_bytes is None and super().reads_host()

    def plan(self, ranks: int, host_mib: int | None = None) -> Tier:
        """cpu_bytes_to_use = total GB x 1e9, server-wide (the connector divides it by the
        world size)."""
        if self.cpu_bytes is not None:
            return Tier(self.kind, ranks, total_bytes=self.cpu_bytes)
        b = self.budget(ranks, host_mib)
        if b.total_gb <= 0:
            raise dram.BudgetError(f"DRAM budget is {b.total_gb} GB (<= 0)",
                                   "kv_offload.host_dram_mib")
        cpu_bytes = b.total_gb * dram.GB
        b.steps.append(f"cpu_bytes_to_use: {b.total_gb:,} GB x 1e9 = {cpu_bytes:,} bytes "
                       f"({cpu_bytes // ranks:,} per rank over {ranks})")
        return Tier(self.kind, ranks, budget=b, total_bytes=cpu_bytes)

    def render(self, tier: Tier, *, port: int, workdir: Path) -> Launch:
        return Launch(
            {"kv_connector": self.vllm_name, "kv_role": "kv_both",
             "kv_connector_extra_config": {"cpu_bytes_to_use": tier.total_bytes,
                                           "lazy_offload": self.lazy_offload}},
            env={"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"})

    def sim_options(self) -> dict:
        return {"offload_store": "lazy" if self.lazy_offload else "eager"}
