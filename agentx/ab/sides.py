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
from ..targets.base import Server, Target, UrlServer
from ..targets.embedded import NOT_OPTIONS
from ..targets.recipe import RecipeServer
from .spec import ABConfig


@dataclass
class Side:
    name: str  # "a" | "b"
    target: Target
    server: Server

    def public(self) -> dict:
        return self.target.public()


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def side_server(name: str, spec: str, cfg: ABConfig, out: Path) -> Server:
    """The side's target, not started yet."""
    if is_url(spec):
        return UrlServer(spec)
    recipe, path = load_recipe(spec)
    ignored = sorted(k for k, v in recipe.run_options().items() if getattr(cfg, k, v) != v)
    if ignored:  # an A/B compares servers under one workload: the command's, on both sides
        print(f"agentx ab: side {name}: {path.name} run options not used ({', '.join(ignored)}): "
              "both sides run the command's workload", file=sys.stderr)
    return RecipeServer(recipe, cfg.point, conc=cfg.conc,
                        workdir=(out / f"server-{name}").resolve(), recipe_dir=path.parent, source=str(path), spec=spec,
                        sim=True if cfg.recipe_sim else None,
                        sim_overrides=cfg.sim.model_dump(
                            include=cfg.sim.model_fields_set - set(NOT_OPTIONS)))


@contextlib.contextmanager
def open_side(name: str, spec: str, cfg: ABConfig, out: Path) -> Iterator[Side]:
    """The side's server, running until the context ends."""
    server = side_server(name, spec, cfg, out)
    with server as target:
        yield Side(name, replace(target, spec=spec), server)
