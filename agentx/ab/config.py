"""Every option of `agentx ab`, declared once: the shared run options are RunConfig's (both
sides run with the same trace, seed, lanes and duration), plus the two sides and how they are
scheduled and compared."""
from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from ..config import RunConfig
from ..options import FieldError, StrictModel, opt
from ..rundir import ABDir
from ..sim.config import SimConfig

AB = "A/B comparison"
# RunConfig fields a side sets itself (its server, its result directory)
SIDE_FIELDS = ("base_url",)


class BootstrapOptions(StrictModel):
    """The intervals' options, declared once: `agentx ab` and `agentx compare` inherit them."""

    bootstrap: int = opt(2000, "bootstrap replicates for the 95% intervals", group=AB,
                         ge=100, le=100000)
    min_sessions: int = opt(10, "a side with fewer measured sessions gets no verdict "
                            "(insufficient): the intervals resample sessions", group=AB, ge=0)


class ABConfig(RunConfig, BootstrapOptions):
    a: str | None = opt(None, "side A: a server URL (http://...) or a recipe name/path",
                        group=AB, min_length=1)
    b: str | None = opt(None, "side B: a server URL or a recipe name/path", group=AB,
                        min_length=1)
    repeats: int = opt(1, "runs per side (each of --duration or --max-requests); repeat i "
                       "uses seed + i - 1 on both sides. From 2, the intervals resample runs, "
                       "then sessions, so they cover run-to-run variance (use 3 or more for "
                       "short runs)", group=AB, ge=1, le=1000)
    interleave: bool = opt(False, "alternate the sides run by run (A B A B ...) instead of "
                           "all of A then all of B, so a drift of the servers or the machine "
                           "falls on both sides", group=AB)
    parallel: bool = opt(False, "run both sides at the same time, against two servers",
                         group=AB)
    point: int = opt(0, "operating point index of a recipe side", group=AB, ge=0)
    recipe_sim: bool = opt(False, "serve recipe sides with the simulator and the recipe's "
                           "sim_profile (the default when neither a GPU nor vLLM is present); "
                           "--sim-* flags given apply on top", flag="sim",
                           old=("--recipe-sim",), group=AB)
    a_label: str | None = opt(None, "a name for side A in tables, plots and its runs' labels "
                              "(default: A)", group=AB, min_length=1, max_length=60)
    b_label: str | None = opt(None, "a name for side B (default: B)", group=AB, min_length=1,
                              max_length=60)
    # recipe sides on the simulator: `--sim-<option>` flags, on top of the recipe's
    sim: SimConfig = opt(None, "simulator options of recipe sides", factory=SimConfig,
                         cli=False)

    @model_validator(mode="after")
    def _sides(self) -> "ABConfig":
        for side in ("a", "b"):
            if getattr(self, side) is None:
                raise FieldError(side, "required: a server URL or a recipe name/path")
        if self.base_url is not None:
            raise FieldError("base_url", "give the servers as --a and --b")
        if self.parallel and self.a == self.b:
            raise FieldError("parallel", "--parallel needs two servers (--a and --b are the "
                             "same)")
        if self.parallel and self.interleave:
            raise FieldError("interleave", "--interleave and --parallel exclude each other")
        return self

    def side_config(self, side: str, repeat: int, base_url: str, model: str | None,
                    out: Path, offload_tokens: int | None = None) -> RunConfig:
        """The run options of one side's repeat (1-based): same for A and B but the server
        (and its offload tier's size where its recipe gives it and --offload-tokens does not)."""
        data = self.model_dump(exclude=set(ABConfig.model_fields) - set(RunConfig.model_fields))
        data.update(base_url=base_url, seed=self.seed + repeat - 1, overwrite=True,
                    output_dir=str(ABDir(out).side_run(side, repeat)), api_key=self.api_key,
                    labels={**self.labels, "ab_side": self.side_name(side),
                            "repeat": str(repeat)})
        if model:
            data["model"] = model
        if self.offload_tokens is None and offload_tokens is not None:
            data["offload_tokens"] = offload_tokens
        if self.parallel:
            data["progress"] = False  # two live displays would overwrite each other
        return RunConfig.model_validate(data)

    def side_name(self, side: str) -> str:
        """`A` / `B`, or the name the user gave the side."""
        return (self.a_label if side == "a" else self.b_label) or side.upper()

    def schedule(self) -> list[tuple[str, int]]:
        """(side, repeat) in running order: A1..AR B1..BR, or A1 B1 A2 B2 ... interleaved."""
        r = range(1, self.repeats + 1)
        if self.interleave:
            return [(s, i) for i in r for s in ("a", "b")]
        return [("a", i) for i in r] + [("b", i) for i in r]

