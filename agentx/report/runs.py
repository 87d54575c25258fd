"""Reports of finished (or killed) runs: one run -> its console table and PNG plots; several
-> one CSV row each, and the Pareto frontier as PNG and table (`agentx report`, and a sweep's
closing report)."""
from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import InputError
from ..rundir import ReportDir, RunDir
from .pareto import (
    INTERACTIVITY,
    frontier_key,
    in_flight_text,
    mark_frontiers,
    run_row,
    short_names,
    throughput_axis,
)
from .rebuild import Run, last_turns_of
from .target import load_text, target_text


def report_one(run: Run, console: Console, *, plots: bool = True) -> int:
    from .console import print_summary

    print_summary(run.summary, console)
    if not (run.dir / RunDir.SESSIONS_CSV).exists():  # a run from before they were written
        from ..errors import OutputError
        from .sessions import write_session_files

        try:
            write_session_files(run.dir, run.records, last_turns_of(run.summary))
        except OutputError as e:  # a read-only run directory: the report goes on without them
            console.print(f"agentx report: {e.path}: not written ({e.reason})")
    if plots:
        from .plots import gpu_power, latency_cdfs, server_timeseries
        from .sessions import per_turn_plot

        title = plot_title(run)
        made = [latency_cdfs(run.records, run.dir / RunDir.LATENCY_CDF, title)]
        if run.metrics:
            made.append(server_timeseries(run.metrics, run.dir / RunDir.SERVER_TIMESERIES,
                                          title, run.summary, run.records))
        if run.gpu:
            made.append(gpu_power(run.gpu, run.dir / RunDir.GPU_POWER, title, run.summary,
                                  run.records))
        made.append(per_turn_plot(run.summary, run.dir / RunDir.PER_TURN, title))
        RunDir(run.dir).register(*(p.name for p in made))  # --overwrite removes them, nothing else
        console.print("plots: " + ", ".join(str(p) for p in made))
    return 0


def plot_title(run: Run) -> str:
    """`DIR: trace swe, conc 8 — simulator PROFILE; labels` for a run's plots (an open loop:
    `rate 0.5/s`, not the unused --conc)."""
    cfg = run.summary.get("config") or {}
    return (f"{run.dir.name}: trace {cfg.get('trace') or '?'}, {load_text(cfg, short=True)} — "
            f"{target_text(run.summary)}")


def report_many(runs: list[Run], out: Path, console: Console, *, goodput: bool = False,
                gpus: int | None = None, plots: bool = True, missing: list[str] = (),
                cost: bool = False) -> int:
    """runs.csv, the frontier table and pareto.png; `missing`: runs that produced no result
    (a sweep's failed cells), listed under the plot."""
    rows = [run_row(str(r.dir), r.summary, r.records, gpus) for r in runs]
    y, y_label = throughput_axis(rows, goodput, cost)
    if cost and all(r[y] is None for r in rows):
        raise InputError(rows[0]["run"], "has no cost: give --gpu-hour-usd (and --gpus for "
                         "runs that did not record their GPU count)", field="--cost")
    if goodput:
        missing = [r["run"] for r in rows if r[y] is None]
        if missing:
            raise InputError(missing[0], "has no goodput (it ran without --slo): give "
                             "--slo ttft:MS,... to compute it from the records", field="--goodput")
    mark_frontiers(rows, y)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / ReportDir.RUNS_CSV)
    print_pareto(rows, y, y_label, console)
    console.print(f"csv: {out / ReportDir.RUNS_CSV}")
    if plots:
        from .plots import pareto_plot

        console.print(f"plot: {pareto_plot(rows, out / ReportDir.PARETO, y, y_label, missing)}")
    return 0


def write_csv(rows: list[dict], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        # runs with different --percentiles have different columns: every one, first seen first
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return path


def print_pareto(rows: list[dict], y: str, y_label: str, console: Console) -> None:
    t = Table(title=f"{len(rows)} runs: {y_label} against interactivity in tok/s/user "
                    "(* = on the Pareto frontier; runs whose verdict is not pass stay off it)")
    for c in ("run", "load", "in flight mean/p90", "n", y_label.replace(" per GPU", "/GPU"),
              "TTFT p50 ms",
              "TPOT p50 ms", "1000/TPOT p50", "1000/p90(E2E/OSL)", "verdict"):
        t.add_column(c, justify="left" if c in ("run", "verdict") else "right")
    short = dict(zip([r["run"] for r in rows], short_names([r["run"] for r in rows])))
    for r in sorted(rows, key=lambda r: (r["conc"] or 0, r["run"])):
        inter = [_f(r[c]) + (" *" if r[frontier_key(c)] else "") for c, _ in INTERACTIVITY]
        name = short[r["run"]]
        t.add_row(f"{r['point']}/{name}" if r["point"] else name, r["load"],
                  in_flight_text(r), str(r["completed"]), _f(r[y]),
                  _f(r["ttft_p50_ms"]), _f(r["tpot_p50_ms"]), *inter, r["validation"]
                  + (" (rebuilt)" if r["rebuilt"] else ""))
    console.print(t)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


