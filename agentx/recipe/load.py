"""Find a recipe by name or path and load it strictly: every problem is one InputError line
naming file, line and field (exit 2 from the CLI)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from ..shipped_data import data_dir
from ..yamlconf import _line_finder, compose, load_model, read_text
from .schema import Recipe

RECIPES_DIR_ENV = "AGENTX_RECIPES_DIR"


def recipes_dir() -> Path:
    """$AGENTX_RECIPES_DIR, else the recipes shipped in the wheel, else <repo>/recipes."""
    return data_dir("recipes", RECIPES_DIR_ENV)


def recipe_names() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def resolve(spec: str) -> Path:
    """A path to an existing file, or NAME -> <recipes dir>/NAME.yaml."""
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or os.sep in spec:
        if not p.is_file():
            raise InputError(spec, "file not found")
        return p
    path = recipes_dir() / f"{spec}.yaml"
    if not path.is_file():
        raise InputError(spec, f"no such recipe (known: {', '.join(recipe_names()) or 'none'})")
    return path


def line_in(path: Path, field: str) -> int | None:
    """The line of a dotted field (`points.1.tp`) in a recipe file."""
    root = compose(read_text(path))
    return _line_finder(root)(tuple(int(p) if p.isdigit() else p for p in field.split(".")))


def load_recipe(spec: str) -> tuple[Recipe, Path]:
    """The validated recipe and its file. Cross-field problems point at the key to fix."""
    path = resolve(spec)
    text = read_text(path)
    recipe = load_model(text, Recipe, str(path))
    if recipe.name is None:
        recipe.name = path.stem
    problems = recipe.problems()
    if problems:
        loc, msg = problems[0]
        line_of = _line_finder(compose(text))
        raise InputError(str(path), msg, field=".".join(map(str, loc)), line=line_of(loc))
    return recipe, path
