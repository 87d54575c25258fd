"""One target per K: the recipe's vLLM (or its simulator stand-in) launched clean with real
verification at that K, or the running server the user named for it (agentx.targets)."""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..recipe.schema import Recipe
from ..targets.base import Server
from ..targets.choice import RecipeChoice, UrlChoice
from ..targets.open import open_server
from .config import CalibrateConfig

PER_REQUEST_SPEC = ["--per-request-spec-decode-metrics", "summary"]  # vLLM >= 0.32


def recipe_ks(recipe: Recipe, source: str) -> list[int]:
    """The K values a recipe uses (its k and every k_map rule's)."""
    s = recipe.speculative
    if s is None:
        raise InputError(source, "the recipe has no speculative decoding to calibrate",
                         field="speculative")
    return sorted({r.k for r in s.k_map} | ({s.k} if s.k is not None else set()))


def at_k(recipe: Recipe, k: int, per_request_spec: bool) -> Recipe:
    """The recipe verifying for real at K: one fixed K, no synthetic acceptance."""
    spec = recipe.speculative.model_copy(update={"k": k, "k_map": [], "synthetic_al": None})
    extra = recipe.extra_args + (PER_REQUEST_SPEC if per_request_spec else [])
    point = recipe.points[0].model_copy(update={"spec": True})
    return recipe.model_copy(update={"speculative": spec, "extra_args": extra,
                                     "points": [point]})


def server_at_k(cfg: CalibrateConfig, recipe: Recipe | None, path: Path | None, k: int,
                workdir: Path) -> Server:
    """The target for K (`with server_at_k(...) as target:`), stopped on leaving the block
    when it was launched here."""
    if recipe is None or path is None:
        return open_server(UrlChoice(cfg.url_map()[k]))
    return open_server(RecipeChoice.of(
        at_k(recipe, k, cfg.per_request_spec), path, sim=cfg.sim, workdir=workdir,
        sim_overrides={"time_scale": cfg.sim_time_scale} if cfg.sim else {},
        health_timeout_s=cfg.health_timeout_s))
