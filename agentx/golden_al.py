"""Golden acceptance lengths: the calibrated mean AL of a draft per thinking mode and K.

Same layout as InferenceX's `golden_al_distribution/<model>_eagle3.yaml`:
`<model>: {thinking_on: {K: AL, ...}, thinking_off: {...}}`. A recipe with
`synthetic_al: golden` pins vLLM's synthetic acceptance to the value for its draft, thinking
mode and K, so a benchmark reproduces the calibrated speculative speed-up without the real
draft's acceptance varying run to run. Missing values are errors, never guessed.
A base module: a run's options (config.GoldenPin), recipes and calibration all read it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import RootModel, model_validator

from .errors import InputError
from .options import FieldError, StrictModel, opt
from .yamlconf import load_file


class ModelAL(StrictModel):
    thinking_on: dict[int, float] = opt(None, "K -> AL with thinking on", factory=dict)
    thinking_off: dict[int, float] = opt(None, "K -> AL with thinking off", factory=dict)

    @model_validator(mode="after")
    def _in_range(self) -> ModelAL:
        for mode in ("thinking_on", "thinking_off"):
            for k, al in getattr(self, mode).items():
                if k < 1 or not 1.0 <= al <= k + 1:
                    raise FieldError(mode, f"K={k}: AL {al} outside [1, K+1] (K >= 1)")
        return self


class GoldenFile(RootModel[dict[str, ModelAL]]):
    pass


def load_golden(path: str | Path) -> dict[str, ModelAL]:
    return load_file(path, GoldenFile).root


def golden_al(path: str | Path, model: str, thinking: bool, k: int) -> float:
    """The golden AL, or InputError naming what is missing."""
    table = load_golden(path)
    if model not in table:
        raise InputError(str(path), f"no golden AL for model {model!r} (has: "
                         f"{', '.join(sorted(table)) or 'none'})")
    mode = "thinking_on" if thinking else "thinking_off"
    values = getattr(table[model], mode)
    if k not in values:
        raise InputError(str(path), f"no golden AL for {model} {mode} K={k} (has K: "
                         f"{', '.join(map(str, sorted(values))) or 'none'})", field=model)
    return values[k]


def mode_key(thinking: bool | str) -> str:
    """`thinking_on` / `thinking_off` from a bool or "on" / "off"."""
    on = thinking if isinstance(thinking, bool) else thinking in ("on", "thinking_on")
    return "thinking_on" if on else "thinking_off"


class GoldenPin(StrictModel):
    """The golden entry a run's synthetic AL was pinned from, recorded in its summary so that
    validation can check the measured AL against it and the traffic's thinking mode against
    the entry's. Given as FILE:MODEL:MODE:K (MODE on|off) or a mapping; `al` is read from the
    file (and kept, so a worker process or Ray actor does not need the file)."""

    file: str = opt(..., "golden AL file", min_length=1)
    model: str = opt(..., "key of the golden file (the draft)", min_length=1)
    thinking: Literal["on", "off"] = opt(..., "the thinking mode the entry was calibrated in")
    k: int = opt(..., "num_speculative_tokens", ge=1)
    al: float = opt(..., "the entry's acceptance length", ge=1.0)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if isinstance(v, str):
            parts = v.rsplit(":", 3)
            if len(parts) != 4:
                raise ValueError("give FILE:MODEL:MODE:K, e.g. recipes/golden/x.yaml:"
                                 "my/draft:on:3")
            v = dict(zip(("file", "model", "thinking", "k"), parts))
        if isinstance(v, dict):
            v = dict(v)
            t = v.get("thinking")
            if isinstance(t, bool) or t in ("thinking_on", "thinking_off"):
                v["thinking"] = mode_key(t).removeprefix("thinking_")
            if "al" not in v and {"file", "model", "thinking", "k"} <= v.keys():
                try:
                    v["al"] = golden_al(v["file"], v["model"], v["thinking"] == "on",
                                        int(v["k"]))
                except (InputError, ValueError) as e:
                    raise ValueError(str(e).removeprefix("error: ")) from None
        return v

    def label(self) -> str:
        return f"{self.model} thinking_{self.thinking} K={self.k} = {self.al} ({self.file})"

