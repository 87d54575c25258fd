"""PNG plots of a run and of a set of runs, drawn with matplotlib (Agg: no display needed).

Per run: `latency_cdf.png` (TTFT, TPOT and chunk ITL CDFs of the measured requests) and, when
/metrics was scraped, `server_timeseries.png` (running, waiting, KV-cache usage and the prefix
hit rate per scrape interval). Per set of runs: `pareto.png`. docs/report.md shows how to read
them.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..metrics.definitions import METRICS
from ..metrics.summary import measured
from .pareto import INTERACTIVITY, frontier

CDF_METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL, chunk (ms)"))
DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def metric_values(records: list[dict], tag: str) -> np.ndarray:
    """One metric's values over the measured requests, by its single definition."""
    m = next(m for m in METRICS if m.tag == tag)
    return np.fromiter((v for r in measured(records) for v in m.values(r)), dtype=float)


def latency_cdfs(records: list[dict], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(CDF_METRICS), figsize=(13, 3.8))
    for ax, (tag, label) in zip(axes, CDF_METRICS):
        v = np.sort(metric_values(records, tag))
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        if v.size == 0:
            ax.text(0.5, 0.5, "no values", ha="center", transform=ax.transAxes)
            continue
        ax.plot(v, np.arange(1, v.size + 1) / v.size, lw=1.5)
        for p, style in ((50, "--"), (99, ":")):
            q = float(np.percentile(v, p))
            ax.axvline(q, ls=style, color="grey", lw=1, label=f"p{p} {q:,.1f}")
        if v[0] > 0 and v[-1] / v[0] > 100:
            ax.set_xscale("log")
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("fraction of requests")
    return _save(plt, fig, path, title)


def interval_hit_rate(rows: list[dict]) -> list[float | None]:
    """Prefix-cache hit rate within each scrape interval: Δhits / Δqueries (None when the
    server answered no query then, or a counter reset)."""
    out: list[float | None] = [None]
    for a, b in itertools.pairwise(rows):
        try:
            dq = b["prefix_queries"] - a["prefix_queries"]
            dh = b["prefix_hits"] - a["prefix_hits"]
        except (KeyError, TypeError):
            out.append(None)
            continue
        out.append(dh / dq if dq > 0 and dh >= 0 else None)
    return out


def server_timeseries(rows: list[dict], path: Path, title: str) -> Path:
    plt = _pyplot()
    t = [r.get("t", 0.0) for r in rows]

    def pct(v: float | None) -> float | None:
        return None if v is None else 100 * v

    panels = (("running requests", [r.get("running") for r in rows]),
              ("waiting requests", [r.get("waiting") for r in rows]),
              ("KV-cache usage (%)", [pct(r.get("kv_usage")) for r in rows]),
              ("prefix hit rate per\ninterval (%)", [pct(v) for v in interval_hit_rate(rows)]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 9), sharex=True)
    for ax, (label, y) in zip(axes, panels):
        ax.plot(t, [np.nan if v is None else v for v in y], lw=1.2, marker=".", ms=3)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_ylim(0, 100)
    axes[-1].set_xlabel("seconds since the first /metrics scrape")
    return _save(plt, fig, path, title)


def pareto_plot(rows: list[dict], path: Path, y: str, y_label: str) -> Path:
    """One panel per interactivity definition: every run, the frontier joined and ringed."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(INTERACTIVITY), figsize=(12, 4.8))
    for ax, (col, x_label) in zip(axes, INTERACTIVITY):
        pts = [(r[col], r[y]) for r in rows]
        have = [i for i, (a, b) in enumerate(pts) if a is not None and b is not None]
        ax.scatter([pts[i][0] for i in have], [pts[i][1] for i in have], s=22, color="C0",
                   label="run")
        for i in have:
            ax.annotate(_point_label(rows[i]), pts[i], fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        front = frontier(pts)
        if front:
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="C3", lw=1.5,
                    marker="o", mfc="none", ms=10, label="Pareto frontier")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path, f"{y_label} against interactivity ({len(rows)} runs)")


def _save(plt, fig, path: Path, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as e:
        raise InputError(str(path), f"cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return path


def _point_label(row: dict) -> str:
    base = row.get("point") or row.get("recipe") or Path(row["run"]).name
    return f"{base} c{row['conc']}" if row.get("conc") else base
