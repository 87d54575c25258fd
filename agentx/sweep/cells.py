"""A sweep's cells: every operating point of a recipe at each of its concurrencies, one result
directory each (`<out>/<point-label>/c<conc>/`), and the run options of each."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import ValidationError

from ..config import RunConfig
from ..errors import InputError
from ..options import input_error
from ..recipe.inferencex import export_cell
from ..recipe.render import golden_pin
from ..recipe.schema import Recipe, spec_k
from ..rundir import RunDir, write_json

SWEEP_JSON, SUMMARY = "sweep.json", RunDir.SUMMARY


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
    health_timeout_s: float | None = None  # a launched server's /health wait (default: recipe's)


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
    """Write the cell's InferenceX files (inferencex.json, aiperf_artifacts/) and merge their
    fields, the recipe and point labels into its summary.json."""
    path = cell.dir / SUMMARY
    summary = orjson.loads(path.read_bytes())
    point = recipe.points[cell.point]
    summary.update(export_cell(recipe, point, cell.conc, cell.dir, summary))
    summary.update({"recipe": recipe.name, "point": {**point.model_dump(mode="json"),
                                                     "index": cell.point, "name": cell.label},
                    "sweep": extra})
    write_json(path, summary)
