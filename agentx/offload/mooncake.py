"""MooncakeStoreConnector (vLLM 0.32,
vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/): every computed block is put
in a Mooncake store whose segments live in each rank's host DRAM, served by a
`mooncake_master` side process. Settings follow InferenceX's agentic vLLM scripts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from .. import vllm_names as vn
from ..options import opt
from . import dram
from .base import Budgeted, Launch, Signal, SimMetrics, StorePolicy, Tier

PORT_OFFSET = 12000  # InferenceX starts mooncake_master on the server port + 12000
CONFIG_NAME = "mooncake_config.json"
TIME_BUCKETS = [1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 2e-1, 3e-1, 4e-1, 5e-1, 7.5e-1, 1.0, 1.5, 2.0,
                3.0, 4.0]
OPERATIONS = ("lookup_exists", "save_put", "load_get")
KEYS = vn.total(vn.MOONCAKE_KEYS)


class MooncakeMetrics(SimMetrics):
    """mooncake/store/metrics.py's families, status "ok" per operation."""

    def __init__(self, registry, labelnames, labels) -> None:
        from prometheus_client import Counter, Histogram
        super().__init__(registry, labelnames, labels)
        op_l, r = labelnames + ["operation", "status"], registry
        t = Histogram(vn.MOONCAKE_TIME, "Histogram of Mooncake store communication time.",
                      op_l, buckets=TIME_BUCKETS, registry=r)
        fams = [Counter(name, doc, op_l, registry=r) for name, doc in (
            (vn.MOONCAKE_OPS, "Number of Mooncake store communication operations."),
            (vn.MOONCAKE_BYTES, "Bytes moved by Mooncake store operations."),
            (vn.MOONCAKE_KEYS, "Keys touched by Mooncake store operations."),
            (vn.MOONCAKE_FAILED_KEYS, "Keys that failed in Mooncake store operations."))]
        self.ops = {op: [f.labels(operation=op, status="ok", **labels) for f in (t, *fams)]
                    for op in OPERATIONS}

    def _op(self, op: str, keys: int, nbytes: float = 0.0, seconds: float | None = None) -> None:
        h, calls, b, k, _ = self.ops[op]
        if seconds is not None:
            h.observe(seconds)
        calls.inc()
        b.inc(nbytes)
        k.inc(keys)

    def on_lookup(self, keys: int) -> None:
        self._op("lookup_exists", keys)

    def on_load(self, blocks: int, nbytes: float, seconds: float) -> None:
        self._op("load_get", blocks, nbytes, seconds)

    def on_store(self, blocks: int, nbytes: float, seconds: float) -> None:
        if blocks:
            self._op("save_put", blocks, nbytes, seconds)


class Mooncake(Budgeted):
    kind: Literal["mooncake"] = opt("mooncake", "MooncakeStoreConnector")
    page_cache_reserve_gib: int = opt(0, "GiB left for the checkpoint's page cache", ge=0)
    local_buffer_gib: int = opt(4, "local_buffer_size per rank, GiB", ge=1)
    master_port: int | None = opt(None, "mooncake_master port; default: server port + 12000 "
                                  "(InferenceX)", ge=1, le=65535)
    protocol: str = opt("rdma", "transfer protocol (rdma | tcp)")
    device: str = opt("", "RDMA device names, comma-separated")
    eviction_high_watermark_ratio: float = opt(0.80, "mooncake_master eviction watermark",
                                               gt=0.0, le=1.0)
    eviction_ratio: float = opt(0.10, "mooncake_master share evicted per pass", gt=0.0, le=1.0)
    load_async: bool = opt(True, "kv_connector_extra_config.load_async: loads overlap compute "
                           "(vLLM's worker asserts it is true)")
    lookup_async: bool = opt(False, "kv_connector_extra_config.lookup_async: the scheduler does "
                             "not wait on the store's existence check (vLLM's default: false)")

    vllm_name = "MooncakeStoreConnector"
    inferencex_name = "mooncake"
    store = StorePolicy(eager=True)
    loads = (Signal("mooncake_keys_loaded", KEYS, {"operation": "load_get", "status": "ok"}),)
    stores = (Signal("mooncake_keys_saved", KEYS, {"operation": "save_put", "status": "ok"}),
              Signal("mooncake_failed_keys", vn.total(vn.MOONCAKE_FAILED_KEYS)))
    sim_metrics = MooncakeMetrics
    load_gbps = 20.0  # assumption: transfer engine reading local DRAM (docs/simulator.md)

    def plan(self, ranks: int, host_mib: int | None = None) -> Tier:
        """global_segment_size per rank = (total GiB - page cache) // ranks - buffer; vLLM's
        `vllm/distributed/mooncake_store.py` `_parse_size` reads "87GB" as 87 * 2**30 bytes."""
        b = self.budget(ranks, host_mib)
        per_rank = dram.per_rank_gib(b, ranks=ranks, page_cache_gib=self.page_cache_reserve_gib,
                                     buffer_gib=self.local_buffer_gib)
        b.steps.append(f"global_segment_size \"{per_rank}GB\" (vLLM's Mooncake config reads "
                       f"GB as 2^30 bytes: {per_rank * dram.GIB:,} bytes)")
        held = self.held_fraction()
        b.steps.append(f"held in steady state: x {held:.2f} (mooncake_master evicts "
                       f"{self.eviction_ratio:.0%} of its keys each time it passes "
                       f"{self.eviction_high_watermark_ratio:.0%} full, so it holds between "
                       f"{self.eviction_high_watermark_ratio * (1 - self.eviction_ratio):.0%} "
                       f"and {self.eviction_high_watermark_ratio:.0%}): the size the cache "
                       "theory uses")
        return Tier(self.kind, ranks, budget=b, total_bytes=per_rank * dram.GIB * ranks,
                    per_rank_gib=per_rank, held_fraction=held)

    def held_fraction(self) -> float:
        """The share of the segment the store keeps filled: its mean between the watermark and
        one eviction pass below it (master_service.cpp BatchEvict: evict `eviction_ratio` of the
        keys when memory passes `eviction_high_watermark_ratio`; seen on the H200, 2026-12-03:
        passes at 80.7-81.9 %, each evicting 10.7-11.9 % of the keys)."""
        hw, r = self.eviction_high_watermark_ratio, self.eviction_ratio
        return hw * (1 - r / 2)

    def extra_config(self) -> dict[str, bool]:
        """vLLM's MooncakeStoreScheduler reads these two keys; lookup_async is written only
        when set, so the default render stays what InferenceX's scripts pass."""
        out = {"load_async": self.load_async}
        if self.lookup_async:
            out["lookup_async"] = True
        return out

    def render(self, tier: Tier, *, port: int, workdir: Path) -> Launch:
        master_port = self.master_port or port + PORT_OFFSET
        config_path = str(workdir / CONFIG_NAME)
        config = json.dumps({
            "mode": "embedded", "metadata_server": "P2PHANDSHAKE",
            "master_server_address": f"127.0.0.1:{master_port}",
            "global_segment_size": f"{int(tier.per_rank_gib or 0)}GB",
            "local_buffer_size": f"{self.local_buffer_gib}GB",
            "protocol": self.protocol, "device_name": self.device,
            "enable_offload": False}, indent=2) + "\n"
        master = ["mooncake_master", "--port", str(master_port),
                  f"--eviction_high_watermark_ratio={self.eviction_high_watermark_ratio:.2f}",
                  f"--eviction_ratio={self.eviction_ratio:.2f}"]
        # identical prefixes must hash to identical store keys in every rank
        return Launch({"kv_connector": self.vllm_name, "kv_role": "kv_both",
                       "kv_connector_extra_config": self.extra_config()},
                      env={"MOONCAKE_CONFIG_PATH": config_path, "PYTHONHASHSEED": "0"},
                      files={config_path: config}, sidecars=[master])
