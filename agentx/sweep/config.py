"""Every option of `agentx sweep`, declared once: the command line is derived from it and the
sweep runs from it, as `agentx ab` runs from ABConfig and `agentx calibrate` from
CalibrateConfig."""
from __future__ import annotations

from pydantic import field_validator, model_validator

from ..config import SecondsOrAuto
from ..metrics.cost import CostOption
from ..metrics.percentiles import PercentilesOption
from ..options import opt
from ..targets.choice import LaunchOptions
from ..yamlconf import load_value
from .search import SloSearch, parse_search


class SweepConfig(LaunchOptions, PercentilesOption, CostOption):
    """Every option of `agentx sweep`, declared once (the command line is derived from it)."""

    recipe: str = opt("", "recipe name (recipes/NAME.yaml) or file; leave it out with "
                      "--base-url and --conc to sweep that running server", positional=True,
                      metavar="NAME|PATH")
    base_url: str | None = opt(None, "use this running server for every point instead of "
                               "launching one", metavar="URL")
    points: list[int] | None = opt(None, "only these operating points (indices)",
                                   metavar="I,J")
    conc: list[int] | None = opt(None, "these concurrencies at every point instead of the "
                                 "recipe's lists", metavar="C,D")
    output_dir: str | None = opt(None, "default: results/sweep-<time>-<recipe>", short="-o")
    resume: bool = opt(False, "skip cells whose summary.json exists (and was not rebuilt)")
    duration_s: float | None = opt(None, "seconds per cell, overriding the recipe's "
                                   "run.duration_s", flag="duration", ge=0.0, metavar="S")
    warmup_s: SecondsOrAuto | None = opt(None, "warm-up per cell, overriding the recipe's "
                                         "run.warmup_s: seconds, or auto (until every lane "
                                         "has finished its first request)", flag="warmup",
                                         metavar="S|auto")
    run_set: list[str] = opt(None, "a run option for every cell (a RunConfig field, YAML "
                             "value), e.g. think_scale=0.1; repeatable", factory=list,
                             flag="set", repeat=True, metavar="KEY=VALUE")
    search: str | None = opt(None, "SLO saturation search: per point, the highest "
                             "concurrency whose goodput (share of requests meeting every SLO) "
                             "reaches G (default 0.9), by bisection instead of every listed "
                             "concurrency", metavar="ttft:MS,tpot:MS[,e2el:MS][,goodput:G]")
    search_min: int | None = opt(None, "the search's lowest concurrency (default: the "
                                 "point's smallest)", ge=1, metavar="C")
    search_max: int | None = opt(None, "the search's highest concurrency (default: the "
                                 "point's largest)", ge=1, metavar="C")
    search_max_cells: int = opt(6, "cells the search may run per point", ge=1, metavar="N")
    sim_time_scale: float | None = opt(None, "the simulator runs F x faster than real time "
                                       "(tests)", gt=0.0, metavar="F")

    @field_validator("run_set")
    @classmethod
    def _pairs(cls, v: list[str]) -> list[str]:
        for item in v:
            key, eq, _ = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"expected KEY=VALUE, got {item!r}")
        return v

    @field_validator("search")
    @classmethod
    def _search(cls, v: str | None) -> str | None:
        if v is not None:
            parse_search(v)  # ValueError: the one-line message
        return v

    @model_validator(mode="after")
    def _recipe_or_url(self) -> "SweepConfig":
        if not self.recipe and not (self.base_url and self.conc):
            raise ValueError("give a recipe (NAME|PATH), or --base-url URL with --conc C,D to "
                             "sweep a running server")
        return self

    @model_validator(mode="after")
    def _search_bounds(self) -> "SweepConfig":
        # a value other than the default, not "was given": --print-config writes every field
        default_cells = type(self).model_fields["search_max_cells"].default
        if self.search is None and (self.search_min or self.search_max
                                    or self.search_max_cells != default_cells):
            raise ValueError("--search-min, --search-max and --search-max-cells need --search")
        if self.search_min and self.search_max and self.search_min > self.search_max:
            raise ValueError(f"--search-min {self.search_min} > --search-max {self.search_max}")
        return self

    def slo_search(self) -> SloSearch | None:
        """The --search options as the sweep takes them."""
        if self.search is None:
            return None
        slo, target = parse_search(self.search)
        return SloSearch(slo, target, self.search_min, self.search_max, self.search_max_cells)

    def overrides(self) -> dict:
        """RunConfig fields every cell takes: --duration, --warmup, then each --set, and the
        search's SLOs."""
        out: dict = {k: v for k, v in (("duration_s", self.duration_s),
                                       ("warmup_s", self.warmup_s),
                                       ("percentiles", self.percentiles),
                                       ("gpu_hour_usd", self.gpu_hour_usd)) if v is not None}
        for item in self.run_set:
            key, _, value = item.partition("=")
            out[key.strip()] = load_value(value, "command line --set")
        search = self.slo_search()
        return out if search is None else {**out, "slo": search.slo}
