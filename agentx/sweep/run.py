"""`agentx sweep`: every operating point of a recipe at each of its concurrencies, one result
directory per cell (`<out>/<point-label>/c<conc>/`), then the Pareto report over all cells.

A server is launched per point (relaunched when K changes with the concurrency or the server
died), or a given --base-url is used, or the simulator stands in with the recipe's profile
(agentx.targets). Before each cell the server's prefix cache is reset where it offers
/reset_prefix_cache (vLLM does only in dev mode), and every run sends its own cache salt, so
cells cannot warm each other. A failed cell is recorded in sweep.json and the sweep goes on.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..errors import InputError
from ..recipe.schema import Recipe
from ..rundir import write_json
from .cells import SUMMARY, SWEEP_JSON, Cell, SweepOptions, annotate, cell_config, finished, plan
from .servers import PointServers, choose, reset_prefix_cache


def run_cell(recipe: Recipe, cell: Cell, servers: PointServers, opts: SweepOptions) -> None:
    from ..run import run

    t0 = time.monotonic()
    try:
        target = servers.target(cell)
        cell.reset_prefix_cache = reset_prefix_cache(target.url)
        summary = run(cell_config(recipe, cell, opts, target.url, target.model,
                                  servers.path.parent), target)
        cell.verdict = (summary.get("validation") or {}).get("verdict")
        annotate(recipe, cell, {"backend": servers.kind,
                                "reset_prefix_cache": cell.reset_prefix_cache})
        if servers.died is not None:
            raise RuntimeError(f"the server exited (code {servers.died}) during the cell")
        cell.status = "ok"
    except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the sweep goes on
        cell.status, cell.error = "failed", f"{type(e).__name__}: {e}".strip()
    cell.seconds = round(time.monotonic() - t0, 3)


def write_record(path: Path, recipe: Recipe, backend: str, why: str, cells: list[Cell]) -> None:
    write_json(path, {"recipe": recipe.name, "backend": backend, "why": why,
                      "cells": [c.record() for c in cells]})


def sweep(recipe: Recipe, path: Path, opts: SweepOptions) -> list[Cell]:
    """Run every cell, then write runs.csv and pareto.png into the output directory."""
    from rich import progress as rp
    from rich.console import Console

    out = opts.output_dir
    if (out / SWEEP_JSON).exists() and not opts.resume:
        raise InputError(str(out), f"holds a sweep already ({SWEEP_JSON}): give --resume to "
                         "finish it, or another --output-dir", field="--output-dir")
    cells = plan(recipe, opts)
    for c in cells[:1]:  # the options every cell shares: refused before any server starts
        cell_config(recipe, c, opts, "http://127.0.0.1:1", None)
    backend, why = choose(recipe, opts)
    console = Console(stderr=True, soft_wrap=True)
    console.print(f"agentx sweep {recipe.name}: {len(cells)} cell(s) into {out}; serving with "
                  f"{why}")
    out.mkdir(parents=True, exist_ok=True)
    servers = PointServers(recipe, path, backend, opts, lambda m: console.print(f"  {m}"))
    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
               rp.TimeElapsedColumn())
    try:
        with rp.Progress(*columns, console=console) as bar:
            task = bar.add_task("cells", total=len(cells))
            for cell in cells:
                bar.update(task, description=f"{cell.label} c{cell.conc}")
                if opts.resume and finished(cell.dir):
                    cell.status = "skipped"
                else:
                    if servers.key is not None and servers.key[0] != cell.point:
                        servers.stop()  # the point changed: free its GPUs first
                    run_cell(recipe, cell, servers, opts)
                    if cell.error:
                        console.print(f"  [red]{cell.label} c{cell.conc} failed:[/red] "
                                      f"{cell.error.splitlines()[0]}")
                    elif cell.verdict not in (None, "pass"):
                        console.print(f"  [yellow]{cell.label} c{cell.conc}: verdict "
                                      f"{cell.verdict}[/yellow] (kept off the Pareto frontier)")
                write_record(out / SWEEP_JSON, recipe, backend, why, cells)
                bar.advance(task)
    finally:
        servers.stop()
    report(cells, out)
    return cells


def report(cells: list[Cell], out: Path) -> None:
    """runs.csv, pareto.png and the frontier table over every cell with a summary."""
    from ..report.console import make_console
    from ..report.rebuild import load_run
    from ..report.runs import report_many

    runs = [load_run(c.dir) for c in cells if (c.dir / SUMMARY).exists()]
    missing = [f"{c.label} c{c.conc}: failed: {(c.error or '').splitlines()[0][:90]}"
               for c in cells if c.status == "failed" and not (c.dir / SUMMARY).exists()]
    console = make_console()
    if not runs:
        console.print("agentx sweep: no cell produced results; see " + str(out / SWEEP_JSON))
        return
    report_many(runs, out, console, missing=missing)
