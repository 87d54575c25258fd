"""A recipe point as a target: launched on vLLM (rendered by agentx.recipe.render), or on the
simulator standing in for it (its own process, agentx.recipe.simargs) when asked or when no
GPU or vLLM is present and the recipe names a `sim_profile`."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import InputError
from ..recipe.render import missing_paths, render
from ..recipe.schema import Recipe
from ..recipe.simargs import sim_argv, sim_options
from ..sim.profile import kv_bytes_per_token_rank, load_profile
from .base import Server, Target
from .process import LogSink, ServerHandle, free_port, start


def choose_kind(recipe: Recipe, sim: bool = False) -> tuple[str, str]:
    """("sim" | "vllm", why): what serves the recipe's points here."""
    if sim:
        return "sim", "the simulator (--sim)"
    missing = None
    if recipe.hardware != "cpu" and shutil.which("nvidia-smi") is None:
        missing = "no GPU (nvidia-smi not on PATH)"
    elif recipe.command[0] == "vllm" and shutil.which("vllm") is None \
            and importlib.util.find_spec("vllm") is None:
        missing = "vLLM is not installed"
    if missing is None:
        return "vllm", f"launching `{' '.join(recipe.command)}` per point"
    if recipe.sim_profile is None:
        raise InputError(recipe.name or "recipe", f"{missing} and the recipe names no "
                         "simulator profile to stand in", field="sim_profile")
    return "sim", f"the simulator with profile {recipe.sim_profile} ({missing})"


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
    """One point of a recipe (at `conc`, which may choose its K), launched in `workdir` (its
    logs, command.sh and rendered files stay there). `sim`: True serves it on the simulator,
    None decides by choose_kind; `sim_overrides` are SimConfig fields on top of the recipe's.
    `health_timeout_s` (default: the recipe's) bounds the wait for /health; `spec` is how the
    user named the recipe (default: `source`, its path)."""

    def __init__(self, recipe: Recipe, point: int = 0, *, conc: int | None = None,
                 workdir: str | Path | None = None, recipe_dir: str | Path = ".",
                 source: str = "recipe", spec: str | None = None, sim: bool | None = None,
                 sim_overrides: dict | None = None, health_timeout_s: float | None = None,
                 host: str = "127.0.0.1", port: int | None = None,
                 on_log: LogSink | None = None, host_dram_mib: int | None = None) -> None:
        self.recipe, self.point, self.conc = recipe, point, conc
        self.workdir = Path(workdir) if workdir else None
        self.recipe_dir, self.source, self.spec = recipe_dir, source, spec or source
        self.kind = "sim" if sim else choose_kind(recipe)[0] if sim is None else "vllm"
        self.sim_overrides = sim_overrides or {}
        self.health_timeout_s = health_timeout_s or recipe.health_timeout_s
        self.host, self.port, self.on_log, self.host_dram_mib = host, port, on_log, host_dram_mib
        self.handle: ServerHandle | None = None
        self.stopped = False

    def start(self) -> Target:
        self.stop()
        self.stopped = False
        port = self.port or free_port(self.host)
        wd = self.workdir or Path(tempfile.mkdtemp(prefix=f"agentx-serve-{self.recipe.name}-"))
        wd = wd.resolve()
        wd.mkdir(parents=True, exist_ok=True)
        if self.kind == "sim":
            opts = {**sim_options(self.recipe, self.point, self.conc,
                                  recipe_dir=self.recipe_dir, source=self.source),
                    **self.sim_overrides}
            self.handle = start(sim_argv(opts, host=self.host, port=port), {},
                                base_url=f"http://{self.host}:{port}", workdir=wd,
                                health_timeout_s=self.health_timeout_s, on_log=self.on_log)
            self.target = Target("sim", self.handle.base_url, opts["model_name"],
                                 connector=opts.get("kv_offload"), profile=opts["profile"],
                                 spec=self.spec, log_dir=wd)
        else:
            r = render(self.recipe, self.point, conc=self.conc, host=self.host, port=port,
                       workdir=wd, recipe_dir=self.recipe_dir, source=self.source,
                       host_dram_mib=self.host_dram_mib)
            problem = missing_paths(self.recipe, os.environ)
            if problem:
                raise InputError(self.source, problem)
            (wd / "command.sh").write_text(r.script())
            self.handle = start(r.argv, r.env, base_url=r.base_url, workdir=wd,
                                health_timeout_s=self.health_timeout_s, on_log=self.on_log,
                                sidecars=r.sidecars, files=r.files)
            self.target = Target("vllm", r.base_url, r.served_name,
                                 offload_tokens(self.recipe, self.point, r.offload_held_bytes),
                                 connector=r.kv_offload, spec=self.spec, log_dir=wd)
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


def launch(recipe: Recipe, point: int = 0, *, sim: bool = False, **kw: object) -> ServerHandle:
    """Start the point (on vLLM, or the simulator with `sim`) and return its running, healthy
    process handle, for `agentx serve`, which follows the server's log itself. Use as
    `with launch(...) as server:`."""
    server = RecipeServer(recipe, point, sim=sim, **kw)  # type: ignore[arg-type]
    server.start()
    assert server.handle is not None
    return server.handle
