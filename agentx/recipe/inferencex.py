"""InferenceX's agentic result fields for one sweep cell, so its ETL and dashboards read our
summary.json as they read their own results.

Field names and values follow the agentic-coding result rows of InferenceX
(github.com/SemiAnalysisAI/InferenceX: `framework`, `spec_decoding`, `disagg`,
`scenario_type`, `kv_offloading`, `allocated_cpu_dram_gb`, ...); the DRAM figure is the
recipe's own arithmetic (agentx/offload/dram.py, the same TOTAL_CPU_DRAM_GB the scripts compute).
"""
from __future__ import annotations

from ..metrics.catalog import DISTS
from .render import tier
from .schema import Point, Recipe

SCENARIO = "agentic-coding"
# the summary blocks that describe requests (the rest is client, config and validation)
REQUEST_KEYS = ("completed", "failed", "cancelled", "errors", *(m.key for m in DISTS),
                "throughput", "tokens", "cache", "goodput")


def spec_decoding(recipe: Recipe, point: Point) -> str:
    """`eagle3`, `mtp`, ... as the recipe says; `none` when the point runs without it."""
    s = recipe.speculative
    if s is None or not point.spec:
        return "none"
    return "eagle3" if s.method == "eagle" else s.method


def allocated_cpu_dram_gb(recipe: Recipe, point: Point) -> int | None:
    """The KV tier's host-DRAM budget in GB (1e9 bytes); None without a tier."""
    try:
        t = tier(recipe, point)
    except (ValueError, OSError):  # a refused budget (BudgetError) or no /proc/meminfo
        return None
    return t.allocated_gb


def request_metrics(summary: dict, gpus: int) -> dict:
    """The request-level blocks of a summary, with `throughput.per_gpu` as InferenceX has it."""
    out = {k: summary[k] for k in REQUEST_KEYS if k in summary}
    th = dict(summary.get("throughput") or {})
    th["per_gpu"] = {k: th[k] / gpus for k in ("input_tok_s", "output_tok_s", "total_tok_s",
                                               "requests_s") if th.get(k) is not None}
    out["throughput"] = th
    return out


def inferencex_fields(recipe: Recipe, point: Point, conc: int, summary: dict) -> dict:
    """The fields to merge into a cell's summary.json."""
    backend = recipe.offload(point).kind
    server = summary.get("server_metrics") or {}
    pool = (summary.get("cache") or {}).get("kv_pool_tokens") or server.get("kv_pool_tokens")
    return {
        "hw": recipe.hardware, "conc": conc, "image": recipe.image, "model": recipe.model,
        "framework": "vllm", "precision": recipe.precision,
        "spec_decoding": spec_decoding(recipe, point), "disagg": False,
        "scenario_type": SCENARIO, "tp": point.tp, "ep": point.ep,
        "dp_attention": point.dp_attention, "kv_offloading": backend != "none",
        "kv_offload_backend": backend,
        "allocated_cpu_dram_gb": allocated_cpu_dram_gb(recipe, point) if backend != "none"
        else None,
        "kv_cache_pool_tokens": pool,
        "request_metrics": request_metrics(summary, point.gpus),
        "server_metrics": summary.get("server_metrics"),
    }
