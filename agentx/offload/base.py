"""What every KV-offload connector provides, so that nothing outside its class switches on
its name.

A connector is one pydantic class (its recipe options, with a `kind` discriminator as
GuideLLM's registries have a `type_`) that also owns, as class data or methods:
  * its rendering (`render`: the --kv-transfer-config JSON, environment, files, side
    processes) and its DRAM rule (`plan`: how the host budget becomes the tier's bytes);
  * its store policy (`store`: what the tier model and the simulator need);
  * its server signals (`loads` / `stores`: the counters that tell its hits);
  * what the simulator emits for it on /metrics (`sim_metrics`);
  * the simulator's default load rate (`load_gbps`), which a profile may override.
The registry (agentx.offload) lists the classes once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from ..options import StrictModel, opt
from . import dram


@dataclass(frozen=True)
class StorePolicy:
    """When blocks reach the tier and in what units hits come back.

    eager: every newly computed block is stored (True), or only blocks the GPU pool evicts.
    chunk_tokens: hits come back in whole chunks of this many tokens (None: GPU blocks)."""

    eager: bool
    chunk_tokens: int | None = None


class StepCost(StrictModel):
    """What a connector adds to each engine step, relative to the same server without it.

    Measured on the H200 by bench/connector_steps.py (per-step timings of real vLLM 0.24 with and
    without the connector, docs/simulator.md): `factor` scales every step (its median ratio), and
    a share `stall_fraction` of steps carries a further `stall_ms` (the heavy tail: the store's
    work competing with the engine's). A connector that launches a step's copies on the host after
    the model (SimpleCPUOffload) costs that launch instead, per 1,000 blocks loaded and stored: a
    step takes the longer of its own time and the launch. The default adds nothing."""

    factor: float = opt(1.0, "every step's time x this", gt=0)
    stall_fraction: float = opt(0.0, "share of steps that stall", ge=0, le=1)
    stall_ms: float = opt(0.0, "mean extra time of a stalled step, ms", ge=0)
    load_ms_per_kblock: float = opt(0.0, "host time to launch the copies of 1,000 loaded blocks, ms", ge=0)
    store_ms_per_kblock: float = opt(0.0, "host time to launch the copies of 1,000 stored blocks, ms", ge=0)


@dataclass(frozen=True)
class Signal:
    """One counter that shows the connector moving KV: `key` is its field in
    server_metrics.offload.{loads,stores}, `sample` the exposed sample name."""

    key: str
    sample: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Tier:
    """A point's CPU tier as rendered: its DRAM arithmetic and the bytes the whole tier
    holds (every rank's share); `per_rank_gib` where the connector is sized per rank."""

    kind: str
    ranks: int = 1
    budget: dram.DramBudget | None = None
    total_bytes: int | None = None
    per_rank_gib: float | None = None
    held_fraction: float = 1.0  # share of total_bytes the store keeps filled (its eviction rule)

    @property
    def held_bytes(self) -> int | None:
        """The bytes the tier holds in steady state: what the cache theory and the simulator
        size it by (below total_bytes where the store evicts before it is full)."""
        return int(self.total_bytes * self.held_fraction) if self.total_bytes is not None else None

    @property
    def allocated_gb(self) -> int | None:
        """Host DRAM given to the tier in GB (1e9 bytes), InferenceX's allocated_cpu_dram_gb."""
        if self.budget is not None:
            return self.budget.total_gb
        return self.total_bytes // dram.GB if self.total_bytes is not None else None


@dataclass
class Launch:
    """What the server needs for the connector beyond its own flags."""

    kv_transfer_config: dict | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # path -> content
    sidecars: list[list[str]] = field(default_factory=list)


class SimMetrics:
    """The connector's own /metrics families in the simulator. The base emits none: vLLM's
    generic ones (external prefix-cache hits, tokens by source) cover every connector and
    are the simulator's own (agentx.sim.vllm_metrics)."""

    def __init__(self, registry: Any, labelnames: list[str], labels: dict[str, str]) -> None:
        self.registry, self.labelnames, self.labels = registry, labelnames, labels

    def on_lookup(self, keys: int) -> None:
        """A prefix lookup asked the tier about `keys` blocks."""

    def on_load(self, blocks: int, nbytes: float, seconds: float) -> None:
        """Blocks copied from the tier into the GPU."""

    def on_store(self, blocks: int, nbytes: float, seconds: float) -> None:
        """Blocks copied from the GPU into the tier."""

    def set_info(self, capacity_blocks: int, lazy: bool) -> None:
        """The tier's configuration, once at start."""

    def before_render(self, used_blocks: int) -> None:
        """Gauges refreshed at scrape time."""


class Connector(StrictModel):
    """Base of the registry; `kind` is each subclass's Literal discriminator."""

    kind: str
    enabled: ClassVar[bool] = True  # a CPU tier exists (NoOffload: False)
    vllm_name: ClassVar[str] = ""  # vLLM's kv_connector name; "" = no connector
    inferencex_name: ClassVar[str] = ""  # InferenceX's kv-offload-backend name (configs/*-master.yaml)
    store: ClassVar[StorePolicy] = StorePolicy(eager=True)
    loads: ClassVar[tuple[Signal, ...]] = ()
    stores: ClassVar[tuple[Signal, ...]] = ()
    sim_metrics: ClassVar[type[SimMetrics]] = SimMetrics
    load_gbps: ClassVar[float | None] = None  # the simulator's CPU->GPU rate (None: PCIe)
    step_cost: ClassVar[StepCost] = StepCost()  # per-step cost in the simulator (profiles override)

    def store_policy(self) -> StorePolicy:
        """The policy with this recipe's options applied (default: the class's)."""
        return self.store

    def plan(self, ranks: int, host_mib: int | None = None) -> Tier:
        """The tier's size from the DRAM budget (`host_mib` overrides the recipe's host)."""
        return Tier(self.kind, ranks)

    def reads_host(self) -> bool:
        """Whether `plan` reads the DRAM of the machine it runs on (host_dram_mib: auto)."""
        return False

    def render(self, tier: Tier, *, port: int, workdir: Path) -> Launch:
        """The server-side settings for this tier."""
        return Launch()

    def sim_options(self) -> dict:
        """SimConfig fields this recipe's options imply (store policy, chunk size)."""
        return {}


class Budgeted(Connector):
    """A connector sized from the host-DRAM budget (InferenceX's TOTAL_CPU_DRAM_GB)."""

    host_dram_mib: Annotated[int, Field(ge=1)] | Literal["auto"] = opt(
        "auto", "host DRAM in MiB; auto = this machine's MemTotal at render time")
    dram_cap_mib: int = opt(2_861_022, "cap on host DRAM counted (InferenceX)", ge=1)
    dram_utilization: float = opt(0.80, "share of host DRAM given to the KV tier", gt=0.0,
                                  le=1.0)
    gpus_per_node: int = opt(8, "GPUs sharing the host's DRAM", ge=1)

    def reads_host(self) -> bool:
        return self.host_dram_mib == "auto"

    def budget(self, ranks: int, host_mib: int | None) -> dram.DramBudget:
        if host_mib:
            mib, source = host_mib, dram.FROM_FLAG
        elif self.host_dram_mib == "auto":
            mib, source = dram.host_dram_mib(), dram.FROM_THIS_MACHINE
        else:
            mib, source = self.host_dram_mib, dram.FROM_RECIPE
        return dram.total_budget(mib, utilization=self.dram_utilization, gpus_used=ranks,
                                 gpus_per_node=self.gpus_per_node, cap_mib=self.dram_cap_mib,
                                 source=source)
