"""Host-DRAM budget for the CPU KV tier, computed the way InferenceX's agentic vLLM scripts do
(benchmarks/ in SemiAnalysisAI/InferenceX: TOTAL_CPU_DRAM_GB, PER_RANK_GB). This is the part
every connector shares; how a connector spends the budget (per rank, server-wide, minus
buffers) is its own rule (`Connector.plan` in agentx.offload).

Units matter and differ between the steps, so every step says which it uses:
MiB = 2**20 bytes (what `free -m` and /proc/meminfo report), GB = 1e9 bytes (the total
budget), GiB = 2**30 bytes (what vLLM's Mooncake config and LMCache call "GB").
Integer floors everywhere, as the shell arithmetic of the scripts does. Worked example
(H200 TP8, 1,471,356 MiB host, utilization 0.80, 414 GiB page cache, 4 GiB buffers):
1234 GB -> 1149 GiB -> (1149 - 414) // 8 - 4 = 87 GiB per rank (Mooncake).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

MIB = 2**20
GIB = 2**30
GB = 10**9


class BudgetError(ValueError):
    """The DRAM budget leaves nothing for the KV tier (per rank <= 0); `field` is the recipe
    key to change."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class DramBudget:
    total_gb: int
    total_gib: int
    steps: list[str] = field(default_factory=list)


def host_dram_mib(meminfo: str | Path = "/proc/meminfo") -> int:
    """This machine's MemTotal in MiB (what InferenceX reads with `free -m`)."""
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024  # the kernel reports kB (KiB)
    raise OSError(f"no MemTotal in {meminfo}")


# where the host's DRAM figure came from, said on the budget's first line
FROM_FLAG = "from --host-dram-mib"
FROM_RECIPE = "from the recipe's kv_offload.host_dram_mib"
FROM_THIS_MACHINE = ("from THIS machine's MemTotal (the recipe's host_dram_mib is auto): for "
                     "the GPU host's budget give --host-dram-mib MIB, its `free -m` total")


def total_budget(host_mib: int, *, utilization: float, gpus_used: int, gpus_per_node: int,
                 cap_mib: int, source: str = "") -> DramBudget:
    """TOTAL_CPU_DRAM_GB = floor(min(host, cap) MiB * 2**20 * utilization * used/per-node / 1e9).
    `source` says where `host_mib` came from (FROM_*): a budget computed on a laptop from its
    own memory is no GPU host's, and the user must see that."""
    counted = min(host_mib, cap_mib)
    exact = Fraction(counted * MIB) * Fraction(str(utilization)) * gpus_used / gpus_per_node
    total_gb = int(exact // GB)
    total_gib = total_gb * GB // GIB
    steps = [
        f"host DRAM: {host_mib:,} MiB" + (f", capped at {cap_mib:,} MiB" if counted < host_mib
                                          else f" (cap {cap_mib:,} MiB)")
        + (f"; {source}" if source else ""),
        (f"budget: {counted:,} MiB x 2^20 B/MiB x {utilization} x {gpus_used}/{gpus_per_node} "
         f"GPUs = {float(exact) / GB:,.3f} GB -> {total_gb:,} GB (GB = 1e9 bytes)"),
        (f"in GiB: {total_gb:,} GB x 1e9 / 2^30 = {total_gb * GB / GIB:,.2f} -> "
         f"{total_gib:,} GiB (GiB = 2^30 bytes)"),
    ]
    return DramBudget(total_gb=total_gb, total_gib=total_gib, steps=steps)


def per_rank_gib(b: DramBudget, *, ranks: int, page_cache_gib: int, buffer_gib: int = 0) -> int:
    """(total GiB - page cache) // ranks - buffer: one rank's share of the budget in GiB,
    as InferenceX's PER_RANK_GB."""
    per_rank = (b.total_gib - page_cache_gib) // ranks - buffer_gib
    buffer = f" - {buffer_gib} GiB local buffer" if buffer_gib else ""
    b.steps.append(f"per rank: ({b.total_gib:,} GiB - {page_cache_gib} GiB checkpoint page "
                   f"cache) // {ranks} ranks{buffer} = {per_rank} GiB")
    if per_rank <= 0:
        raise BudgetError(f"DRAM budget per rank is {per_rank} GiB (<= 0): {b.total_gib} GiB "
                          f"total - {page_cache_gib} GiB page cache over {ranks} ranks leaves "
                          f"no room" + (f" beyond the {buffer_gib} GiB local buffer"
                                        if buffer_gib else ""),
                          "kv_offload.page_cache_reserve_gib")
    return per_rank
