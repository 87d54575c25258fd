"""Recipe + operating point -> the exact server command, its environment and generated files.

The output is what a user pastes on the GPU host and what `serve` launches: one argv (shown
with shlex.join, so it round-trips through a POSIX shell), the environment it adds, files to
write first (the Mooncake store config) and side processes to start first (`mooncake_master`).
Flag names and JSON keys are vLLM's (0.32, `vllm serve --help` and vllm/config/*.py); each KV
connector renders its own part (agentx.offload).
"""
from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..golden_al import golden_al
from ..offload import Tier, dram
from .schema import Point, Recipe, spec_k

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, environ: Mapping[str, str], help: Mapping[str, str] | None = None) -> str:
    """`${NAME}` and `${NAME:-default}` from `environ` (unset without default: an error,
    with the recipe's `env_help` for NAME when it has one)."""
    def sub(m: re.Match) -> str:
        if m.group(1) in environ:
            return environ[m.group(1)]
        if m.group(2) is not None:
            return m.group(2)
        hint = (help or {}).get(m.group(1))
        raise ValueError(f"${{{m.group(1)}}} is not set" + (f": {hint}" if hint else ""))
    return _VAR.sub(sub, text)


def missing_paths(recipe: Recipe, environ: Mapping[str, str]) -> str | None:
    """A problem with a path variable of `env_help` (set but naming nothing), said with its
    help: caught before a server is launched rather than as the server's own error minutes
    later."""
    for var, hint in recipe.env_help.items():
        value = environ.get(var)
        if value is not None and not Path(value).exists():
            return f"${{{var}}} is {value}, which does not exist: {hint}"
    return None


def compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class Rendered:
    recipe: Recipe
    point_index: int
    conc: int | None
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # path -> content
    sidecars: list[list[str]] = field(default_factory=list)
    dram_steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    k: int | None = None
    synthetic_al: float | None = None
    kv_offload: str = "none"
    allocated_dram_gb: int | None = None
    offload_bytes: int | None = None  # the tier as allocated (the DRAM arithmetic)
    offload_held_bytes: int | None = None  # what it holds in steady state: the theory's size
    base_url: str = ""
    served_name: str = ""  # the model name requests use

    @property
    def point(self) -> Point:
        return self.recipe.points[self.point_index]

    def command(self) -> str:
        return shlex.join(self.argv)

    def script(self) -> str:
        """Everything as a POSIX shell script: comments, files, side processes, exports, argv."""
        p, r = self.point, self.recipe
        head = (f"# recipe {r.name}, point {self.point_index} ({p.label(self.point_index)}: "
                f"tp={p.tp} dp={p.dp} ep={p.ep} dp_attention={str(p.dp_attention).lower()}; "
                f"conc {' '.join(map(str, p.conc))})")
        out = [head]
        if r.image or r.vllm_version:
            out.append(f"# image {r.image or '-'}, vLLM {r.vllm_version or '-'}")
        out += [f"# {n}" for n in self.notes]
        if self.dram_steps:
            out.append(f"# DRAM budget for the {self.kv_offload} KV tier "
                       "(MiB = 2^20 B, GB = 1e9 B, GiB = 2^30 B):")
            out += [f"#   {s}" for s in self.dram_steps]
        for path, content in self.files.items():
            out += [f"cat > {shlex.quote(path)} <<'EOF'", content.rstrip("\n"), "EOF"]
        out += [shlex.join(c) + " &" for c in self.sidecars]
        out += [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()]
        out.append(self.command())
        return "\n".join(out) + "\n"


def render(recipe: Recipe, point_index: int = 0, *, conc: int | None = None,
           host: str = "127.0.0.1", port: int = 8000, workdir: str | Path = ".",
           recipe_dir: str | Path = ".", environ: Mapping[str, str] | None = None,
           host_dram_mib: int | None = None, source: str = "recipe") -> Rendered:
    """Render one operating point. Problems (K needs conc, missing golden AL, DRAM budget <= 0)
    raise InputError naming `source`."""
    env_in = os.environ if environ is None else environ
    if not 0 <= point_index < len(recipe.points):
        raise InputError(source, f"no point {point_index} (the recipe has "
                         f"{len(recipe.points)}: 0..{len(recipe.points) - 1})", field="points")
    point = recipe.points[point_index]
    if conc is not None and conc not in point.conc:
        raise InputError(source, f"conc {conc} is not in point {point_index}'s conc list "
                         f"{point.conc}", field=f"points.{point_index}.conc")
    try:
        return _render(recipe, point_index, point, conc, host, port, Path(workdir),
                       Path(recipe_dir), env_in, host_dram_mib)
    except dram.BudgetError as e:
        raise InputError(source, str(e), field=e.field) from None
    except ValueError as e:
        raise InputError(source, str(e)) from None


def _render(recipe: Recipe, idx: int, point: Point, conc: int | None, host: str, port: int,
            workdir: Path, recipe_dir: Path, env_in: Mapping[str, str],
            host_mib: int | None) -> Rendered:
    def x(text: str) -> str:
        return expand(text, env_in, recipe.env_help)

    command = [x(c) for c in recipe.command]
    model = x(recipe.model)
    argv = command + ([model] if command[-1] == "serve" else ["--model", model])
    out = Rendered(recipe, idx, conc, argv, base_url=f"http://{host}:{port}",
                   served_name=recipe.served_model_name or model)
    if recipe.served_model_name:
        argv += ["--served-model-name", recipe.served_model_name]
    argv += ["--host", host, "--port", str(port), "--tensor-parallel-size", str(point.tp)]
    if point.dp > 1:
        argv += ["--data-parallel-size", str(point.dp)]
    if point.ep > 1:
        argv.append("--enable-expert-parallel")
    for flag, value in (("--tokenizer", recipe.tokenizer and x(recipe.tokenizer)),
                        ("--load-format", recipe.load_format),
                        ("--gpu-memory-utilization", recipe.gpu_memory_utilization),
                        ("--block-size", recipe.block_size),
                        ("--kv-cache-dtype", recipe.kv_cache_dtype),
                        ("--attention-backend", recipe.attention_backend),
                        ("--max-model-len", recipe.max_model_len),
                        ("--max-num-seqs", recipe.max_num_seqs),
                        ("--max-num-batched-tokens", recipe.max_num_batched_tokens)):
        if value is not None:
            argv += [flag, str(value)]
    if recipe.default_chat_template_kwargs:
        argv += ["--default-chat-template-kwargs", compact(recipe.default_chat_template_kwargs)]
    spec = _spec_config(recipe, point, conc, recipe_dir, x, out)
    if spec is not None:
        argv += ["--speculative-config", compact(spec)]
    out.env.update({k: x(v) for k, v in recipe.env.items()})
    kv = _kv_offload(recipe, point, port, workdir, host_mib, out)
    if kv is not None:
        argv += ["--kv-transfer-config", compact(kv)]
    argv += [x(a) for a in recipe.extra_args]
    return out


def _spec_config(recipe: Recipe, point: Point, conc: int | None, recipe_dir: Path, x,
                 out: Rendered) -> dict | None:
    s = recipe.speculative
    k = spec_k(recipe, point, conc)
    if s is None or k is None:
        return None
    cfg: dict = {"method": s.method}
    if s.draft:
        cfg["model"] = x(s.draft)
    cfg["num_speculative_tokens"] = k
    if s.attention_backend:
        cfg["attention_backend"] = s.attention_backend
    al = synthetic_al(recipe, k, recipe_dir, out.notes)
    if al is not None:
        cfg["rejection_sample_method"] = "synthetic"
        cfg["synthetic_acceptance_length"] = al
    cfg.update(s.extra)
    out.k, out.synthetic_al = k, al
    return cfg


def synthetic_al(recipe: Recipe, k: int, recipe_dir: Path, notes: list[str]) -> float | None:
    """The recipe's synthetic acceptance length at this K (a golden lookup if asked)."""
    s = recipe.speculative
    al = s.synthetic_al if s is not None else None
    if al == "golden":
        key = golden_key(recipe)
        al = golden_al(recipe_dir / s.golden_file, key, recipe.thinking, k)
        notes.append(f"synthetic AL {al} = golden {key} "
                     f"thinking_{'on' if recipe.thinking else 'off'} K={k} ({s.golden_file})")
    if al is not None and not 1.0 <= al <= k + 1:
        raise ValueError(f"synthetic AL {al} outside [1, K+1 = {k + 1}]")
    return al


def golden_key(recipe: Recipe) -> str:
    """The golden file's key for this recipe: golden_model, else the draft, else the model (as
    written, unexpanded, so the key does not depend on this machine's paths)."""
    s = recipe.speculative
    return (s.golden_model or s.draft if s is not None else None) or recipe.model


def golden_pin(recipe: Recipe, k: int | None, recipe_dir: Path) -> dict | None:
    """The golden entry a point's synthetic AL comes from (RunConfig.golden_al), or None when
    the recipe does not pin `synthetic_al: golden` or the point runs without speculation."""
    s = recipe.speculative
    if s is None or k is None or s.synthetic_al != "golden":
        return None
    path = recipe_dir / s.golden_file
    return {"file": str(path), "model": golden_key(recipe), "k": k,
            "thinking": "on" if recipe.thinking else "off",
            "al": golden_al(path, golden_key(recipe), recipe.thinking, k)}


def tier(recipe: Recipe, point: Point, host_mib: int | None = None) -> Tier:
    """Work out the point's tier; `host_mib` overrides the recipe's host DRAM."""
    return recipe.offload(point).plan(point.gpus, host_mib)


def _kv_offload(recipe: Recipe, point: Point, port: int, workdir: Path,
                host_mib: int | None, out: Rendered) -> dict | None:
    c = recipe.offload(point)
    t = c.plan(point.gpus, host_mib)
    out.kv_offload, out.offload_bytes, out.offload_held_bytes = t.kind, t.total_bytes, t.held_bytes
    out.allocated_dram_gb = t.allocated_gb
    if t.budget is not None:
        out.dram_steps = t.budget.steps
    launch = c.render(t, port=port, workdir=workdir)
    out.env.update(launch.env)
    out.files.update(launch.files)
    out.sidecars += launch.sidecars
    return launch.kv_transfer_config
