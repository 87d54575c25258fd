"""A sweep's cells: every operating point of a recipe at each of its concurrencies, one result
directory each (`<out>/<point-label>/c<conc>/`), and the run options of each."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from ..config import RunConfig
from ..errors import InputError
from ..options import input_error
from ..recipe.render import golden_pin
from ..recipe.schema import Recipe, spec_k
from ..report.inferencex import export_cell
from ..rundir import RunDir, SweepDir, write_json
from .config import SweepConfig

SWEEP_JSON, SUMMARY = SweepDir.JSON, RunDir.SUMMARY
URL_SWEEP = "url"  # the name of the one-point recipe of a sweep given only --base-url
LENGTHENED = "search_lengthened"  # label of a cell the search reran longer


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
    goodput: float | None = None  # share of the window's requests meeting every SLO (--slo)
    duration_s: float | None = None  # set when the search lengthened a thin cell (search.py)

    def record(self) -> dict:
        return {"point": self.point, "label": self.label, "conc": self.conc,
                "dir": str(self.dir), "status": self.status, "verdict": self.verdict,
                "error": self.error, "goodput": self.goodput,
                "reset_prefix_cache": self.reset_prefix_cache, "seconds": self.seconds,
                "lengthened_to_s": self.duration_s}


def url_recipe(conc: list[int]) -> Recipe:
    """The plan of `agentx sweep --base-url URL --conc C,D` without a recipe: one point,
    `url`, at those concurrencies, against the running server. Its model, precision and
    hardware are placeholders the schema needs; the cells claim none of them (no InferenceX
    fields, no GPU count but --set gpus=N: cell_config, run_cell)."""
    return Recipe.model_validate({"name": URL_SWEEP, "model": "(the server's)",
                                  "precision": "bf16", "hardware": "cpu", "gpus": 1,
                                  "points": [{"name": URL_SWEEP, "tp": 1, "conc": conc}]})


def point_indices(recipe: Recipe, cfg: SweepConfig) -> list[int]:
    """The points the sweep covers (--points, else all); InputError names a missing one."""
    indices = cfg.points if cfg.points is not None else range(len(recipe.points))
    for i in indices:
        if not 0 <= i < len(recipe.points):
            raise InputError("command line", f"no point {i} (the recipe has "
                             f"{len(recipe.points)})", field="--points")
    return list(indices)


def make_cell(recipe: Recipe, cfg: SweepConfig, point: int, conc: int) -> Cell:
    label = recipe.points[point].label(point)
    return Cell(point, label, conc, SweepDir(Path(str(cfg.output_dir))).cell(label, conc))


def plan(recipe: Recipe, cfg: SweepConfig) -> list[Cell]:
    return [make_cell(recipe, cfg, i, c) for i in point_indices(recipe, cfg)
            for c in (cfg.conc or recipe.points[i].conc)]


def load_summary(cell_dir: Path) -> dict:
    return orjson.loads((cell_dir / SUMMARY).read_bytes())


def finished(cell_dir: Path) -> bool:
    """A cell whose run wrote its summary (a summary rebuilt by `agentx report` does not count)."""
    try:
        return not orjson.loads((cell_dir / SUMMARY).read_bytes()).get("rebuilt")
    except (OSError, orjson.JSONDecodeError):
        return False


# fields a resumed cell may differ in: where its server listened and what the server said
# (a relaunched server has another port), where the result lives and how it was displayed
NOT_COMPARED = frozenset({"base_url", "model", "offload_tokens", "api_key", "output_dir",
                          "overwrite", "progress"})


def drift(recorded: dict, expected: dict) -> str | None:
    """The first field (in the expected config's order) whose recorded value differs, as
    `FIELD recorded R, this sweep E`; None when the cell ran what this sweep would run. A field
    the record lacks (written before the field existed) is not compared."""
    for key, want in expected.items():
        if key in NOT_COMPARED or key not in recorded:
            continue
        if recorded[key] != want:
            return f"{key} recorded {recorded[key]!r}, this sweep {want!r}"
    return None


def check_resumed(recipe: Recipe, cell: Cell, cfg: SweepConfig,
                  recipe_dir: Path | None) -> None:
    """Refuse to resume over a finished cell run with another config (InputError, one line
    naming the cell and the first differing field)."""
    recorded = load_summary(cell.dir).get("config") or {}
    if LENGTHENED in (recorded.get("labels") or {}):  # the search reran it longer: as recorded
        cell.duration_s = recorded.get("duration_s")
    expected = cell_config(recipe, cell, cfg, recorded.get("base_url") or "http://127.0.0.1:1",
                           recorded.get("model"), recipe_dir).public()
    why = drift(recorded, expected)
    if why:
        raise InputError(str(cell.dir / SUMMARY), f"cell {cell.label} c{cell.conc} ran with "
                         f"another config ({why}): --resume would mix them; give another "
                         "--output-dir or remove the cell", field=why.split()[0])


def cell_config(recipe: Recipe, cell: Cell, cfg: SweepConfig, base_url: str,
                model: str | None, recipe_dir: Path | None = None) -> RunConfig:
    """The recipe's run options, the sweep's overrides, this cell's conc and directory (and,
    given the recipe's directory, the golden entry its synthetic AL is pinned from)."""
    point = recipe.points[cell.point]
    url_only = recipe.name == URL_SWEEP and cfg.base_url is not None
    overrides = cfg.overrides()
    data = {**recipe.run_options(), **overrides, "conc": cell.conc, "base_url": base_url,
            # a recipe's point says its GPUs; a bare URL says nothing (--set gpus=N)
            "gpus": overrides.get("gpus") if url_only else point.gpus,
            "output_dir": str(cell.dir), "overwrite": True, "progress": False}
    # the cell's recipe and point, stored from the run's start and shown in every report
    data["labels"] = {**(data.get("labels") or {}), "recipe": recipe.name or "", "point": cell.label}
    if cell.duration_s:  # a thin cell the search reran longer, labelled so in every report
        data["labels"][LENGTHENED] = f"{data.get('duration_s') or 0:g}s->{cell.duration_s:g}s"
        data["duration_s"] = cell.duration_s
    if model:
        data["model"] = model
    pin = golden_pin(recipe, spec_k(recipe, point, cell.conc), recipe_dir) if recipe_dir \
        else None
    if pin:
        data.setdefault("golden_al", pin)
    try:
        run_cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise input_error(err, f"run options of cell {cell.label}/c{cell.conc}") from None
    if run_cfg.duration_s and run_cfg.warmup_fixed_s() >= run_cfg.duration_s:  # auto: follows
        raise InputError("run options", f"warm-up {run_cfg.warmup_fixed_s():g} s >= duration "
                         f"{run_cfg.duration_s:g} s: no request would be measured (give "
                         "--warmup)", field="warmup_s")
    return run_cfg


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
