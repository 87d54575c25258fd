"""Which server to get, as data: a choice discriminated by `kind`, opened by
targets.open.open_server (the one call that opens any server, as GuideLLM's Backend.create).

`kind` is the vocabulary every file agentx writes uses for a server (summary.json's
`target.kind`, sweep.json, calibration cells, ab.json's sides): `url` (a server already
running), `vllm` (a recipe point launched on vLLM), `sim` (a recipe point on the simulator,
its own process), `embedded` (the simulator beside the client, `agentx run` without
--base-url). A recipe choice's kind (vllm or sim) is decided when it is made (`pick_kind`).
"""
from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from ..errors import InputError
from ..options import StrictModel, opt
from ..recipe.schema import Recipe

if TYPE_CHECKING:
    from ..golden_al import GoldenPin
    from ..sim.config import SimConfig

Kind = Literal["url", "vllm", "sim", "embedded"]


def pick_kind(recipe: Recipe, sim: bool = False) -> tuple[Literal["vllm", "sim"], str]:
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


class LaunchOptions(StrictModel):
    """How a recipe's server is launched (`serve`, `sweep`)."""

    sim: bool = opt(False, "serve with the simulator and the recipe's sim_profile (the default "
                    "when neither a GPU nor vLLM is present)")
    health_timeout_s: float | None = opt(None, "seconds to wait for /health (default: the "
                                         "recipe's health_timeout_s)", flag="health_timeout",
                                         old=("--timeout",), gt=0.0, metavar="S")


@dataclass(frozen=True)
class UrlChoice:
    """A server already running at `url`; `model` and `offload_tokens` when known."""

    url: str
    model: str | None = None
    offload_tokens: int | None = None
    kind: Literal["url"] = "url"

    @property
    def why(self) -> str:
        return f"the server at {self.url}"


@dataclass(frozen=True)
class RecipeChoice:
    """One point of a recipe (at `conc`, which may choose its K), launched in `workdir` (its
    logs, command.sh and rendered files stay there; default: a temporary directory) on vLLM
    or on the simulator (`kind`). `sim_overrides` are SimConfig fields on top of the recipe's;
    `health_timeout_s` (default: the recipe's) bounds the wait for /health; `named` is how the
    user named the recipe (default: `source`, its path). Made by `RecipeChoice.of`."""

    recipe: Recipe
    kind: Literal["vllm", "sim"]
    why: str
    point: int = 0
    conc: int | None = None
    workdir: Path | None = None
    recipe_dir: Path = Path(".")
    source: str = "recipe"
    named: str | None = None
    sim_overrides: dict = field(default_factory=dict)
    health_timeout_s: float | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    on_log: Callable[[str], None] | None = None
    host_dram_mib: int | None = None

    @classmethod
    def of(cls, recipe: Recipe, path: Path, *, sim: bool | None = None, **kw: object
           ) -> RecipeChoice:
        """The choice for `recipe` read from `path`: `sim` True serves it on the simulator,
        None decides by pick_kind (vLLM when a GPU and vLLM are here), False on vLLM."""
        kind, why = pick_kind(recipe, bool(sim)) if sim is not False else \
            ("vllm", f"launching `{' '.join(recipe.command)}` per point")
        return cls(recipe, kind, why, recipe_dir=path.parent,  # type: ignore[arg-type]
                   source=str(path), **kw)


@dataclass(frozen=True)
class EmbeddedChoice:
    """The simulator beside the client on a free loopback port: `options` (SimConfig fields
    but host, port, api_key), the `api_key` it requires, the golden `pin` its synthetic AL
    is pinned to (RunConfig.golden_al)."""

    options: SimConfig | dict | None = None
    api_key: str | None = None
    pin: GoldenPin | None = None
    start_timeout_s: float = 60.0
    kind: Literal["embedded"] = "embedded"


ServerChoice = UrlChoice | RecipeChoice | EmbeddedChoice
