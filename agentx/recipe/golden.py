"""Golden acceptance lengths: the calibrated mean AL of a draft per thinking mode and K.

Same layout as InferenceX's `golden_al_distribution/<model>_eagle3.yaml`:
`<model>: {thinking_on: {K: AL, ...}, thinking_off: {...}}`. A recipe with
`synthetic_al: golden` pins vLLM's synthetic acceptance to the value for its draft, thinking
mode and K, so a benchmark reproduces the calibrated speculative speed-up without the real
draft's acceptance varying run to run. Missing values are errors, never guessed.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import RootModel, model_validator

from ..errors import InputError
from ..options import FieldError, StrictModel, opt
from ..yamlconf import load_file


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
