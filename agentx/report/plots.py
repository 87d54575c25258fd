"""PNG plots of a run and of a set of runs, drawn with matplotlib (Agg: no display needed).

Per run: `latency_cdf.png` (CDFs of the measured requests' catalog metrics drawn there: TTFT,
TPOT and chunk ITL) and, when /metrics was scraped, `server_timeseries.png` (running, waiting,
KV-cache usage and the prefix hit rate per scrape interval). Per set of runs: `pareto.png`.
docs/report.md shows how to read them.
"""
from __future__ import annotations

import itertools
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..metrics.catalog import RUN_CDF, cdf_metrics, dist_named
from ..metrics.summary import measured
from .pareto import INTERACTIVITY, LOWER_BETTER, frontier, publishable

DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def metric_values(records: list[dict], tag: str) -> np.ndarray:
    """One metric's values over the measured requests, by its single definition."""
    m = dist_named(tag)
    return np.fromiter((v for r in measured(records) for v in m.values(r)), dtype=float)


def latency_cdfs(records: list[dict], path: Path, title: str) -> Path:
    plt = _pyplot()
    panels = cdf_metrics(RUN_CDF)
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8), squeeze=False)
    axes = axes[0]
    for ax, m in zip(axes, panels):
        v = np.sort(metric_values(records, m.key))
        ax.set_xlabel(m.axis)
        ax.grid(alpha=0.3)
        if v.size == 0:
            ax.text(0.5, 0.5, "no values", ha="center", transform=ax.transAxes)
            continue
        ax.plot(v, np.arange(1, v.size + 1) / v.size, lw=1.5, label=f"n {v.size:,}")
        for p, style in ((50, "--"), (99, ":")):
            q = float(np.percentile(v, p))
            ax.axvline(q, ls=style, color="grey", lw=1, label=f"p{p} {q:,.1f}")
        if v[0] > 0 and v[-1] / v[0] > 100:
            ax.set_xscale("log")
        else:
            cut = axis_cut(v)
            if cut is not None:  # a few outliers would squeeze the rest into one pixel
                ax.set_xlim(left=min(0.0, float(v[0])), right=cut)
                ax.plot([], [], " ", label=f"cut at 2×p99; max {v[-1]:,.1f}")
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("fraction of requests")
    return _save(plt, fig, path, title)


def axis_cut(v: np.ndarray) -> float | None:
    """Where a CDF's x axis ends when its maximum is far out: at twice p99, if the maximum is
    beyond that (20k chunk gaps near 8 ms with p99 20 ms and a 107 ms maximum drew the body a
    few pixels wide; p99.9 was 82 ms, no help). None: show everything."""
    top = 2 * float(np.percentile(v, 99))
    return top if top > 0 and v[-1] > top else None


def _delta(a: dict, b: dict, key: str) -> float | None:
    try:
        d = b[key] - a[key]
    except (KeyError, TypeError):
        return None
    return d if d >= 0 else None  # a counter reset: no figure for that interval


def interval_hit_rate(rows: list[dict]) -> list[float | None]:
    """Prefix-cache hit rate within each scrape interval, every tier counted (as the client's
    achieved rate: cached prompt tokens / prompt tokens). vLLM's own total of both tiers is
    vllm:prompt_tokens_cached (local + external, vllm/v1/metrics/loggers.py), over
    vllm:prompt_tokens. Series without it: (Δprefix_cache_hits + Δexternal_prefix_cache_hits)
    over Δprompt_tokens; a connector's (offload tier's) hits are only in the external family.
    Not over vllm:prefix_cache_queries: vLLM 0.24 with SimpleCPUOffload counted a waiting
    request's lookup at every scheduler step (94M queries for 3.1M prompt tokens in a 32-lane
    H200 run). None when the server prefilled nothing then, or a counter reset."""
    out: list[float | None] = [None]
    for a, b in itertools.pairwise(rows):
        den = _delta(a, b, "prompt_tokens")
        if den is None:
            den = _delta(a, b, "prefix_queries")
        num = _delta(a, b, "prompt_cached")
        if num is None:
            dh = _delta(a, b, "prefix_hits")
            num = None if dh is None else dh + (_delta(a, b, "external_hits") or 0.0)
        out.append(None if num is None or not den else min(1.0, num / den))
    return out


def interval_throughput(rows: list[dict]) -> list[float | None]:
    """Tokens (prompt + generated) the server processed per second within each interval."""
    out: list[float | None] = [None]
    for a, b in itertools.pairwise(rows):
        dp, dg = _delta(a, b, "prompt_tokens"), _delta(a, b, "generation_tokens")
        dt = (b.get("t") or 0.0) - (a.get("t") or 0.0)
        out.append((dp + dg) / dt if dp is not None and dg is not None and dt > 0 else None)
    return out


def phases(rows: list[dict], summary: dict | None, records: list[dict] | None) -> list[tuple]:
    """(start, end, label, colour) on the plot's time axis (seconds since the first scrape)
    for the warm-up, the measurement window and the drain. The window's instants are on the
    records' monotonic clock; a record's start_wall_ns - start_ns maps that clock to the wall
    time the scrapes carry."""
    win = (summary or {}).get("window") or {}
    if not rows or not rows[0].get("wall") or not records or not win.get("start_ns"):
        return []
    offs = [r["start_wall_ns"] - r["start_ns"] for r in records
            if r.get("start_wall_ns") and r.get("start_ns")]
    if not offs:
        return []
    off = float(np.median(offs))

    def at(ns: float | None) -> float | None:
        return None if not ns else (ns + off) / 1e9 - rows[0]["wall"]

    t0 = at(min(r["start_ns"] for r in records))
    start, end = at(win["start_ns"]), at(win.get("end_ns"))
    last = at(max(r["end_ns"] for r in records if r.get("end_ns")))
    out = []
    if t0 is not None and start is not None and start > t0:
        out.append((t0, start, "warm-up", "tab:orange"))
    if start is not None and end is not None and end > start:
        out.append((start, end, "window", "tab:green"))
    if end is not None and last is not None and last > end:
        out.append((end, last, "drain", "tab:grey"))
    return out


def server_timeseries(rows: list[dict], path: Path, title: str, summary: dict | None = None,
                      records: list[dict] | None = None) -> Path:
    """Running, waiting, KV-cache usage, the server's throughput and the prefix hit rate (all
    tiers) per scrape interval, with the run's warm-up, window and drain shaded."""
    plt = _pyplot()
    t = [r.get("t", 0.0) for r in rows]

    def pct(v: float | None) -> float | None:
        return None if v is None else 100 * v

    panels = (("running requests", [r.get("running") for r in rows]),
              ("waiting requests", [r.get("waiting") for r in rows]),
              ("KV-cache usage (%)", [pct(r.get("kv_usage")) for r in rows]),
              ("server throughput\n(tok/s, prompt + output)", interval_throughput(rows)),
              ("prefix hit rate per interval,\nGPU + offload tier (%)",
               [pct(v) for v in interval_hit_rate(rows)]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 11), sharex=True)
    shade = phases(rows, summary, records)
    for ax, (label, y) in zip(axes, panels):
        for a, b, name, colour in shade:
            ax.axvspan(a, b, color=colour, alpha=0.12, lw=0, label=name)
        ax.plot(t, [np.nan if v is None else v for v in y], lw=1.2, marker=".", ms=3,
                color="C0")
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    if shade:
        axes[0].legend(loc="upper right", fontsize=7, ncol=len(shade))
    axes[-1].set_ylim(0, 100)
    axes[-1].set_xlabel("seconds since the first /metrics scrape")
    return _save(plt, fig, path, title)


def gpu_power(rows: list[dict], path: Path, title: str, summary: dict | None = None,
              records: list[dict] | None = None) -> Path:
    """Power per GPU over the run (NVML samples, scrape/gpu.py), with the warm-up, window and
    drain shaded and the window's energy in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for a, b, name, colour in phases(rows, summary, records):
        ax.axvspan(a, b, color=colour, alpha=0.12, lw=0, label=name)
    per_j = ((summary or {}).get("energy") or {}).get("per_gpu_j") or {}
    for i in sorted({g["index"] for r in rows for g in r["gpus"]}):
        pts = [(r["t"], g.get("power_w")) for r in rows for g in r["gpus"] if g["index"] == i]
        j = per_j.get(str(i))
        ax.plot([t for t, _ in pts], [np.nan if p is None else p for _, p in pts], lw=1.2,
                marker=".", ms=3, label=f"GPU {i}" + (f" ({j:,.0f} J in window)" if j else ""))
    ax.set_ylim(bottom=0)  # from 0 W: a flat 300 W line is not drawn as swings
    ax.set_ylabel("power (W)")
    ax.set_xlabel("seconds since the first GPU sample")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    return _save(plt, fig, path, title)


def pareto_plot(rows: list[dict], path: Path, y: str, y_label: str,
                missing: Sequence[str] = ()) -> Path:
    """One panel per interactivity definition: every run coloured by its operating point
    (recipe point, else the run's labels), the frontier of the publishable runs joined and
    ringed; runs that may not stand on it (verdict insufficient, fail, ...) drawn as grey
    crosses and listed under the plot with `missing` (cells that produced no result)."""
    plt = _pyplot()
    colour = group_colours(rows)
    groups = list(colour)
    out = [r for r in rows if not publishable(r)]
    notes = [f"{_point_label(r)}: {r['validation'] or 'no verdict'}"
             + (" (rebuilt)" if r["rebuilt"] else "") for r in out] + list(missing)
    fig, axes = plt.subplots(1, len(INTERACTIVITY), figsize=(12, 4.8 + 0.16 * len(notes)))
    for ax, (col, x_label) in zip(axes, INTERACTIVITY):
        pts = [(r[col], r[y]) for r in rows]
        have = [i for i, (a, b) in enumerate(pts) if a is not None and b is not None]
        for g in groups:
            mine = [i for i in have if _group(rows[i]) == g and publishable(rows[i])]
            if mine:  # translucent with an edge: coinciding points stay visible
                ax.scatter([pts[i][0] for i in mine], [pts[i][1] for i in mine], s=28,
                           color=colour[g], alpha=0.75, edgecolors="black", linewidths=0.4,
                           label=g or "run", zorder=2)
        bad = [i for i in have if not publishable(rows[i])]
        if bad:
            ax.scatter([pts[i][0] for i in bad], [pts[i][1] for i in bad], s=30, marker="x",
                       color="grey", label="not publishable (verdict)", zorder=2)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.margins(x=0.08, y=0.12)  # room for the labels of the outermost points
        if not have:  # e.g. TPOT p50 0 (one-token answers): no 1000 / TPOT to plot
            ax.text(0.5, 0.5, "no run has this interactivity", ha="center",
                    transform=ax.transAxes, color="grey")
            ax.set_xticks([])
            ax.set_yticks([])
        place_labels(ax, [pts[i] for i in have],
                     [_point_label(rows[i]) + ("" if publishable(rows[i]) else
                                               f" ({rows[i]['validation'] or 'no verdict'})")
                      for i in have])
        star = [i for i in have if rows[i].get("slo_answer")]  # a sweep's SLO search answer
        if star:
            ax.scatter([pts[i][0] for i in star], [pts[i][1] for i in star], s=220,
                       marker="*", facecolors="none", edgecolors="black", lw=1.2,
                       label="SLO search answer", zorder=3)
        front = [i for i in frontier([p if publishable(r) else (None, None)
                                      for p, r in zip(pts, rows)], y in LOWER_BETTER)]
        if front:
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="C3", lw=1.5,
                    marker="o", mfc="none", ms=10, label="Pareto frontier")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if notes:
        fig.text(0.01, 0.01, "left off the frontier:\n" + "\n".join(notes), fontsize=7,
                 va="bottom", family="monospace")
    targets = sorted({r.get("target") or "" for r in rows})
    title = f"{y_label} against interactivity ({len(rows)} runs) — " + (
        targets[0] if len(targets) == 1 else f"{len(targets)} targets")
    return _save(plt, fig, path, title, bottom=(0.3 + 0.16 * len(notes)) / fig.get_figheight()
                 if notes else None)


def group_colours(rows: list[dict]) -> dict[str, str]:
    """Each operating point's (or label set's) colour, C0, C1, ... in the order the runs are
    given, not sorted by name: an A/B's runs come A first, so A is C0 and B C1 as in its CDF
    figure (agentx.ab.plot.SIDE_COLOURS); sorted names swapped them whenever B's label sorted
    first."""
    return {g: f"C{i % 10}" for i, g in enumerate(dict.fromkeys(_group(r) for r in rows))}


def wrap_title(title: str, fig_width_in: float) -> str:
    """A title's lines wrapped to the figure's width (~11 characters an inch at the default
    size): one long line (two URLs, a no-verdict note) ran past both edges and was cut."""
    width = max(40, int(fig_width_in * 11))
    return "\n".join(w for ln in title.splitlines()
                     for w in textwrap.wrap(ln, width, break_on_hyphens=False) or [""])


def _group(row: dict) -> str:
    return row.get("point") or row.get("labels") or ""


def _save(plt, fig, path: Path, title: str, bottom: float | None = None) -> Path:
    """Title wrapped to the figure's width (a long URL or A/B side used to be clipped), and
    the panels laid out under it."""
    fig.suptitle(wrap_title(title, fig.get_figwidth()))  # tight_layout makes room for it
    fig.tight_layout(rect=(0, bottom or 0, 1, 1))
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as e:
        raise InputError(str(path), f"cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return path


def _point_label(row: dict) -> str:
    """`p0-tp8 c8 · 1.5 in flight`: the lanes beside the requests in flight they made (a
    Pareto plot over lanes is read as over requests in flight); an open loop's rate."""
    side = next((kv.split("=", 1)[1] for kv in (row.get("labels") or "").split(";")
                 if kv.startswith("ab_side=")), None)  # an A/B side's run: its side's name
    base = row.get("point") or side or row.get("recipe") or Path(row["run"]).name
    load = f"c{row['conc']}" if row.get("conc") else row.get("load") or ""
    flight = row.get("in_flight_mean")
    return " ".join(x for x in (base, load) if x) + (
        f" · {flight:.1f} in flight" if flight is not None else "")


LABEL_OFFSETS = ((5, 4), (5, -11), (-5, 4), (-5, -11), (5, 14), (-5, 14), (5, -21), (-5, -21),
                 (5, 24), (-5, 24))  # points, tried in turn around a point


def place_labels(ax, pts: list[tuple[float, float]], texts: list[str], size: float = 7) -> None:
    """Annotate each point where its text overlaps no label placed before it and no other
    point, trying LABEL_OFFSETS in turn (the first when none is free): a sweep's cells sit
    close together and their labels overprinted. Text extents are estimated from the font
    size (0.6 em a character), in display units after the axes' limits are set."""
    if not pts:
        return
    ax.figure.canvas.draw()  # the limits the scatter set, so data -> display is final
    to_px = ax.transData.transform
    scale = ax.figure.dpi / 72  # points -> pixels
    dots = [to_px(p) for p in pts]
    frame = ax.bbox.extents  # a label past the axes' edge runs into the frame or is cut
    taken: list[tuple[float, float, float, float]] = []
    for pt, (x, y), text in zip(pts, dots, texts):
        w, h = 0.6 * size * len(text) * scale, size * 1.2 * scale
        best = None
        for dx, dy in LABEL_OFFSETS:
            x0 = x + dx * scale - (w if dx < 0 else 0)
            y0 = y + dy * scale
            box = (x0, y0, x0 + w, y0 + h)
            inside = (frame[0] <= box[0] and box[2] <= frame[2] and frame[1] <= box[1]
                      and box[3] <= frame[3])
            clear = inside and not any(_overlap(box, t) for t in taken) and not any(
                _overlap(box, (px - 3, py - 3, px + 3, py + 3)) for px, py in dots)
            if clear or best is None:
                best = (dx, dy, box)
            if clear:
                break
        dx, dy, box = best
        taken.append(box)
        ax.annotate(text, pt, xytext=(dx, dy), textcoords="offset points", fontsize=size,
                    ha="right" if dx < 0 else "left", va="bottom")


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
