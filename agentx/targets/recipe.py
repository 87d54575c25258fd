"""A recipe point as a target: launched on vLLM (rendered by agentx.recipe.render), or on the
simulator standing in for it (its own process, agentx.recipe.simargs) when asked or when no
GPU or vLLM is present and the recipe names a `sim_profile` (targets.choice.pick_kind)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import InputError
from ..recipe.render import missing_paths, render
from ..recipe.schema import Recipe
from ..recipe.simargs import sim_argv, sim_options
from ..sim.profile import kv_bytes_per_token_rank, load_profile
from .base import Server, Target
from .choice import RecipeChoice
from .process import ServerHandle, free_port, start


def offload_tokens(recipe: Recipe, point: int, offload_bytes: int | None) -> int | None:
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


class RecipeServer(Server):
    """One point of a recipe launched as `choice` says (targets.choice.RecipeChoice)."""

    def __init__(self, choice: RecipeChoice) -> None:
        self.choice, self.recipe, self.point = choice, choice.recipe, choice.point
        self.kind = choice.kind
        self.health_timeout_s = choice.health_timeout_s or choice.recipe.health_timeout_s
        self.handle: ServerHandle | None = None
        self.stopped = False

    def start(self) -> Target:
        self.stop()
        self.stopped = False
        c = self.choice
        port = c.port or free_port(c.host)
        wd = c.workdir or Path(tempfile.mkdtemp(prefix=f"agentx-serve-{self.recipe.name}-"))
        wd = wd.resolve()
        wd.mkdir(parents=True, exist_ok=True)
        named = c.named or c.source
        if self.kind == "sim":
            opts = {**sim_options(self.recipe, self.point, c.conc, recipe_dir=c.recipe_dir,
                                  source=c.source), **c.sim_overrides}
            self.handle = start(sim_argv(opts, host=c.host, port=port), {},
                                base_url=f"http://{c.host}:{port}", workdir=wd,
                                health_timeout_s=self.health_timeout_s, on_log=c.on_log)
            self.target = Target("sim", self.handle.base_url, opts["model_name"],
                                 connector=opts.get("kv_offload"), profile=opts["profile"],
                                 named=named, log_dir=wd)
        else:
            r = render(self.recipe, self.point, conc=c.conc, host=c.host, port=port,
                       workdir=wd, recipe_dir=c.recipe_dir, source=c.source,
                       host_dram_mib=c.host_dram_mib)
            problem = missing_paths(self.recipe, os.environ)
            if problem:
                raise InputError(c.source, problem)
            (wd / "command.sh").write_text(r.script())
            self.handle = start(r.argv, r.env, base_url=r.base_url, workdir=wd,
                                health_timeout_s=self.health_timeout_s, on_log=c.on_log,
                                sidecars=r.sidecars, files=r.files)
            self.target = Target("vllm", r.base_url, r.served_name,
                                 offload_tokens(self.recipe, self.point, r.offload_held_bytes),
                                 connector=r.kv_offload, named=named, log_dir=wd)
        self.handle.model = self.target.model
        return self.target

    @property
    def running(self) -> bool:
        return self.handle is not None and self.handle.running

    def exit_code(self) -> int | None:
        if self.handle is None or self.stopped or self.running:
            return None
        return self.handle.proc.returncode

    def stop(self) -> None:
        """Stop the server's process groups; once (a second stop must not signal a pid the
        system may have reused)."""
        if self.handle is not None and not self.stopped:
            self.stopped = True
            self.handle.stop()
