"""Every option of `agentx calibrate`, declared once (the command line is derived from it)."""
from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from ..options import FieldError, StrictModel, opt
from ..urls import normalise_base_url

SERVER, WORK, OUT = "server", "prompts", "output"


class CalibrateConfig(StrictModel):
    # --- server ---
    recipe: str | None = opt(None, "recipe name or path: a clean server is launched per K with "
                             "real verification (the recipe's synthetic AL is dropped)",
                             group=SERVER)
    url: list[str] = opt(None, "K=URL of a running server per K, e.g. 1=http://h:8000,"
                         "3=http://h:8001 (instead of --recipe)", factory=list, group=SERVER)
    sim: bool = opt(False, "serve with the recipe's simulator profile instead of vLLM; the "
                    "simulator's own acceptance (1 + sum of 0.8^i) is the true AL", group=SERVER)
    k: list[int] = opt(None, "K values (num_speculative_tokens) to calibrate (default: the "
                       "recipe's K, or the --url keys)", factory=list, group=SERVER)
    per_request_spec: bool = opt(False, "launch vLLM with --per-request-spec-decode-metrics "
                                 "summary (vLLM >= 0.32): the interval then comes from the "
                                 "server's per-request counts", group=SERVER)
    health_timeout_s: float | None = opt(None, "seconds to wait for /health (default: the "
                                         "recipe's)", flag="health_timeout", group=SERVER, gt=0.0)
    sim_time_scale: float = opt(1.0, "the simulator runs F x faster than real time",
                                group=SERVER, gt=0.0)
    # --- prompts ---
    thinking: list[Literal["on", "off"]] = opt(["on", "off"], "thinking modes to calibrate",
                                               group=WORK, min_length=1)
    requests: int = opt(40, "requests per (thinking mode, K), sent one at a time",
                        group=WORK, ge=2)
    prompts: str | None = opt(None, "JSONL file of chat requests (`messages`, optional "
                              "`max_tokens` and sampling keys), cycled, instead of the "
                              "trace's synthesized coding turns", group=WORK)
    trace: str | None = opt(None, "trace whose coding turns are synthesized (default: the "
                            "recipe's run.trace, else swe)", group=WORK)
    context_scale: float | None = opt(None, "scale the trace's token counts (default: the "
                                      "recipe's run.context_scale, else 1)", group=WORK, gt=0.0)
    max_tokens: int | None = opt(None, "output tokens per request (default: the trace's or "
                                 "the prompt's)", group=WORK, ge=2)
    temperature: float = opt(0.0, "sampling temperature sent with every request", group=WORK,
                             ge=0.0)
    seed: int = opt(0, "schedule seed (which turns are sent)", group=WORK)
    # --- output ---
    golden: str | None = opt(None, "golden YAML to write or merge into (default: "
                             "<output-dir>/golden/<--golden-name>.yaml; give the recipe's "
                             "golden file to update what it pins)", group=OUT)
    out: str | None = opt(None, "name of the golden file under <output-dir>/golden/ (default: "
                          "the recipe's name, else the served model's)", flag="golden_name",
                          old=("--out",), group=OUT)
    golden_model: str | None = opt(None, "key of the entries (default: the recipe's "
                                   "golden_model, else its draft, else its model; with --url "
                                   "the served model)", group=OUT)
    output_dir: str | None = opt(None, "runs and server logs (default: "
                                 "results/calibrate-<time>)", short="-o", group=OUT)
    bootstrap: int = opt(2000, "bootstrap resamples for the 95% interval", group=OUT, ge=100)

    @field_validator("url")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for item in v:
            key, sep, url = item.partition("=")
            if not sep or not key.strip().isdigit() or int(key) < 1:
                raise ValueError(f"{item!r}: give K=URL with K >= 1")
            normalise_base_url(url.strip())
        return v

    @model_validator(mode="after")
    def _consistent(self) -> CalibrateConfig:
        if (self.recipe is None) == (not self.url):
            raise FieldError("recipe", "give --recipe or --url (one of them)")
        if self.sim and self.recipe is None:
            raise FieldError("sim", "--sim needs --recipe (its sim_profile)")
        if any(k < 1 for k in self.k):
            raise FieldError("k", "K must be >= 1")
        if self.url and self.k and set(self.k) != set(self.url_map()):
            raise FieldError("k", f"--k {self.k} differs from the --url keys "
                             f"{sorted(self.url_map())}")
        return self

    def url_map(self) -> dict[int, str]:
        out = {}
        for item in self.url:
            key, _, url = item.partition("=")
            out[int(key)] = normalise_base_url(url.strip())
        return out
