"""A recipe point as the embedded simulator's options: the stand-in server when no GPU or vLLM
is present (sweep), and a fast server for testing the lifecycle (`agentx serve --sim`).

Only what the recipe states is passed; everything else comes from the recipe's `sim_profile`
(the profile stays the source of hardware-derived values)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import InputError
from ..sim.config import SimConfig
from .render import synthetic_al
from .schema import Recipe, spec_k


def sim_options(recipe: Recipe, point_index: int, conc: int | None = None, *,
                recipe_dir: str | Path = ".", source: str = "recipe") -> dict:
    """SimConfig fields for this point (validated); InputError when the recipe cannot say."""
    if recipe.sim_profile is None:
        raise InputError(source, "the recipe names no simulator profile", field="sim_profile")
    point = recipe.points[point_index]
    opts: dict = {"profile": recipe.sim_profile, "tp": point.gpus,
                  "model_name": recipe.served_model_name or recipe.model.rsplit("/", 1)[-1],
                  "default_thinking": recipe.thinking}
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                 "gpu_memory_utilization", "max_model_len"):
        if getattr(recipe, name) is not None:
            opts[name] = getattr(recipe, name)
    try:
        k = spec_k(recipe, point, conc)
        if k is not None:
            opts["spec_k"] = k
            al = synthetic_al(recipe, k, Path(recipe_dir), [])
            if al is not None:
                opts["synthetic_al"] = al
        c = recipe.offload(point)
        opts["kv_offload"] = c.kind
        if c.enabled and not c.reads_host():  # it would read this machine, not the recipe's
            t = c.plan(point.gpus)
            if t.held_bytes is not None:  # what the store keeps filled (Tier.held_bytes)
                opts["offload_gb"] = t.held_bytes / 1e9
        opts.update(c.sim_options())
    except ValueError as e:
        raise InputError(source, str(e)) from None
    SimConfig.model_validate(opts)
    return opts


def sim_argv(opts: dict, *, host: str, port: int) -> list[str]:
    """`python -m agentx.sim` with these SimConfig options as its flags."""
    argv = [sys.executable, "-m", "agentx.sim", "--host", host, "--port", str(port)]
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv
