"""A sweep cell as InferenceX's agentic-coding result, field for field and type for type.

InferenceX (github.com/SemiAnalysisAI/InferenceX at 843c6254ff69b567f772f6a5fd97675af3d04431)
runs AIPerf for this scenario and turns its `aiperf_artifacts/` into the aggregate its
dashboard ingests with `utils/agentic/aggregation/process_agentic_result.py` (`build_agg`). A
cell gets both: `aiperf_artifacts/` (aiperf_export.py), which that script reads as it
reads an AIPerf run's, and `inferencex.json`, the aggregate itself with every key `build_agg`
writes for a single-node run. summary.json takes the same keys except `server_metrics` (agentx's
own block, which its reports read). docs/inferencex.md has the field table with source lines.

Identity comes from the recipe as InferenceX's workflow passes it in the environment: strings
where its env is a string (`dp_attention` "true"/"false", `kv_offloading` "none"/"dram"),
`kv_offload_backend` `{"name": ...}` or null, `allocated_cpu_dram_gb` an int (0 without a tier,
the recipe's own DRAM arithmetic otherwise: agentx/offload/dram.py), `model` with ${VAR}s
expanded, `tp` the point's GPU count (InferenceX's DP-attention points set tp to all ranks).
"""
from __future__ import annotations

import os
from pathlib import Path

import orjson

from ..recipe.render import expand, tier
from ..recipe.schema import Point, Recipe
from ..rundir import RunDir, read_jsonl, write_json
from . import aiperf_export as ax
from . import inferencex_metrics as ixm

SCENARIO = "agentic-coding"
FILE = "inferencex.json"  # InferenceX's $RESULT_FILENAME.json for this cell
SUMMARY_SKIP = ("server_metrics", "warnings")  # summary.json keeps agentx's own server_metrics


def spec_decoding(recipe: Recipe, point: Point) -> str:
    """`eagle3`, `mtp`, ... as the recipe says; `none` when the point runs without it."""
    s = recipe.speculative
    if s is None or not point.spec:
        return "none"
    return "eagle3" if s.method == "eagle" else s.method


def allocated_cpu_dram_gb(recipe: Recipe, point: Point) -> int:
    """The KV tier's host-DRAM budget in GB (1e9 bytes); 0 without a tier or a budget (what
    InferenceX writes when TOTAL_CPU_DRAM_GB is unset)."""
    if not recipe.offload(point).enabled:
        return 0
    try:
        return int(tier(recipe, point).allocated_gb or 0)
    except (ValueError, OSError):  # a refused budget (BudgetError) or no /proc/meminfo
        return 0


def model_id(recipe: Recipe) -> str:
    """The recipe's model with ${VAR} / ${VAR:-default} expanded from this environment (as
    written when a variable without default is unset)."""
    try:
        return expand(recipe.model, os.environ)
    except ValueError:
        return recipe.model


def identity(recipe: Recipe, point: Point, conc: int) -> dict:
    """The configuration keys of `build_agg`, in its order, typed as it writes them."""
    off = recipe.offload(point)
    return {
        "hw": recipe.hardware, "conc": conc, "image": recipe.image or "",
        "recipe_fingerprint": "", "model": model_id(recipe),
        "infmax_model_prefix": (recipe.name or "").split("-")[0],
        "framework": "vllm", "precision": recipe.precision,
        "spec_decoding": spec_decoding(recipe, point), "disagg": False,
        "scenario_type": SCENARIO, "is_multinode": False, "tp": point.gpus, "ep": point.ep,
        "dp_attention": "true" if point.dp_attention else "false",
        "kv_offloading": "dram" if off.enabled else "none",
        "kv_offload_backend": {"name": off.inferencex_name or off.kind} if off.enabled else None,
        "allocated_cpu_dram_gb": allocated_cpu_dram_gb(recipe, point),
    }


def aggregate(recipe: Recipe, point: Point, conc: int, artifacts: Path,
              pool_tokens: int | None) -> dict:
    """InferenceX's aggregate of the AIPerf files in `artifacts` for this recipe point."""
    rows, _ = read_jsonl(artifacts / ax.RECORDS, strict=True)
    agg_in = orjson.loads((artifacts / ax.AGGREGATE).read_bytes())
    export = orjson.loads((artifacts / ax.SERVER).read_bytes())
    kept, accounting = ixm.split(rows)
    out = identity(recipe, point, conc)
    out.update({"num_requests_total": accounting["records_total"],
                "num_requests_successful": len(kept), "request_accounting": accounting,
                "pp": 1, "dcp_size": 1, "pcp_size": 1})
    server, warnings = ixm.server_metrics(export, kept, pool_tokens)
    out["request_metrics"] = ixm.request_metrics(kept, agg_in, point.gpus)
    out["server_metrics"] = server
    out["kv_cache_pool_tokens"] = server["kv_cache"]["gpu_total_tokens"]
    if warnings:
        out["warnings"] = warnings
    return ixm.round_floats(out)  # type: ignore[return-value]


def export_cell(recipe: Recipe, point: Point, conc: int, run_dir: Path, summary: dict) -> dict:
    """Write the cell's aiperf_artifacts/ and inferencex.json; the keys to merge into its
    summary.json."""
    artifacts = ax.export(run_dir)
    server = summary.get("server_metrics") or {}
    pool = (summary.get("cache") or {}).get("kv_pool_tokens") or server.get("kv_pool_tokens")
    agg = aggregate(recipe, point, conc, artifacts, pool)
    write_json(Path(run_dir) / FILE, agg)
    RunDir(run_dir).register(FILE)
    return {k: v for k, v in agg.items() if k not in SUMMARY_SKIP}
