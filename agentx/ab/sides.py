"""A side of an A/B comparison: a target (agentx.targets), a server URL or a recipe launched
the way `agentx sweep` launches a point: on vLLM when a GPU and vLLM are present, else on the
simulator with the recipe's `sim_profile`, with any `--sim-*` flag the user gave applied on
top (e.g. `--sim-time-scale`). A launched server is stopped, with its whole process group,
when the side is closed."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..recipe.load import load_recipe
from ..targets.base import Server, Target
from ..targets.choice import RecipeChoice, ServerChoice, UrlChoice
from ..targets.embedded import NOT_OPTIONS
from ..targets.open import open_server
from .config import ABConfig


@dataclass
class Side:
    name: str  # "a" | "b"
    target: Target
    server: Server

    def public(self) -> dict:
        return self.target.public()


def is_url(named: str) -> bool:
    return named.startswith(("http://", "https://"))


def side_choice(name: str, named: str, cfg: ABConfig, out: Path) -> ServerChoice:
    """The side's server as a choice (targets.open.open_server opens it)."""
    if is_url(named):
        return UrlChoice(named)
    recipe, path = load_recipe(named)
    ignored = sorted(k for k, v in recipe.run_options().items() if getattr(cfg, k, v) != v)
    if ignored:  # an A/B compares servers under one workload: the command's, on both sides
        print(f"agentx ab: side {name}: {path.name} run options not used ({', '.join(ignored)}): "
              "both sides run the command's workload", file=sys.stderr)
    return RecipeChoice.of(recipe, path, sim=True if cfg.recipe_sim else None, point=cfg.point,
                           conc=cfg.conc, workdir=(out / f"server-{name}").resolve(),
                           named=named, sim_overrides=cfg.sim.model_dump(
                               include=cfg.sim.model_fields_set - set(NOT_OPTIONS)))


@contextlib.contextmanager
def open_side(name: str, named: str, cfg: ABConfig, out: Path) -> Iterator[Side]:
    """The side's server, running until the context ends."""
    server = open_server(side_choice(name, named, cfg, out))
    with server as target:
        yield Side(name, replace(target, named=named), server)
