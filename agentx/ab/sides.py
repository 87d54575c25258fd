"""A side of an A/B comparison: a running server, given as a URL or launched from a recipe.

A recipe side is launched the way `agentx sweep` launches a point (agentx.recipe.serve), on
vLLM when a GPU and vLLM are present, else on the simulator with the recipe's `sim_profile`
(agentx.recipe.simargs), with any `--sim-*` flag the user gave applied on top (e.g.
`--sim-time-scale`). The server is stopped, with its whole process group, when the side is
closed."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..recipe.load import load_recipe
from ..recipe.schema import Recipe
from ..recipe.serve import ServerHandle, launch
from ..recipe.sweep import SweepOptions, choose_backend
from ..sim.profile import kv_bytes_per_token_rank, load_profile
from ..urls import normalise_base_url, redact_url
from .spec import ABConfig

SIM_NOT_OVERRIDDEN = ("host", "port", "api_key")


@dataclass
class Side:
    name: str  # "a" | "b"
    spec: str  # what the user gave
    kind: str  # url | vllm | sim
    base_url: str
    model: str | None = None
    handle: ServerHandle | None = None
    offload_tokens: int | None = None  # the recipe's offload tier in tokens (vLLM sides)

    def public(self) -> dict:
        return {"spec": redact_url(self.spec) if self.kind == "url" else self.spec,
                "kind": self.kind, "base_url": redact_url(self.base_url), "model": self.model,
                "offload_tokens": self.offload_tokens}


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@contextlib.contextmanager
def open_side(name: str, spec: str, cfg: ABConfig, out: Path) -> Iterator[Side]:
    """The side's server, running until the context ends."""
    if is_url(spec):
        yield Side(name, spec, "url", normalise_base_url(spec))
        return
    recipe, path = load_recipe(spec)
    ignored = sorted(k for k, v in recipe.run_options().items() if getattr(cfg, k, v) != v)
    if ignored:  # an A/B compares servers under one workload: the command's, on both sides
        print(f"agentx ab: side {name}: {path.name} run options not used ({', '.join(ignored)}): "
              "both sides run the command's workload", file=sys.stderr)
    backend, _why = choose_backend(recipe, SweepOptions(output_dir=out, sim=cfg.recipe_sim))
    workdir = (out / f"server-{name}").resolve()
    handle = launch(recipe, cfg.point, conc=cfg.conc, workdir=workdir, recipe_dir=path.parent,
                    source=str(path), sim=backend != "vllm",
                    sim_overrides=cfg.sim.model_dump(
                        include=cfg.sim.model_fields_set - set(SIM_NOT_OVERRIDDEN)))
    with handle:
        side = Side(name, spec, backend, handle.base_url, handle.model, handle)
        if handle.rendered is not None:
            side.offload_tokens = recipe_offload_tokens(recipe, cfg.point,
                                                        handle.rendered.offload_bytes)
        yield side


def recipe_offload_tokens(recipe: Recipe, point: int, offload_bytes: int | None) -> int | None:
    """The offload tier in tokens: the recipe's tier bytes (its DRAM arithmetic, as rendered)
    over one token's KV bytes across a TP group, from the model shape of the recipe's
    sim_profile (2 x layers x KV heads x head_dim x bytes, agentx.sim.profile). Summed over
    data-parallel engines, as the GPU pool is. None when the recipe cannot say (no tier, no
    profile); the server's own figure (SimpleCPUOffload's info gauge) is read then."""
    if not offload_bytes or recipe.sim_profile is None:
        return None
    tp = recipe.points[point].tp
    kv = kv_bytes_per_token_rank(load_profile(recipe.sim_profile).model, tp) * tp
    return int(offload_bytes // kv)
