"""A sweep cell against the simulator read as InferenceX reads an agentic result: every field its
code reads, with the type it writes or expects.

The field lists below are taken from InferenceX (github.com/SemiAnalysisAI/InferenceX) at commit
843c6254ff69b567f772f6a5fd97675af3d04431 (2026-08-22); the line numbers are that commit's:
- utils/agentic/aggregation/process_agentic_result.py: `build_agg` (lines 194-274) writes the
  aggregate; lines 216-233 the configuration keys, 234-236 the request counts, 237 the
  single-node pp/dcp/pcp (`_gpu_shape`, 108-113), 262-273 the measured blocks.
- utils/agentic/aggregation/request_metrics.py: the AIPerf record fields it reads (48-50, 82-85,
  165-192, 239-241, 273-305) and `theoretical_prefix_cache_hit` (339-358).
- utils/agentic/validation/validate_agentic_result.py: the error-rate gate's counts (37, 61-63).
- utils/agentic/aggregation/backends/vllm.py and aggregation_common.py (91-118): the vLLM
  series in server_metrics_export.json. backends/base.py: the server_metrics block's keys.
docs/inferencex.md has the whole table.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentx.recipe.load import load_recipe
from agentx.report import aiperf_export as ax
from agentx.report.inferencex import export_cell, identity, model_id

FAST = ["--sim", "--duration", "2", "--warmup", "0", "--sim-time-scale", "50",
        "--set", "think_scale=0.01", "--set", "drain_timeout_s=2"]
NUM = (int, float)
# build_agg's single-node keys and the types it writes (process_agentic_result.py:216-271)
AGG = {"hw": str, "conc": int, "image": str, "recipe_fingerprint": str, "model": str,
       "infmax_model_prefix": str, "framework": str, "precision": str, "spec_decoding": str,
       "disagg": bool, "scenario_type": str, "is_multinode": bool, "tp": int, "ep": int,
       "dp_attention": str, "kv_offloading": str, "kv_offload_backend": (dict, type(None)),
       "allocated_cpu_dram_gb": int, "num_requests_total": int, "num_requests_successful": int,
       "request_accounting": dict, "pp": int, "dcp_size": int, "pcp_size": int,
       "request_metrics": dict, "server_metrics": dict, "kv_cache_pool_tokens": (int, type(None))}
ACCOUNTING = {"records_total", "records_profiled", "records_dropped_total",
              "records_warmup_dropped", "records_error_dropped", "error_categories"}
REQUEST = {"qps", "latency", "tokens", "throughput", "cache"}  # request_metrics.py:384-392
LATENCY = {"ttft", "e2el", "itl", "tpot", "intvty", "e2e_norm_intvty", "full_response_itl",
           "full_response_intvty"}  # request_metrics.py:218-233
STATS = {"mean", "p50", "p75", "p90", "p95", "std"}  # aggregation_common.py stats_for
SERVER = {"present", "adapter", "metric_count", "cache", "kv_cache", "kv_offload", "tokens",
          "sources"}  # backends/base.py empty_server_metrics
# AIPerf record fields read by request_metrics.py / trace_metadata.py, with their types
RECORD_METRICS = {"time_to_first_token": float, "request_latency": float,
                  "inter_token_latency": float, "input_sequence_length": int,
                  "output_sequence_length": int}
RECORD_META = {"benchmark_phase": str, "request_start_ns": int, "request_end_ns": int,
               "conversation_id": str, "turn_index": int}
VLLM_SERIES = {"vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_hits",
               "vllm:prefix_cache_queries", "vllm:kv_cache_usage_perc"}


def test_identity_types_from_the_recipes(monkeypatch):
    b300, _ = load_recipe("minimaxm3-fp4-b300-mtp")
    f = identity(b300, b300.points[-1], 64)  # DP attention over 8 ranks, EP 8, simple-cpu tier
    assert (f["hw"], f["framework"], f["precision"], f["scenario_type"]) == \
        ("b300", "vllm", "fp4", "agentic-coding")
    # InferenceX's DEP8 is tp 8, ep 8, dp-attn "true" (env strings, as build_agg passes them)
    assert (f["tp"], f["ep"], f["dp_attention"], f["disagg"], f["is_multinode"]) == \
        (8, 8, "true", False, False)
    assert f["spec_decoding"] == b300.speculative.method and f["image"] == b300.image
    assert f["kv_offloading"] == "dram" and f["kv_offload_backend"] == {"name": "vllm-simple"}
    assert f["infmax_model_prefix"] == "minimaxm3" and f["model"] == "nvidia/MiniMax-M3-NVFP4"
    h200, _ = load_recipe("minimaxm3-fp8-h200")
    g = identity(h200, h200.points[0], 1)  # Mooncake: the recipe's DRAM (1234 GB, dram.py)
    assert g["spec_decoding"] == "none" and g["dp_attention"] == "false"
    assert g["allocated_cpu_dram_gb"] == 1234 and g["kv_offload_backend"] == {"name": "mooncake"}
    for k, t in AGG.items():
        if k in f:
            assert isinstance(f[k], t), (k, f[k])
    # the model as the server gets it, ${VAR:-default} expanded, never the literal
    qwen, _ = load_recipe("qwen3-8b-dummy-h200")
    monkeypatch.delenv("AGENTX_QWEN3_DUMMY", raising=False)
    assert model_id(qwen) == "./qwen3-8b-dummy/model"
    monkeypatch.setenv("AGENTX_QWEN3_DUMMY", "/models/q")
    assert identity(qwen, qwen.points[0], 1)["model"] == "/models/q/model"
    if qwen.offload(qwen.points[0]).kind == "none":
        q = identity(qwen, qwen.points[0], 1)
        assert (q["kv_offloading"], q["kv_offload_backend"], q["allocated_cpu_dram_gb"]) == \
            ("none", None, 0)


@pytest.fixture(scope="module")
def cell(tmp_path_factory) -> Path:
    """One sweep cell of the H200 Mooncake recipe against the simulator (conc 2, 2 s: too few
    requests for a verdict, so validation warn keeps the sweep's exit code 0)."""
    out = tmp_path_factory.mktemp("ix") / "sweep"
    proc = subprocess.run([sys.executable, "-m", "agentx.cli", "sweep", "minimaxm3-fp8-h200",
                           *FAST, "--conc", "2", "--set", "validation=warn", "-o", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "p0-tp8" / "c2"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_aiperf_export_has_every_field_inferencex_reads(cell):
    art = cell / ax.ARTIFACTS
    rows = [json.loads(line) for line in (art / ax.RECORDS).read_text().splitlines()]
    records = [json.loads(line) for line in (cell / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == len(records) > 0
    profiled = [r for r in rows if r["metadata"]["benchmark_phase"] == "profiling"]
    ok = [r for r in profiled if r["error"] is None]
    assert ok, "no successful profiling record"
    for r in ok:
        for k, t in RECORD_META.items():
            assert isinstance(r["metadata"][k], t), (k, r["metadata"])
        for k, t in RECORD_METRICS.items():
            if k == "inter_token_latency" and r["metrics"]["output_sequence_length"]["value"] < 2:
                continue  # no inter-token gap in a one-token answer
            assert isinstance(r["metrics"][k]["value"], t), (k, r["metrics"])
        assert r["metadata"]["request_end_ns"] > r["metadata"]["request_start_ns"] > 1.7e18
        e2e = r["metrics"]["request_latency"]["value"]
        assert 0 < r["metrics"]["time_to_first_token"]["value"] <= e2e
    agg = _load(art / ax.AGGREGATE)  # the pre-upload gate's counts (validate_agentic_result.py)
    errors = sum(1 for r in profiled if r["error"])
    assert agg["request_count"]["avg"] == len(ok)
    assert agg["error_request_count"]["avg"] == errors
    assert agg["completed_request_count"]["avg"] == len(profiled)
    assert agg["theoretical_prefix_cache_hit"]["unit"] == "%"
    assert 0 < agg["theoretical_prefix_cache_hit"]["avg"] <= 100
    server = _load(art / ax.SERVER)["metrics"]
    assert VLLM_SERIES <= set(server)
    for name in VLLM_SERIES:
        (series,) = server[name]["series"]
        assert all(isinstance(v, NUM) for v in series["stats"].values())
    assert server["vllm:prompt_tokens"]["series"][0]["stats"]["total"] > 0


def test_inferencex_json_is_build_aggs_schema(cell):
    ix = _load(cell / "inferencex.json")
    assert set(AGG) <= set(ix) and set(ix) - set(AGG) <= {"warnings"}
    for k, t in AGG.items():
        assert isinstance(ix[k], t), (k, ix[k])
    assert (ix["hw"], ix["conc"], ix["tp"], ix["ep"], ix["model"]) == \
        ("h200", 2, 8, 1, "MiniMaxAI/MiniMax-M3")
    assert (ix["kv_offloading"], ix["kv_offload_backend"], ix["allocated_cpu_dram_gb"]) == \
        ("dram", {"name": "mooncake"}, 1234)
    acc = ix["request_accounting"]
    assert set(acc) == ACCOUNTING
    assert acc["records_total"] == ix["num_requests_total"]
    assert acc["records_profiled"] == ix["num_requests_successful"] > 0
    assert acc["records_dropped_total"] == acc["records_total"] - acc["records_profiled"]
    rm = ix["request_metrics"]
    assert set(rm) == REQUEST and set(rm["latency"]) == LATENCY
    for block in ("ttft", "e2el", "itl", "tpot"):
        assert set(rm["latency"][block]) == STATS, block
    lat = rm["latency"]  # seconds, and interactivity the reciprocal of the same ITL statistic
    assert 0 < lat["ttft"]["p50"] <= lat["e2el"]["p50"] < 60
    itl = lat["itl"]["p50"]  # rounded to 5 places, as InferenceX rounds: +-0.5e-5 s
    # (an ITL p50 under 5 us, chunks read back to back, rounds to 0: no upper bound then)
    top = 1 / (itl - 0.5e-5) if itl > 0.5e-5 else float("inf")
    assert 1 / (itl + 0.5e-5) <= lat["intvty"]["p50"] <= top
    assert set(rm["tokens"]["input"]) == STATS and rm["tokens"]["input"]["mean"] > 0
    th = rm["throughput"]
    assert th["per_gpu"]["total_tput_tps"] == \
        pytest.approx(th["total"]["tokens_per_second"] / 8, rel=1e-3)
    assert 0 < rm["cache"]["theoretical_cache_hit_rate"] <= 1
    sm = ix["server_metrics"]
    assert set(sm) == SERVER and sm["adapter"] == "vllm" and sm["present"] is True
    assert 0 <= sm["cache"]["gpu_cache_hit_rate"] <= 1
    assert ix["kv_cache_pool_tokens"] == sm["kv_cache"]["gpu_total_tokens"] > 0
    # summary.json: the same keys, but agentx's own server_metrics (its reports read it)
    s = _load(cell / "summary.json")
    assert {k: s[k] for k in AGG if k != "server_metrics"} == \
        {k: ix[k] for k in AGG if k != "server_metrics"}
    assert "inferencex.json" in (cell / ".agentx-files").read_text().splitlines()


def test_export_cell_again_is_idempotent(cell):
    """Re-exporting a finished cell (as `--resume` leaves it) gives the same aggregate."""
    recipe, _ = load_recipe("minimaxm3-fp8-h200")
    before = _load(cell / "inferencex.json")
    fields = export_cell(recipe, recipe.points[0], 2, cell, _load(cell / "summary.json"))
    assert _load(cell / "inferencex.json") == before
    assert fields["request_metrics"] == before["request_metrics"]


def test_report_aiperf_writes_the_export_of_any_run(cell, tmp_path):
    """`agentx report DIR --aiperf`: the export for a run made without a recipe (here a copy
    of the cell's run files only), the same rows as the sweep wrote."""
    from agentx.cli import main as agentx_main

    run = tmp_path / "run"
    run.mkdir()
    for name in ("run.json", "requests.jsonl", "metrics.jsonl", "summary.json"):
        (run / name).write_bytes((cell / name).read_bytes())
    assert agentx_main(["report", str(run), "--aiperf", "--no-plots"]) == 0
    for name in (ax.RECORDS, ax.AGGREGATE, ax.SERVER):
        assert (run / ax.ARTIFACTS / name).read_bytes() == \
            (cell / ax.ARTIFACTS / name).read_bytes(), name
