"""The cache-cliff planner's table and figure (`agentx cliff`; the figures themselves:
agentx/cache_theory/cliff.py): predicted hit rate per tier against lanes, each tier's cliff, and
the measured points of `--verify` over them."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

TIERS = (("hit_rate", "total", "C0"), ("gpu", "GPU pool", "C2"), ("offload", "offload tier", "C1"))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def print_cliff(doc: dict, console: Console) -> None:
    off = doc.get("offload_tokens")
    t = Table(title=f"predicted prefix-cache hit rate, trace {doc['trace']}: GPU pool "
                    f"{doc['pool_tokens']:,} tokens"
                    + (f" + offload {off:,} tokens ({'eager' if doc['offload_eager'] else 'lazy'})"
                       if off else ""))
    for c in ("lanes", "requests", "total", "GPU pool", *(("offload tier",) if off else ())):
        t.add_column(c, justify="right")
    for p in doc["points"]:
        t.add_row(str(p["lanes"]), str(p["requests"]), _pct(p["hit_rate"]), _pct(p["gpu"]),
                  *((_pct(p["offload"]),) if off else ()))
    console.print(t)
    for key, name, _ in TIERS:
        c = (doc.get("cliffs") or {}).get(key)
        if key == "offload" and not off:
            continue
        console.print(f"cliff, {name}: " + (
            f"holds to {c['holds_to']} lanes ({_pct(c['from'])}), collapsed at {c['at']} "
            f"({_pct(c['to'])})" if c else "none over these lane counts"))
    for m in doc.get("measured") or []:
        console.print(f"measured on the simulator at {m['lanes']} lanes: hit {_pct(m['hit_rate'])} "
                      f"(the run's pool-aware theory {_pct(m['theory_pool'])}; "
                      f"{m['completed']} requests)")


def cliff_plot(doc: dict, path: Path) -> Path:
    from .plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    pts = doc["points"]
    for key, name, colour in TIERS:
        ys = [p[key] for p in pts]
        if all(y is None for y in ys):
            continue
        wide = {"lw": 5, "alpha": 0.35} if key == "hit_rate" else {}  # under the tiers' lines
        ax.plot([p["lanes"] for p in pts], [100 * y if y is not None else float("nan")
                                            for y in ys], "o-", color=colour,
                label=f"predicted: {name}", **wide)
        c = (doc.get("cliffs") or {}).get(key)
        if c:
            ax.axvline(c["at"], color=colour, ls=":", lw=1)
            ax.annotate(f"{name} cliff: {c['holds_to']}->{c['at']}", (c["at"], 50 + 8 *
                        [k for k, _, _ in TIERS].index(key)), fontsize=8, color=colour)
    m = doc.get("measured") or []
    if m:
        ax.plot([x["lanes"] for x in m], [100 * x["hit_rate"] if x["hit_rate"] is not None
                                          else float("nan") for x in m], "k*", ms=12,
                label="measured on the simulator (total)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("session lanes")
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    off = doc.get("offload_tokens")
    title = (f"cache cliff: {doc['trace']}, GPU pool {doc['pool_tokens']:,} tok"
             + (f" + offload {off:,} tok" if off else ""))
    return _save(plt, fig, path, title)
