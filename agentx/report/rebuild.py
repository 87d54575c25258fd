"""A run directory as the report reads it: its records, its /metrics series and its summary,
rebuilt when the run was killed before writing one.

A run killed with SIGKILL leaves requests.jsonl (streamed line by line) and, with --workers,
per-worker `requests.w*.jsonl` that were never merged; maybe a partial metrics.jsonl, and no
summary.json. `load_run` merges the worker files, then rebuilds the summary with the same
`summarize` the live run uses, marked `"rebuilt": true` and `stop_reason: "killed"` and failed
in validation, so nobody mistakes it for a clean run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..metrics.goodput import goodput
from ..metrics.outages import outages
from ..metrics.summary import summarize
from ..records import valid_records
from ..rundir import RunDir, read_jsonl, write_json
from ..scrape import server_metrics as sm
from ..scrape.gpu import gpu_rows, scrape_rows
from ..scrape.prom import Snapshot
from ..scrape.scraper import SERIES_KEYS

REQUESTS, SUMMARY = RunDir.REQUESTS, RunDir.SUMMARY  # for the notes below
KILLED = f"killed: the run ended without writing {SUMMARY}; rebuilt from its records " \
         "by agentx report (window and config estimated, server series possibly partial)"


@dataclass
class Run:
    """One run directory, loaded."""

    dir: Path
    summary: dict
    records: list[dict]
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl's /metrics scrapes
    gpu: list[dict] = field(default_factory=list)  # metrics.jsonl's GPU samples (scrape/gpu.py)
    notes: list[str] = field(default_factory=list)  # what loading had to repair


def drop_partial_line(path: Path) -> bool:
    """Cut a last line that has no newline (its writer was killed mid-write): every line left
    is whole. Lines are written whole with one write(2) each, so this is the only way to
    find half a line."""
    if not path.exists():
        return False
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return False
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        pos, keep = size, 0
        while pos > 0:  # back to the last newline, 64 KiB at a time
            start = max(0, pos - (1 << 16))
            f.seek(start)
            i = f.read(pos - start).rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
    return True


def find_runs(paths: list[str]) -> list[Path]:
    """Each path is a run directory, or a directory of them (a sweep's root)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise InputError(str(p), "is not a directory", field="DIR")
        if RunDir(p).is_run():
            out.append(p)
            continue
        subs = sorted(d for d in p.iterdir() if d.is_dir() and RunDir(d).is_run())
        if not subs:
            raise InputError(str(p), f"holds no run (no {SUMMARY} or {REQUESTS} in it "
                             "or its subdirectories)", field="DIR")
        out.extend(subs)
    return out


def load_run(run_dir: Path, *, gpus: int | None = None, slo: dict | None = None) -> Run:
    """Load a run; rebuild (and write) summary.json when the run left none. With `slo`, a run
    that recorded no goodput (or other SLOs) gets it computed from its records, in memory."""
    notes = []
    rd = RunDir(run_dir)
    owner = rd.live_owner()
    if owner is not None:  # its files are being written: nothing here may be merged or cut
        raise InputError(str(run_dir), f"a run is in progress here (agentx {owner}): agentx "
                         "report reads it once that run has ended", field="DIR")
    if drop_partial_line(rd.requests):
        notes.append(f"dropped the cut-off last line of {REQUESTS} (its writer was killed)")
    merged = rd.merge_workers()
    if merged:
        notes.append(f"merged {merged} unmerged worker record file(s) into {REQUESTS}")
    records, bad = read_jsonl(rd.requests)
    if bad:
        notes.append(f"skipped {bad} unreadable line(s) in {REQUESTS}")
    records, invalid, why = valid_records(records)  # re-checked as the run writes them
    if invalid:
        notes.append(f"skipped {invalid} invalid record(s) in {REQUESTS} (the first: {why})")
    rows, bad_m = read_jsonl(rd.metrics)
    metrics, gpu = scrape_rows(rows), gpu_rows(rows)
    summary, broken = rd.read_json(SUMMARY)
    if broken:
        notes.append(f"{SUMMARY} is {broken}: rebuilt it from the records")
    if summary is None:
        if not records:
            raise InputError(str(run_dir), f"no {'usable ' if broken else ''}{SUMMARY} and no "
                             f"readable request in {REQUESTS}: nothing to report")
        summary = rebuild_summary(records, metrics, gpus=gpus, slo=slo,
                                  meta=read_run_json(run_dir))
        summary["rebuilt_from"] = {"records": len(records), "unreadable_lines": bad,
                                   "invalid_records": invalid,
                                   "worker_files_merged": merged, "metrics_rows": len(metrics),
                                   "unreadable_metrics_lines": bad_m}
        if broken:
            summary["rebuilt_from"]["broken_summary"] = broken
        write_json(rd.summary, summary)
        if not broken:
            notes.append(f"no {SUMMARY}: rebuilt it from {len(records)} records"
                         + (f" and {len(metrics)} /metrics scrapes" if metrics else ""))
    if "per_session" not in summary:  # a run from before per-session results: in memory
        summary.update({k: v for k, v in summarize(
            records, window_s=0.0, last_turns=last_turns_of(summary)).items()
            if k in ("per_session", "per_turn")})
    if slo and (summary.get("goodput") or {}).get("slo_ms") != slo:
        summary["goodput"] = goodput(records, slo, summary["throughput"]["window_s"])
    return Run(run_dir, summary, records, metrics, gpu=gpu, notes=notes)


def last_turns_of(summary: dict) -> dict[str, int] | None:
    """The last turn index of every trace of the run's --trace, when it still loads (a
    built-in name, or a file still there): which sessions ran to their end. None otherwise
    (metrics/sessions.py then falls back to the lane rule)."""
    from ..trace.load import load_traces

    trace = (summary.get("config") or {}).get("trace")
    if not trace:
        return None
    try:
        return load_traces(str(trace)).last_turns()
    except (InputError, OSError, ValueError):
        return None


def read_run_json(run_dir: Path) -> dict | None:
    """run.json (config, target, labels, run metadata; written at the run's start), or None
    for a run from before it existed or one whose file is unreadable."""
    try:
        return RunDir(run_dir).read_json(RunDir.RUN)[0]
    except InputError:
        return None


def measurement_window_s(records: list[dict], auto_warmup: bool = False) -> float:
    """The live run's window, estimated from the records: with an auto warm-up (run.json
    says), from the instant every lane had finished its first request, as the live run;
    else from the engine's start (the first intended send) or, when a warm-up period flagged
    turns, from the first measured request's intended send; to the last measured completion."""
    def sent(r: dict) -> int:
        return r.get("intended_send_ns") or r["start_ns"]

    t0 = min(sent(r) for r in records)
    firsts: dict[int, dict] = {}
    for r in records:
        if r["lane"] not in firsts or r["start_ns"] < firsts[r["lane"]]["start_ns"]:
            firsts[r["lane"]] = r
    if auto_warmup:
        t0 = max(r["end_ns"] for r in firsts.values())
    elif any(r["warmup"] and r.get("kind") == "turn" for r in records):
        t0 = min((sent(r) for r in records if not r["warmup"]), default=t0)
    ends = [r["end_ns"] for r in records if r["ok"] and not r["warmup"]] \
        or [r["end_ns"] for r in records]
    return max(0, max(ends) - t0) / 1e9


def rebuild_summary(records: list[dict], metrics: list[dict], *, gpus: int | None = None,
                    slo: dict | None = None, meta: dict | None = None) -> dict:
    """summary.json of a killed run: the live run's `summarize` over the records, the
    server_metrics block from the metrics.jsonl series (incomplete window), marked rebuilt.
    `meta` (run.json) gives the config, target and labels the run started with."""
    server = series_server_metrics(metrics) if metrics else None
    sm_ = server or {}
    auto = ((meta or {}).get("config") or {}).get("warmup_s") == "auto"
    s = summarize(records, window_s=measurement_window_s(records, auto), gpus=gpus,
                  block_size=sm_.get("kv_block_size"), kv_pool_tokens=sm_.get("kv_pool_tokens"),
                  last_turns=last_turns_of(meta or {}))
    if slo:
        s["goodput"] = goodput(records, slo, s["throughput"]["window_s"])
    s["server_metrics"] = server
    s["outages"] = outages(records)
    s["stop_reason"] = "killed"
    s["rebuilt"] = True
    s["config"] = {"trace": None, "conc": len({r["lane"] for r in records}), "gpus": gpus,
                   "slo": slo, "inferred": "conc = lanes seen in the records; the rest unknown"}
    if meta and isinstance(meta.get("config"), dict):
        s.update({k: meta[k] for k in ("config", "target", "labels", "run") if k in meta})
        if gpus:
            s["config"] = {**s["config"], "gpus": gpus}
    s["validation"] = {"verdict": "fail", "reasons": [KILLED], "skipped": [], "checks": []}
    return s


def series_server_metrics(rows: list[dict]) -> dict:
    """server_metrics from metrics.jsonl rows through the live run's `compute`: each row
    becomes a Snapshot of the series' samples (counters' deltas and gauges' time-weighted
    means as a full run would compute them, over the scrapes that were written)."""
    snaps = []
    for row in rows:
        samples = {(SERIES_KEYS[k][0], frozenset()): float(v) for k, v in row.items()
                   if k in SERIES_KEYS and v is not None}
        snaps.append(Snapshot(t=float(row.get("t", 0.0)), samples=samples,
                              families={name: "unknown" for name, _ in samples},
                              wall=float(row.get("wall", 0.0))))
    out = sm.compute(None, None, snaps)
    out["rebuilt_from_series"] = True
    return out
