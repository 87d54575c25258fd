"""The A/B figure: CDFs of both sides on shared axes (matplotlib, Agg), one panel per catalog
metric drawn in it (TTFT and TPOT)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..metrics.catalog import AB_CDF, cdf_metrics
from ..records import read_records
from ..report.plots import _pyplot, _save, metric_values
from ..rundir import RunDir


def _values(run_dirs: list[str], tag: str) -> np.ndarray:
    return np.sort(np.concatenate([metric_values(read_records(Path(d) / RunDir.REQUESTS), tag)
                                   for d in run_dirs] or [np.array([])]))


SIDE_COLOURS = {"a": "C0", "b": "C1"}  # the colours every figure gives A and B


def cdf_plot(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    panels = cdf_metrics(AB_CDF)
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4), squeeze=False)
    axes = axes[0]
    for ax, m in zip(axes, panels):
        for name, color in SIDE_COLOURS.items():
            v = _values(doc[name]["runs"], m.key)
            side = doc[name].get("label") or name.upper()
            if v.size:  # a step per value, and a dot each when few: one value still shows
                ax.step(np.concatenate([[v[0]], v]),
                        np.concatenate([[0.0], np.arange(1, v.size + 1) / v.size]),
                        where="post", lw=1.5, color=color, marker="o" if v.size < 30 else None,
                        ms=3, label=f"{side} (n {v.size}, p50 {np.percentile(v, 50):,.1f})")
            else:
                ax.plot([], [], color=color, label=f"{side}: no values")
        ax.set_xlabel(m.axis)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("fraction of requests")
    note = "; ".join(f"{doc[k.lower()].get('label') or k}: {v}"
                     for k, v in (doc.get("insufficient") or {}).items())
    title = (f"{doc['a'].get('label') or 'A'}: {doc['a'].get('spec')}   "
             f"{doc['b'].get('label') or 'B'}: {doc['b'].get('spec')}"
             + (f"\nno verdict: {note}" if note else ""))
    return _save(plt, fig, path, title)
