"""`agentx sweep`: every operating point of a recipe at each of its concurrencies, one result
directory per cell (`<out>/<point-label>/c<conc>/`), then the Pareto report over all cells.

A server is launched per point (relaunched when K changes with the concurrency or the server
died), or a given --base-url is used, or the embedded simulator stands in with the recipe's
profile. Before each cell the server's prefix cache is reset where it offers
/reset_prefix_cache (vLLM does only in dev mode), and every run sends its own cache salt, so
cells cannot warm each other. A failed cell is recorded in sweep.json and the sweep goes on.
"""
from __future__ import annotations

import importlib.util
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import ValidationError

from ..config import RunConfig
from ..errors import InputError
from ..options import input_error
from ..outdir import write_json
from ..urls import normalise_base_url
from .inferencex import inferencex_fields
from .render import golden_pin
from .schema import Recipe, spec_k
from .serve import ServerHandle, ServerStartError, launch

SWEEP_JSON, SUMMARY = "sweep.json", "summary.json"
Say = Callable[[str], None]


@dataclass
class SweepOptions:
    output_dir: Path
    base_url: str | None = None
    sim: bool = False
    points: list[int] | None = None  # indices; None = all
    conc: list[int] | None = None  # overrides every point's list
    resume: bool = False
    run: dict = field(default_factory=dict)  # RunConfig overrides (duration_s, warmup_s, ...)
    sim_time_scale: float | None = None
    health_timeout: float | None = None


@dataclass
class Cell:
    point: int
    label: str
    conc: int
    dir: Path
    status: str = "pending"  # ok | failed | skipped
    error: str | None = None
    verdict: str | None = None  # the run's validation verdict (pass, insufficient, fail, ...)
    reset_prefix_cache: str | None = None
    seconds: float | None = None

    def record(self) -> dict:
        return {"point": self.point, "label": self.label, "conc": self.conc,
                "dir": str(self.dir), "status": self.status, "verdict": self.verdict,
                "error": self.error,
                "reset_prefix_cache": self.reset_prefix_cache, "seconds": self.seconds}


def choose_backend(recipe: Recipe, opts: SweepOptions) -> tuple[str, str]:
    """("url" | "sim" | "vllm", why): what serves the cells."""
    if opts.base_url:
        return "url", f"the server at {opts.base_url}"
    if opts.sim:
        return "sim", "the simulator (--sim)"
    missing = None
    if recipe.hardware != "cpu" and shutil.which("nvidia-smi") is None:
        missing = "no GPU (nvidia-smi not on PATH)"
    elif recipe.command[0] == "vllm" and shutil.which("vllm") is None \
            and importlib.util.find_spec("vllm") is None:
        missing = "vLLM is not installed"
    if missing is None:
        return "vllm", f"launching `{' '.join(recipe.command)}` per point"
    if recipe.sim_profile is None:
        raise InputError(recipe.name or "recipe", f"{missing} and the recipe names no "
                         "simulator profile to stand in", field="sim_profile")
    return "sim", f"the simulator with profile {recipe.sim_profile} ({missing})"


def plan(recipe: Recipe, opts: SweepOptions) -> list[Cell]:
    indices = opts.points if opts.points is not None else range(len(recipe.points))
    cells = []
    for i in indices:
        if not 0 <= i < len(recipe.points):
            raise InputError("command line", f"no point {i} (the recipe has "
                             f"{len(recipe.points)})", field="--points")
        p = recipe.points[i]
        label = p.label(i)
        cells += [Cell(i, label, c, opts.output_dir / label / f"c{c}")
                  for c in (opts.conc or p.conc)]
    return cells


def finished(cell_dir: Path) -> bool:
    """A cell whose run wrote its summary (a summary rebuilt by `agentx report` does not count)."""
    try:
        return not orjson.loads((cell_dir / SUMMARY).read_bytes()).get("rebuilt")
    except (OSError, orjson.JSONDecodeError):
        return False


def reset_prefix_cache(base_url: str) -> str:
    """POST /reset_prefix_cache; what happened, for the cell's record."""
    req = urllib.request.Request(base_url + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return "reset" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return "not available" if e.code in (404, 405) else f"failed: HTTP {e.code}"
    except OSError as e:
        return f"failed: {e}"


class Servers:
    """The server behind the current cell: launched for the point (and the cell's K when K
    depends on the concurrency), relaunched after it died, stopped when the point changes."""

    def __init__(self, recipe: Recipe, path: Path, backend: str, opts: SweepOptions,
                 say: Say) -> None:
        self.recipe, self.path, self.backend, self.opts, self.say = recipe, path, backend, \
            opts, say
        self.handle: ServerHandle | None = None
        self.key: tuple | None = None
        self.failed: tuple[tuple, str] | None = None  # a start that failed, not retried

    def url_and_model(self, cell: Cell) -> tuple[str, str | None]:
        if self.backend == "url":
            return normalise_base_url(self.opts.base_url or ""), None
        point = self.recipe.points[cell.point]
        try:
            key = (cell.point, spec_k(self.recipe, point, cell.conc))
        except ValueError as e:
            raise InputError(str(self.path), str(e), field=f"points.{cell.point}") from None
        if self.failed and self.failed[0] == key:
            raise ServerStartError(f"the server for this point did not start: {self.failed[1]}")
        if self.handle is not None and (self.key != key or not self.handle.running):
            if not self.handle.running:
                self.say(f"server exited with code {self.handle.proc.returncode}: relaunching")
            self.stop()
        if self.handle is None:
            self.say(f"starting the server for point {cell.label} ({self.backend})")
            try:
                self.handle = self._launch(cell, cell.dir.parent / "server")
            except Exception as e:  # noqa: BLE001 - recorded for the point's remaining cells
                self.failed = (key, str(e).splitlines()[0])
                raise
            self.key = key
        return self.handle.base_url, self.handle.model

    def _launch(self, cell: Cell, workdir: Path) -> ServerHandle:
        scale = self.opts.sim_time_scale
        return launch(self.recipe, cell.point, conc=cell.conc, workdir=workdir,
                      recipe_dir=self.path.parent, source=str(self.path),
                      health_timeout=self.opts.health_timeout or self.recipe.health_timeout_s,
                      sim=self.backend != "vllm",
                      sim_overrides={"time_scale": scale} if scale else None)

    @property
    def died(self) -> bool:
        return self.handle is not None and not self.handle.running

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()
        self.handle, self.key = None, None


def cell_config(recipe: Recipe, cell: Cell, opts: SweepOptions, base_url: str,
                model: str | None, recipe_dir: Path | None = None) -> RunConfig:
    """The recipe's run options, the sweep's overrides, this cell's conc and directory (and,
    given the recipe's directory, the golden entry its synthetic AL is pinned from)."""
    point = recipe.points[cell.point]
    data = {**recipe.run_options(), **opts.run, "conc": cell.conc, "base_url": base_url,
            "gpus": point.gpus, "output_dir": str(cell.dir), "overwrite": True,
            "progress": False}
    # the cell's recipe and point, stored from the run's start and shown in every report
    data["labels"] = {**(data.get("labels") or {}), "recipe": recipe.name or "", "point": cell.label}
    if model:
        data["model"] = model
    pin = golden_pin(recipe, spec_k(recipe, point, cell.conc), recipe_dir) if recipe_dir \
        else None
    if pin:
        data.setdefault("golden_al", pin)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise input_error(err, f"run options of cell {cell.label}/c{cell.conc}") from None
    if cfg.duration_s and cfg.warmup_fixed_s() >= cfg.duration_s:  # auto: duration follows
        raise InputError("run options", f"warm-up {cfg.warmup_fixed_s():g} s >= duration "
                         f"{cfg.duration_s:g} s: no request would be measured (give --warmup)",
                         field="warmup_s")
    return cfg


def annotate(recipe: Recipe, cell: Cell, extra: dict) -> None:
    """Merge the InferenceX fields, the recipe and point labels into the cell's summary.json."""
    path = cell.dir / SUMMARY
    summary = orjson.loads(path.read_bytes())
    point = recipe.points[cell.point]
    summary.update(inferencex_fields(recipe, point, cell.conc, summary))
    summary.update({"recipe": recipe.name, "point": {**point.model_dump(mode="json"),
                                                     "index": cell.point, "name": cell.label},
                    "sweep": extra})
    write_json(path, summary)


def run_cell(recipe: Recipe, cell: Cell, servers: Servers, opts: SweepOptions) -> None:
    from ..run import run

    t0 = time.monotonic()
    try:
        url, model = servers.url_and_model(cell)
        cell.reset_prefix_cache = reset_prefix_cache(url)
        summary = run(cell_config(recipe, cell, opts, url, model, servers.path.parent))
        cell.verdict = (summary.get("validation") or {}).get("verdict")
        annotate(recipe, cell, {"backend": servers.backend,
                                "reset_prefix_cache": cell.reset_prefix_cache})
        if servers.died:
            raise RuntimeError(f"the server exited (code {servers.handle.proc.returncode}) "
                               "during the cell")
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
    backend, why = choose_backend(recipe, opts)
    console = Console(stderr=True, soft_wrap=True)
    console.print(f"agentx sweep {recipe.name}: {len(cells)} cell(s) into {out}; serving with "
                  f"{why}")
    out.mkdir(parents=True, exist_ok=True)
    servers = Servers(recipe, path, backend, opts, lambda m: console.print(f"  {m}"))
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
    from ..report.cli import report_many
    from ..report.console import make_console
    from ..report.rebuild import load_run

    runs = [load_run(c.dir) for c in cells if (c.dir / SUMMARY).exists()]
    missing = [f"{c.label} c{c.conc}: failed: {(c.error or '').splitlines()[0][:90]}"
               for c in cells if c.status == "failed" and not (c.dir / SUMMARY).exists()]
    console = make_console()
    if not runs:
        console.print("agentx sweep: no cell produced results; see " + str(out / SWEEP_JSON))
        return
    report_many(runs, out, console, missing=missing)
