"""One row per run and the Pareto frontier of throughput per GPU against interactivity.

Interactivity is InferenceX's x axis: tokens per second one user sees, 1000 / TPOT p50 (ms);
and an end-to-end form, 1000 / p90(E2E ms / output tokens), which also charges the queueing
and prefill a user waits through. A point is on the frontier when no other run has at least
its throughput per GPU and at least its interactivity, and more of one of them. Only runs
whose verdict can be published take part: `pass`, or no validation; a run whose verdict is
`insufficient` (too few requests), `fail`, `interrupted` (or rebuilt from a killed run's
records) is listed with its verdict and plotted apart, never on the frontier. Throughput is
each run's headline figure (agentx.metrics.window.headline). A sweep's SLO search marks its
answer cells (`slo_answer`: the highest concurrency meeting the goodput target), starred on the
plot.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..metrics.catalog import csv_columns
from ..metrics.cost import cost_columns
from ..metrics.definitions import interactivity_tok_s
from ..metrics.summary import measured
from ..metrics.window import headline
from ..rundir import common_parent
from .target import gpus_of, load_text, target_text

PUBLISHABLE = ("pass", "")  # verdicts a frontier point may have ("": validation off)

# (column, x) pairs the frontier is computed for
INTERACTIVITY = (("interactivity_tok_s_user", "1000 / TPOT p50 (tok/s/user)"),
                 ("e2e_interactivity_tok_s_user", "1000 / p90(E2E / OSL) (tok/s/user)"))


# y columns where lower is better (the frontier minimises them)
LOWER_BETTER = frozenset({"usd_per_m_output_tokens"})


def frontier(points: Sequence[tuple[float | None, float | None]],
             lower_y: bool = False) -> list[int]:
    """Indices of the non-dominated (x, y) points, both maximised (y minimised with
    `lower_y`: a cost), in increasing x. Points with a missing coordinate are never on it;
    equal points are all kept."""
    ok = [(i, x, -y if lower_y else y) for i, (x, y) in enumerate(points)
          if x is not None and y is not None]
    keep = [i for i, x, y in ok
            if not any(x2 >= x and y2 >= y and (x2 > x or y2 > y) for _, x2, y2 in ok)]
    return sorted(keep, key=lambda i: (points[i][0], points[i][1] if lower_y else -points[i][1]))


def e2e_interactivity(records: list[dict]) -> float | None:
    """1000 / p90(E2E ms / output tokens) over the measured requests (tok/s/user)."""
    per_tok = [r["e2e_ms"] / r["osl"] for r in measured(records) if r.get("osl") and r["e2e_ms"]]
    if not per_tok:
        return None
    p90 = float(np.percentile(per_tok, 90))
    return 1000.0 / p90 if p90 > 0 else None


def _label(summary: dict, key: str) -> str:
    v = summary.get(key)
    if isinstance(v, dict):
        v = v.get("name") or v.get("label")
    return "" if v is None else str(v)


def _per(v: float | None, n: int | None) -> float | None:
    return v / n if v is not None and n else None


def short_names(paths: list[str]) -> list[str]:
    """Each run's path below the runs' common parent (`a/1` and `b/1` for an A/B's sides, not
    `1` twice); one run: its folder's name."""
    if len(paths) == 1:
        return [Path(paths[0]).name]
    base = common_parent(paths)
    return [os.path.relpath(Path(p).resolve(), base) for p in paths]


def run_row(name: str, summary: dict, records: list[dict], gpus: int | None = None) -> dict:
    """The CSV row of one run. `gpus` (`report --gpus`) applies when the run recorded none;
    with no count at all the per-GPU columns are empty, never the total over an assumed 1.
    Throughput columns are summary.json's `throughput.headline` keys prefixed `headline_`
    (one name, one meaning in every file: docs/metrics.md#throughput)."""
    cfg = summary.get("config") or {}
    n_gpu = gpus_of(summary) or gpus
    th = summary["throughput"]
    h = th.get("headline") or headline(th)
    gp = summary.get("goodput") or {}
    cc = summary.get("concurrency") or {}
    v = (summary.get("validation") or {}).get("verdict", "")
    tpot_p50 = (summary.get("tpot_ms") or {}).get("p50")
    open_loop = bool(cfg.get("session_rate") or cfg.get("arrivals") == "trace")
    return {
        "run": name, "recipe": _label(summary, "recipe"), "point": _label(summary, "point"),
        "trace": cfg.get("trace") or "", "load": load_text(cfg, short=True),
        "conc": None if open_loop else cfg.get("conc"), "gpus": n_gpu,
        "in_flight_mean": cc.get("in_flight_mean"), "in_flight_p90": cc.get("in_flight_p90"),
        "server_running_mean": cc.get("server_running_mean"),
        "rebuilt": bool(summary.get("rebuilt")), "completed": summary["completed"],
        "headline_total_tok_s": h["total_tok_s"],
        "headline_per_gpu_tok_s": _per(h["total_tok_s"], n_gpu),
        "headline_output_tok_s": h["output_tok_s"],
        "headline_per_gpu_output_tok_s": _per(h["output_tok_s"], n_gpu),
        "headline_cached_share": h.get("cached_share"),
        "headline_source": h["source"],
        **csv_columns(summary),  # the catalog's percentiles (ttft_p50_ms, ...)
        "interactivity_tok_s_user": interactivity_tok_s(tpot_p50),
        "e2e_interactivity_tok_s_user": e2e_interactivity(records),
        "goodput_req_s": gp.get("requests_s"), "goodput_tok_s": gp.get("total_tok_s"),
        "goodput_tok_s_per_gpu": _per(gp.get("total_tok_s"), n_gpu),
        "slo_met_all": (gp.get("met") or {}).get("all"),
        "hit_rate": (summary.get("cache") or {}).get("achieved_hit_rate"),
        "server_hit_rate": ((summary.get("server_metrics") or {}).get("prefix_cache")
                            or {}).get("hit_rate"),
        **cost_columns(summary),  # $ per M tokens, per request, per session (--gpu-hour-usd)
        "validation": v,
        "slo_answer": bool(((summary.get("sweep") or {}).get("slo_answer"))),
        "labels": ";".join(f"{k}={x}" for k, x in (summary.get("labels") or {}).items()),
        "target": target_text({"target": summary.get("target")}),
    }


def in_flight_text(row: dict) -> str:
    """`1.5/3`: the run's requests in flight, mean/p90 (`-` for a run that did not record it)."""
    m, p = row.get("in_flight_mean"), row.get("in_flight_p90")
    return "-" if m is None else f"{m:.1f}/{p}"


def publishable(row: dict) -> bool:
    """A run that may stand on the frontier: its verdict is pass (or it was not validated),
    and it is not a killed run's rebuilt summary."""
    return row["validation"] in PUBLISHABLE and not row["rebuilt"]


def frontier_key(col: str) -> str:
    """The row's boolean column: on the frontier against interactivity `col`."""
    return f"frontier_{col.removesuffix('_tok_s_user')}"


def throughput_axis(rows: list[dict], goodput: bool = False,
                    cost: bool = False) -> tuple[str, str]:
    """The frontier's y column and label: $ per million output tokens (--cost, minimised), else
    throughput or goodput per GPU when every run's GPU count is known, else the total, saying
    why (a per-GPU axis over an assumed count would be wrong by it)."""
    if cost:
        return "usd_per_m_output_tokens", "$ per million output tokens"
    per_gpu = all(r["gpus"] for r in rows)
    if goodput:
        return (("goodput_tok_s_per_gpu", "goodput tok/s per GPU") if per_gpu
                else ("goodput_tok_s", "goodput tok/s (GPU count unknown: give --gpus)"))
    return (("headline_per_gpu_tok_s", "headline throughput tok/s per GPU") if per_gpu
            else ("headline_total_tok_s", "headline throughput tok/s (GPU count unknown: "
                  "give --gpus)"))


def mark_frontiers(rows: list[dict], y: str = "headline_per_gpu_tok_s") -> list[dict]:
    """Add `frontier_<x>` booleans to each row, one per interactivity definition; only
    publishable runs take part."""
    for col, _ in INTERACTIVITY:
        on = set(frontier([(r[col], r[y]) if publishable(r) else (None, None) for r in rows],
                          y in LOWER_BETTER))
        for i, r in enumerate(rows):
            r[frontier_key(col)] = i in on
    return rows
