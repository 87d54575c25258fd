"""Per-session and per-turn results as files, a console line, an HTML section and a plot
(the figures themselves: metrics/sessions.py).

sessions.csv has one row per session of the run, turns.csv one row per bin (by turn index,
then by prompt length); both are written once per run through the run directory's manifest
(`RunDir.SESSIONS_CSV`, `RunDir.TURNS_CSV`), by the run and by `agentx report` for a run that
has none. `per_turn.png` draws TTFT p50/p90 and the achieved hit rate against turn index and
against prompt length, n written at every point.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

from ..metrics.sessions import bin_label, per_turn, session_rows
from ..rundir import RunDir, write_bytes

SESSION_COLUMNS = ("session_id", "trace_id", "lane", "first_turn", "last_turn", "turns",
                   "requests", "subagent_requests", "failed", "warmup_requests", "measured",
                   "complete", "wall_s", "server_s", "think_s", "server_share", "input_tokens",
                   "output_tokens", "cached_tokens", "hit_rate", "ttft_ms_mean")
TURN_COLUMNS = ("axis", "lo", "hi", "n", "ttft_n", "ttft_p50_ms", "ttft_p90_ms", "ttft_mean_ms",
                "hit_rate", "hit_n", "prompt_tokens_mean")


def _csv(rows: Sequence[Mapping], columns: Sequence[str]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if r.get(k) is None else r[k]) for k in columns} for r in rows)
    return buf.getvalue().encode()


def write_session_files(run_dir: str | Path, records: Sequence[Mapping],
                        last_turns: Mapping[str, int] | None = None) -> list[Path]:
    """sessions.csv and turns.csv of a run, registered in its manifest."""
    rd = RunDir(run_dir)
    turns = per_turn(records)
    paths = [write_bytes(rd / RunDir.SESSIONS_CSV,
                         _csv(session_rows(records, last_turns), SESSION_COLUMNS)),
             write_bytes(rd / RunDir.TURNS_CSV,
                         _csv([*turns["by_turn"], *turns["by_context"]], TURN_COLUMNS))]
    rd.register(RunDir.SESSIONS_CSV, RunDir.TURNS_CSV)
    return paths


def _f(v: object, nd: int = 1) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:,.{nd}f}"


def _p50(block: Mapping, key: str) -> object:
    return (block.get(key) or {}).get("p50")


def sessions_line(summary: Mapping) -> str | None:
    """`sessions: 12 of 20 counted (complete, all measured); p50 per session: 6 turns, 41.2 s
    wall (31% on the server, the rest thinking), 52,100 input tokens, hit 93.1%`."""
    ps = summary.get("per_session")
    if not ps:
        return None
    head = f"sessions: {ps['counted']} of {ps['sessions']} counted (complete, all measured)"
    if not ps["counted"]:
        return head + " — no per-session figures (run longer than a session lasts)"
    share, hit = _p50(ps, "server_share"), _p50(ps, "hit_rate")
    return (f"{head}; p50 per session: {_f(_p50(ps, 'turns'), 0)} turns, "
            f"{_f(_p50(ps, 'wall_s'))} s wall "
            f"({'-' if share is None else f'{100 * share:.0f}%'} on the server, the rest "
            f"thinking), {_f(_p50(ps, 'input_tokens'), 0)} input tokens, hit "
            f"{'-' if hit is None else f'{100 * hit:.1f}%'}")


def per_turn_plot(summary: Mapping, path: Path, title: str) -> Path:
    """TTFT p50 and p90 (left axis) and the achieved hit rate (right axis) against turn index
    and against prompt length, one point per bin, n over each point."""
    from .plots import _pyplot, _save

    plt = _pyplot()
    pt = summary.get("per_turn") or {}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for ax, key, xlabel in ((axes[0], "by_turn", "turn index in the trace (bin)"),
                            (axes[1], "by_context", "prompt tokens (bin)")):
        bins = pt.get(key) or []
        ax.set_xlabel(xlabel)
        ax.set_ylabel("TTFT (ms)")
        ax.grid(alpha=0.3)
        if not bins:
            ax.text(0.5, 0.5, "no measured requests", ha="center", transform=ax.transAxes)
            continue
        x = list(range(len(bins)))
        for q, style in (("ttft_p50_ms", "o-"), ("ttft_p90_ms", "s--")):
            ax.plot(x, [b[q] if b[q] is not None else float("nan") for b in bins], style,
                    label=f"TTFT {q.split('_')[1]}")
        for i, b in enumerate(bins):
            if b["ttft_p90_ms"] is not None:
                ax.annotate(f"n {b['n']}", (i, b["ttft_p90_ms"]), textcoords="offset points",
                            xytext=(0, 5), ha="center", fontsize=7)
        ax.set_xticks(x, [bin_label(b) for b in bins], rotation=30, fontsize=8)
        ax.margins(y=0.15)  # room for the n labels
        hit = ax.twinx()
        hit.plot(x, [100 * b["hit_rate"] if b["hit_rate"] is not None else float("nan")
                     for b in bins], "^:", color="tab:green", label="hit rate")
        hit.set_ylim(0, 105)
        hit.set_ylabel("achieved prefix hit rate (%)")
        lines = ax.get_legend_handles_labels()
        more = hit.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    return _save(plt, fig, path, title)


def html_section(summary: Mapping) -> str:
    """The per-session distributions and the per-turn bins as two tables."""
    ps, pt = summary.get("per_session"), summary.get("per_turn")
    if not ps and not pt:
        return ""
    out = []
    if ps:
        rows = "".join(
            f"<tr><td>{escape(k)}</td><td class=n>{(ps.get(k) or {}).get('count', 0)}</td>"
            + "".join(f"<td class=n>{_cell(k, (ps.get(k) or {}).get(p))}</td>"
                      for p in ("mean", "p50", "p90"))
            + "</tr>" for k in ("turns", "requests", "wall_s", "server_s", "think_s",
                                "server_share", "input_tokens", "output_tokens", "hit_rate",
                                "ttft_ms_mean"))
        out.append(f"<h3>per session</h3><p>{ps['sessions']} sessions, {ps['complete']} "
                   f"complete, {ps['counted']} counted: {escape(ps['definition'])}.</p>"
                   f"<table><tr><th>per session</th><th>n</th><th>mean</th><th>p50</th>"
                   f"<th>p90</th></tr>{rows}</table>")
    for key, name in (("by_turn", "turn index"), ("by_context", "prompt tokens")):
        bins = (pt or {}).get(key) or []
        if not bins:
            continue
        rows = "".join(
            f"<tr><td>{escape(bin_label(b))}</td><td class=n>{b['n']}</td>"
            f"<td class=n>{_f(b['ttft_p50_ms'])}</td><td class=n>{_f(b['ttft_p90_ms'])}</td>"
            f"<td class=n>{_cell('hit_rate', b['hit_rate'])}</td>"
            f"<td class=n>{_f(b['prompt_tokens_mean'], 0)}</td></tr>" for b in bins)
        out.append(f"<table><caption>measured requests by {name}</caption><tr><th>{name}</th>"
                   f"<th>n</th><th>TTFT p50 ms</th><th>TTFT p90 ms</th><th>hit rate</th>"
                   f"<th>prompt tokens mean</th></tr>{rows}</table>")
    return "".join(out)


def _cell(key: str, v: object) -> str:
    if key in ("hit_rate", "server_share"):
        return "-" if not isinstance(v, (int, float)) else f"{100 * v:.1f}%"
    return _f(v)
