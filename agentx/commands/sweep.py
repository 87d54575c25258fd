"""`agentx sweep NAME|PATH`: every operating point of a recipe at each concurrency, one
result directory per cell, then the Pareto report (the logic and its options: agentx.sweep)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..options import add_arguments, from_args
from ..rundir import SweepDir
from ..sweep.config import SweepConfig


def configure(p: argparse.ArgumentParser) -> None:
    add_arguments(p, SweepConfig)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not hasattr(args, "recipe") and getattr(args, "base_url", None):
        args.recipe = ""  # a running server alone: the sweep's plan is --conc (url_recipe)
    return run(from_args(args, SweepConfig))


def run(cfg: SweepConfig) -> int:
    from ..recipe.load import load_recipe
    from ..sweep.cells import url_recipe
    from ..sweep.run import sweep, undecided

    if cfg.recipe:
        recipe, path = load_recipe(cfg.recipe)
    else:  # --base-url and --conc: no recipe to read (url_recipe)
        recipe, path = url_recipe(cfg.conc or []), Path.cwd() / "(no recipe)"
    out = SweepDir.at(cfg.output_dir, recipe.name).path  # fixed once: the cells are under it
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    cells = sweep(recipe, path, cfg)
    failed = [c for c in cells if c.status == "failed"]
    if failed:
        print(f"agentx sweep: {len(failed)} of {len(cells)} cell(s) failed (see "
              f"{out / SweepDir.JSON})", file=sys.stderr)
    if failed:
        return 1
    # as `agentx run`: --validate strict (the default) exits 3 on nothing decided, warn does not
    strict = {**recipe.run_options(), **cfg.overrides()}.get("validation", "strict") == "strict"
    why = undecided(cells, out) if strict else None
    if why:
        print(f"agentx sweep: {why}", file=sys.stderr)
        return 3
    return 0
