"""The A/B figure: TTFT and TPOT CDFs of both sides on shared axes (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..records import read_records
from ..report.plots import _pyplot, _save, metric_values

PANELS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"))


def _values(run_dirs: list[str], tag: str) -> np.ndarray:
    return np.sort(np.concatenate([metric_values(read_records(Path(d) / "requests.jsonl"), tag)
                                   for d in run_dirs] or [np.array([])]))


def cdf_plot(doc: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4))
    for ax, (tag, label) in zip(axes, PANELS):
        for name, color in (("a", "tab:blue"), ("b", "tab:orange")):
            v = _values(doc[name]["runs"], tag)
            if v.size:
                ax.plot(v, np.arange(1, v.size + 1) / v.size, lw=1.5, color=color,
                        label=f"{name.upper()} (p50 {np.percentile(v, 50):,.1f})")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("fraction of requests")
    return _save(plt, fig, path, f"A: {doc['a'].get('spec')}   B: {doc['b'].get('spec')}")
