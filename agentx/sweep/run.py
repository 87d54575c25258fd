"""`agentx sweep`: every operating point of a recipe at each of its concurrencies, one result
directory per cell (`<out>/<point-label>/c<conc>/`), then the Pareto report over all cells.

A server is launched per point (relaunched when K changes with the concurrency or the server
died), or a given --base-url is used, or the simulator stands in with the recipe's profile
(agentx.targets). Before each cell the server's prefix cache is reset where it offers
/reset_prefix_cache (vLLM does only in dev mode), and every run sends its own cache salt, so
cells cannot warm each other. A failed cell is recorded in sweep.json and the sweep goes on.

With --search (agentx.sweep.search) the cells are not the recipe's list: per point, bisection
over the concurrency picks them, on the point's one server, until the highest concurrency whose
goodput meets the target is bracketed or the cell budget is spent; the answer goes into
sweep.json (`search`), onto the console and, starred, onto pareto.png.
"""
from __future__ import annotations

import time
from pathlib import Path

import orjson
from rich.console import Console

from ..errors import InputError
from ..recipe.schema import Recipe
from ..rundir import SweepDir, write_json
from .cells import (
    SUMMARY,
    SWEEP_JSON,
    URL_SWEEP,
    Cell,
    annotate,
    cell_config,
    check_resumed,
    finished,
    load_summary,
    make_cell,
    plan,
    point_indices,
)
from .config import SweepConfig
from .search import LENGTHEN, THIN, Outcome, Probe, SloSearch, bisect, judge
from .servers import PointServers, choose, reset_prefix_cache


def run_cell(recipe: Recipe, cell: Cell, servers: PointServers, cfg: SweepConfig) -> None:
    from ..run import run

    t0 = time.monotonic()
    try:
        target = servers.target(cell)
        cell.reset_prefix_cache = reset_prefix_cache(target.url)
        summary = run(cell_config(recipe, cell, cfg, target.url, target.model,
                                  servers.path.parent), target)
        cell.verdict = (summary.get("validation") or {}).get("verdict")
        if recipe.name != URL_SWEEP:  # a bare URL's cells claim no recipe facts
            annotate(recipe, cell, {"kind": servers.kind,
                                    "reset_prefix_cache": cell.reset_prefix_cache})
        if servers.died is not None:
            raise RuntimeError(f"the server exited (code {servers.died}) during the cell")
        cell.status = "ok"
    except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the sweep goes on
        cell.status, cell.error = "failed", f"{type(e).__name__}: {e}".strip()
    cell.seconds = round(time.monotonic() - t0, 3)


def write_record(path: Path, recipe: Recipe, kind: str, why: str, cells: list[Cell],
                 search: dict | None = None) -> None:
    """sweep.json: the recipe, what served it (`kind`: targets.choice.Kind; `backend`
    before 2026-12-03, read_record reads both), every cell, the search."""
    data = {"recipe": recipe.name, "kind": kind, "why": why,
            "cells": [c.record() for c in cells]}
    if search is not None:
        data["search"] = search
    write_json(path, data)


def read_record(path: Path) -> dict:
    """sweep.json as written now, from any version: before 2026-12-03 `kind` was `backend`."""
    data = orjson.loads(path.read_bytes())
    if "backend" in data and "kind" not in data:
        data["kind"] = data.pop("backend")
    return data


def step(recipe: Recipe, path: Path, cell: Cell, servers: PointServers, cfg: SweepConfig,
         console: Console) -> None:
    """Run one cell (or, with --resume, take its finished result after checking it ran this
    sweep's config), then read its verdict and goodput back."""
    resumed = cfg.resume and finished(cell.dir)
    if resumed:
        check_resumed(recipe, cell, cfg, path.parent)
        cell.status = "skipped"
    else:
        if servers.key is not None and servers.key[0] != cell.point:
            servers.stop()  # the point changed: free its GPUs first
        run_cell(recipe, cell, servers, cfg)
        if cell.error:
            console.print(f"  [red]{cell.label} c{cell.conc} failed:[/red] "
                          f"{cell.error.splitlines()[0]}")
    if not (cell.dir / SUMMARY).exists():
        return
    summary = load_summary(cell.dir)
    validation = summary.get("validation") or {}
    cell.verdict = validation.get("verdict")
    cell.goodput = ((summary.get("goodput") or {}).get("met") or {}).get("all")
    if not resumed and not cell.error and cell.verdict not in (None, "pass"):
        # a cell kept off the frontier says why: the validation's first reason (machine
        # load, errors, a thin run)
        reasons = validation.get("reasons") or []
        console.print(f"  [yellow]{cell.label} c{cell.conc}: verdict {cell.verdict}[/yellow]"
                      + (f": {reasons[0]}" if reasons else "") + " (kept off the Pareto frontier)",
                      highlight=False)


def sweep(recipe: Recipe, path: Path, cfg: SweepConfig) -> list[Cell]:
    """Run every cell (or, with a search, the cells its bisection picks per point), then write
    runs.csv and pareto.png into the output directory."""
    from rich import progress as rp

    out = Path(str(cfg.output_dir))
    SweepDir(out).check(cfg.resume)
    search = cfg.slo_search()
    cells = plan(recipe, cfg)
    bounds = {i: search_bounds(recipe, cfg, i) for i in point_indices(recipe, cfg)} \
        if search else {}
    for c in cells[:1]:  # the options every cell shares: refused before any server starts
        cell_config(recipe, c, cfg, "http://127.0.0.1:1", None)
    for c in cells if cfg.resume else []:  # so are finished cells run with another config
        if finished(c.dir):
            check_resumed(recipe, c, cfg, path.parent)
    choice = choose(recipe, path, cfg)
    kind, why = choice.kind, choice.why
    console = Console(stderr=True, soft_wrap=True)
    what = f"{len(cells)} cell(s)" if search is None else \
        f"SLO search over {len(bounds)} point(s), at most {search.max_cells} cell(s) each"
    console.print(f"agentx sweep {recipe.name}: {what} into {out}; serving with {why}")
    SweepDir(out).create(cfg.resume).register(SWEEP_JSON)
    servers = PointServers(recipe, path, choice, lambda m: console.print(f"  {m}"))
    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
               rp.TimeElapsedColumn())
    searched: dict | None = None
    try:
        with rp.Progress(*columns, console=console) as bar:
            if search is None:
                task = bar.add_task("cells", total=len(cells))
                for cell in cells:
                    bar.update(task, description=f"{cell.label} c{cell.conc}")
                    step(recipe, path, cell, servers, cfg, console)
                    write_record(out / SWEEP_JSON, recipe, kind, why, cells)
                    bar.advance(task)
            else:
                cells, searched = [], {**search.record(), "points": {}}
                task = bar.add_task("cells", total=len(bounds) * search.max_cells)

                def probe(point: int, conc: int) -> Probe:
                    cell = make_cell(recipe, cfg, point, conc)
                    bar.update(task, description=f"search {cell.label} c{conc}")
                    cells.append(cell)
                    step(recipe, path, cell, servers, cfg, console)
                    longer = lengthen(recipe, path, cell, servers, cfg, console)
                    write_record(out / SWEEP_JSON, recipe, kind, why, cells, searched)
                    bar.advance(task)
                    p = judge(conc, cell.status, cell.verdict, cell.goodput, search.goodput,
                              cell.error)
                    p.lengthened_s = longer
                    return p

                for i, (lo, hi) in bounds.items():
                    result = bisect(lo, hi, lambda c, i=i: probe(i, c), search.max_cells)
                    label = recipe.points[i].label(i)
                    searched["points"][label] = result.record()
                    mark_answer(recipe, cfg, i, result, search)
                    write_record(out / SWEEP_JSON, recipe, kind, why, cells, searched)
                    console.print(f"  [bold]{label}[/bold]: highest concurrency with goodput "
                                  f">= {search.goodput:g} ({slo_text(search.slo)}): "
                                  f"{result.text()}")
    finally:
        servers.stop()
    report(cells, out)
    if searched is not None and (out / SweepDir.PARETO).exists():
        searched["marked_on"] = SweepDir.PARETO  # the answers are starred there
        write_record(out / SWEEP_JSON, recipe, kind, why, cells, searched)
    return cells


def lengthen(recipe: Recipe, path: Path, cell: Cell, servers: PointServers,
             cfg: SweepConfig, console: Console) -> list[float]:
    """A search cell whose verdict is `insufficient` is rerun at LENGTHEN times its duration
    (same directory, labelled `search_lengthened`) until it has enough requests to judge, and
    the console says so: a thin cell is no evidence either way. The durations tried."""
    base = cell_config(recipe, cell, cfg, "http://127.0.0.1:1", None).duration_s
    cfg = cfg.model_copy(update={"resume": False})  # the thin result on disk is rerun
    tried: list[float] = []
    for factor in LENGTHEN:
        if cell.verdict != THIN or cell.status == "skipped" or not base:
            break
        cell.duration_s = base * factor
        tried.append(cell.duration_s)
        console.print(f"  {cell.label} c{cell.conc}: verdict insufficient (too few measured "
                      f"requests to judge); the search reruns it {factor}x as long, "
                      f"{cell.duration_s:g} s, before judging it")
        step(recipe, path, cell, servers, cfg, console)
    return tried


def search_bounds(recipe: Recipe, cfg: SweepConfig, point: int) -> tuple[int, int]:
    """The concurrency range searched at a point: --search-min/--search-max, else the ends of
    the point's concurrency list (or --conc)."""
    listed = cfg.conc or recipe.points[point].conc
    lo = cfg.search_min or min(listed)
    hi = cfg.search_max or max(listed)
    if lo > hi:
        raise InputError("command line", f"search range {lo}..{hi} is empty at point "
                         f"{recipe.points[point].label(point)}", field="--search-min")
    return lo, hi


def mark_answer(recipe: Recipe, cfg: SweepConfig, point: int, result: Outcome,
                search: SloSearch) -> None:
    """Record in the answer cell's summary.json that it is the point's answer (the Pareto
    report reads it to star the cell)."""
    if result.answer is None:
        return
    cell = make_cell(recipe, cfg, point, result.answer)
    summary = load_summary(cell.dir)
    summary.setdefault("sweep", {})["slo_answer"] = {
        **search.record(), "lowest_failing": result.failing, "converged": result.converged}
    write_json(cell.dir / SUMMARY, summary)


def slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items())


def undecided(cells: list[Cell], out: Path) -> str | None:
    """Why a sweep decided nothing (None when it did): no cell ran to a verdict that can be
    published (pass, or validation off), or a search point stayed undecided. `agentx sweep`
    then exits 3, as `agentx run` does on an insufficient or failed verdict."""
    ran = [c for c in cells if c.status != "failed"]
    if ran and not any(c.verdict in (None, "pass") for c in ran):
        verdicts = ", ".join(f"{c.label} c{c.conc} {c.verdict}" for c in ran)
        return (f"no cell has a verdict that can be published ({verdicts}): the Pareto "
                "frontier is empty; run longer (--duration) or see docs/recipes.md#sweeps")
    try:
        search = read_record(out / SWEEP_JSON).get("search") or {}
    except (OSError, orjson.JSONDecodeError):
        return None
    thin = [f"{label} at c{p['undecided']}" for label, p in (search.get("points") or {}).items()
            if p.get("undecided") is not None]
    return (f"the search stayed undecided ({', '.join(thin)}: too few measured requests even "
            "lengthened): raise --duration") if thin else None


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
