"""ab.json and the console table of an A/B comparison."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from ..report.console import make_console

VERDICT_STYLE = {"a_better": "[bold]{a} better[/bold]", "b_better": "[bold]{b} better[/bold]",
                 "no_difference": "no difference", "insufficient": "[yellow]insufficient[/yellow]"}


def _f(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.3g}"


def print_ab(doc: dict, console: Console | None = None, command: str = "ab") -> None:
    """One row per metric: A, B, B - A with its 95% interval, B / A, verdict."""
    console = console or make_console()
    la, lb = doc["a"].get("label") or "A", doc["b"].get("label") or "B"
    t = Table(title=f"agentx {command} — {la}: {doc['a'].get('spec')}  {lb}: {doc['b'].get('spec')}")
    for c in ("metric", la, lb, f"{lb} - {la}", "95% CI", f"{lb} / {la}", "verdict"):
        t.add_column(c, justify="left" if c in ("metric", "verdict") else "right",
                     no_wrap=c in ("95% CI", "verdict"))
    for m in doc["metrics"].values():
        pct = m.get("unit") == "fraction"  # the catalog's unit: printed as a percentage
        ci = f"[{_f(m['ci_low'], pct)}, {_f(m['ci_high'], pct)}]"
        ratio = "-" if m["ratio"] is None else f"{m['ratio']:.3f}"
        t.add_row(m["label"], _f(m["a"], pct), _f(m["b"], pct), _f(m["diff"], pct), ci, ratio,
                  VERDICT_STYLE[m["verdict"]].format(a=la, b=lb))
    how = doc["bootstrap"].get("resampled", "sessions")
    t.caption = f"95% CI: bootstrap interval of {lb} - {la}, resampling {how}"
    console.print(t)
    for side, why in (doc.get("insufficient") or {}).items():
        console.print(f"[yellow]no verdict:[/yellow] side {doc[side.lower()].get('label') or side}"
                      f": {why}; run longer (--duration, --repeats) or with more lanes")
    for name in ("a", "b"):
        s = doc[name]
        console.print(f"{s.get('label') or name.upper()}: {s.get('kind', '?')} "
                      f"{s.get('base_url', '')}, "
                      f"{s['completed']} requests in {doc['sessions'][name]} sessions, "
                      f"validation {', '.join(str(v) for v in s['validation'])}; runs: "
                      + ", ".join(s["runs"]))
        runs = doc.get("per_run", {}).get(name, [])
        if len(runs) > 1:  # the run-to-run spread the interval accounts for
            console.print(f"  {s.get('label') or name.upper()} per run: TTFT p50 "
                          + " / ".join(_f(r and r["ttft_p50_ms"]) for r in runs)
                          + " ms; output tok/s "
                          + " / ".join(_f(r and r["output_tok_s"]) for r in runs))
    b = doc["bootstrap"]
    console.print(f"intervals: {b['replicates']} bootstrap replicates resampling {how} "
                  f"(seed {b['seed']}); verdict = the interval of B - A excludes 0")
    for w in doc.get("warnings", []):
        print(f"agentx: warning: {w}", file=sys.stderr)
