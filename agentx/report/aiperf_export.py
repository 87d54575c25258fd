"""A run directory as AIPerf's export files, so an agentx run enters InferenceX's agentic
pipeline where an AIPerf run does.

InferenceX drives AIPerf for its agentic-coding scenario and aggregates AIPerf's
`aiperf_artifacts/` with `utils/agentic/aggregation/process_agentic_result.py`
(github.com/SemiAnalysisAI/InferenceX at 843c6254ff69b567f772f6a5fd97675af3d04431). This module
writes the three files that code opens, with exactly the fields it reads (docs/inferencex.md
lists them with their source lines):

- `profile_export.jsonl`: one AIPerf record per request: `metadata.benchmark_phase`
  (`warmup` rows are dropped), `metadata.request_start_ns` / `request_end_ns` (wall clock, ns),
  `metadata.conversation_id` / `turn_index`, `error` (null, or `{code, type, message}`) and
  `metrics.<name>.value` for time_to_first_token, request_latency, inter_token_latency (ms),
  input_sequence_length and output_sequence_length (tokens).
- `profile_export_aiperf.json`: `request_count`, `error_request_count`,
  `completed_request_count` (`{"avg": n}`, what the pre-upload error-rate gate reads) and
  `theoretical_prefix_cache_hit` (`{"avg": %, "unit": "%"}`).
- `server_metrics_export.json`: `{"metrics": {"vllm:<name>": {"series": [{"labels", "stats"}]}}}`
  from metrics.jsonl: counters as `stats.total` (increase over the scrapes), gauges as
  `stats.max` / `stats.avg`; the names InferenceX's vLLM adapter sums.

No `metadata.dataset`: InferenceX maps that to a dataset of its own, which an agentx trace is not.
"""
from __future__ import annotations

from pathlib import Path

import orjson

from .. import vllm_names as vn
from ..records import read_records
from ..rundir import RunDir, read_jsonl, write_bytes, write_json

ARTIFACTS = "aiperf_artifacts"  # InferenceX reads $RESULT_DIR/aiperf_artifacts/
RECORDS, AGGREGATE, SERVER = ("profile_export.jsonl", "profile_export_aiperf.json",
                              "server_metrics_export.json")
# metrics.jsonl's short key -> the vLLM counter InferenceX's vLLM adapter sums
COUNTERS = {"prompt_tokens": vn.PROMPT_TOKENS, "generation_tokens": vn.GEN_TOKENS,
            "prefix_hits": vn.PREFIX_HITS, "prefix_queries": vn.PREFIX_QUERIES,
            "external_hits": vn.EXT_HITS, "external_queries": vn.EXT_QUERIES}
GAUGES = {"kv_usage": vn.KV_USAGE}


def _metric(value: float | int | None, unit: str) -> dict | None:
    return None if value is None else {"value": value, "unit": unit}


def _end_wall_ns(r: dict) -> int:
    """A record's end on the wall clock: its wall-clock start plus its monotonic duration."""
    return int(r.get("start_wall_ns") or 0) + max(0, int(r.get("end_ns") or 0)
                                                  - int(r.get("start_ns") or 0))


def record_row(r: dict) -> dict:
    """One agentx request record as an AIPerf profile_export.jsonl record."""
    warm = bool(r.get("warmup")) or r.get("kind") == "prime"
    start = int(r.get("start_wall_ns") or 0)
    e2e = (_end_wall_ns(r) - start) / 1e6 if start and r.get("end_ns") else None
    osl = r.get("osl") if r.get("osl") is not None else r.get("osl_counted")
    isl = r.get("isl") if r.get("isl") is not None else r.get("isl_intended")
    metrics = {"input_sequence_length": _metric(isl, "tokens"),
               "output_sequence_length": _metric(osl, "tokens"),
               "time_to_first_token": _metric(r.get("ttft_ms"), "ms"),
               "request_latency": _metric(e2e, "ms"),
               "inter_token_latency": _metric(r.get("tpot_ms"), "ms")}
    error = None
    if not r.get("ok"):
        kind = r.get("error") or "error"
        error = {"code": r.get("status") or None, "type": kind,
                 "message": r.get("error_detail") or kind}
    return {"metadata": {"conversation_id": r.get("trace_id") or r.get("session_id"),
                         "turn_index": r.get("turn"), "x_request_id": r.get("request_id"),
                         "session_num": r.get("lane"), "request_start_ns": start,
                         "request_end_ns": _end_wall_ns(r),
                         "benchmark_phase": "warmup" if warm else "profiling",
                         "was_cancelled": r.get("error") == "cancelled"},
            "metrics": {k: v for k, v in metrics.items() if v is not None},
            "error": error}


def aggregate(rows: list[dict], records: list[dict]) -> dict:
    """profile_export_aiperf.json: the request counts of the profiling phase and the trace's
    in-session (infinite-cache) prefix hit, token-weighted, in percent."""
    prof = [(row, r) for row, r in zip(rows, records, strict=True)
            if row["metadata"]["benchmark_phase"] == "profiling"]
    ok = sum(1 for row, _ in prof if row["error"] is None)
    err = len(prof) - ok
    hit = sum(int(r.get("cached_expected") or 0) for _, r in prof)
    tot = sum(int(r.get("isl_intended") or 0) for _, r in prof)
    out: dict = {"request_count": {"avg": ok, "unit": "requests"},
                 "error_request_count": {"avg": err, "unit": "requests"},
                 "completed_request_count": {"avg": ok + err, "unit": "requests"}}
    if tot:
        out["theoretical_prefix_cache_hit"] = {"avg": 100.0 * hit / tot, "unit": "%"}
    return out


def _series(stats: dict) -> dict:
    return {"labels": {}, "stats": stats}


def server_export(scrapes: list[dict]) -> dict:
    """server_metrics_export.json from metrics.jsonl: each counter's increase from the first
    scrape to the last, each gauge's max and mean. Empty (`metrics: {}`) without scrapes."""
    metrics: dict[str, dict] = {}
    for key, name in COUNTERS.items():
        vals = [s[key] for s in scrapes if s.get(key) is not None]
        if len(vals) >= 2:
            metrics[name] = {"type": "counter", "series": [
                _series({"total": vals[-1] - vals[0]})]}
    for key, name in GAUGES.items():
        vals = [s[key] for s in scrapes if s.get(key) is not None]
        if vals:
            metrics[name] = {"type": "gauge", "series": [
                _series({"max": max(vals), "avg": sum(vals) / len(vals)})]}
    return {"schema_version": "1.0", "metrics": metrics}


def export(run_dir: str | Path, dest: str | Path | None = None) -> Path:
    """Write the three AIPerf files of `run_dir` into `dest` (default
    `<run_dir>/aiperf_artifacts/`, where InferenceX looks with RESULT_DIR=<run_dir>)."""
    rd = RunDir(run_dir)
    out = Path(dest) if dest is not None else rd.path / ARTIFACTS
    out.mkdir(parents=True, exist_ok=True)
    records = read_records(rd.requests)
    rows = [record_row(r) for r in records]
    write_bytes(out / RECORDS, [orjson.dumps(row) + b"\n" for row in rows])
    write_json(out / AGGREGATE, aggregate(rows, records))
    scrapes, _ = read_jsonl(rd.metrics)
    write_json(out / SERVER, server_export(scrapes))
    return out

