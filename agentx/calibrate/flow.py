"""`calibrate(cfg)`: for each K a server, for each thinking mode a measurement, then the
golden file and calibration.json (every cell, with its interval and run directory)."""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ..golden_al import mode_key
from ..recipe.load import load_recipe
from ..recipe.render import golden_key
from ..recipe.schema import Recipe
from ..rundir import CalibrationDir
from ..sim.specdec import default_rates
from ..targets.base import Target, read_model, read_version
from .config import CalibrateConfig
from .golden_merge import Entry, merge
from .measure import Measurement, Workload, measure
from .servers import recipe_ks, server_at_k

Say = Callable[[str], None]


def served_model(url: str) -> str:
    try:
        return read_model(url)
    except Exception as e:  # noqa: BLE001 - any failure: the user's --url is wrong
        raise InputError(url, f"cannot list models at /v1/models ({e})", field="--url") from None


def workload(cfg: CalibrateConfig, run_opts: dict) -> Workload:
    extra: dict = {"temperature": cfg.temperature}
    if cfg.max_tokens:
        extra["max_tokens"] = cfg.max_tokens
    if cfg.prompts:
        from .prompts import load_prompts

        load_prompts(cfg.prompts)  # a bad file fails before any server starts
    return Workload(trace=cfg.trace or run_opts.get("trace") or "swe",
                    context_scale=cfg.context_scale or run_opts.get("context_scale") or 1.0,
                    prompts=cfg.prompts, requests=cfg.requests, extra_body=extra,
                    seed=cfg.seed)


def golden_path(cfg: CalibrateConfig, name: str, out: Path) -> Path:
    """--golden, else `<output-dir>/golden/<name>.yaml`: never into the recipes of the source
    tree or the installed package, which a calibration run must not change behind the user."""
    if cfg.golden:
        return Path(cfg.golden)
    stem = cfg.out or re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
    return out / "golden" / f"{stem}.yaml"


def provenance(m: Measurement, t: Target, version: str | None, draft: str, w: Workload) -> str:
    iv = m.interval
    server = "agentx simulator" if t.kind == "sim" else f"vLLM {version or '?'}"
    sampling = ", ".join(f"{k}={v}" for k, v in w.extra_body.items())
    return (f"AL {m.al:.4f}, 95% interval {iv.low:.2f}-{iv.high:.2f} ({iv.source}, "
            f"{iv.requests} requests); {time.strftime('%Y-%m-%d')}; {server}; model "
            f"{t.model}; draft {draft}; {w.describe()}; {sampling}, ignore_eos; "
            f"{m.completed} requests at conc 1, {m.drafts:.0f} drafts")


def calibrate(cfg: CalibrateConfig, say: Say = print) -> dict:
    recipe = path = None
    run_opts: dict = {}
    if cfg.recipe:
        recipe, path = load_recipe(cfg.recipe)
        run_opts = recipe.run_options()
        ks = cfg.k or recipe_ks(recipe, str(path))
        s = recipe.speculative
        if s is None:
            recipe_ks(recipe, str(path))  # raises: nothing to calibrate
        draft = f"{s.method} {s.draft}" if s.draft else s.method
    else:
        ks, draft = cfg.k or sorted(cfg.url_map()), "(--url: not stated)"
    w = workload(cfg, run_opts)
    folder = CalibrationDir.at(cfg.output_dir).create()
    out = folder.path
    cells: list[dict] = []
    entries: list[Entry] = []
    key = cfg.golden_model or (golden_key(recipe) if recipe else None)
    for k in ks:
        say(f"K={k}: starting the server" if recipe else f"K={k}: {cfg.url_map()[k]}")
        with server_at_k(cfg, recipe, path, k, out / f"k{k}" / "server") as t:
            t.model = t.model or served_model(t.url)
            if key is None:
                key = t.model
                if _is_path(key):
                    say(f"note: the golden key {key} is the server's model path (vLLM reports it "
                        "when started without --served-model-name); a recipe looks its AL up by "
                        "speculative.golden_model, else its draft as written: give --golden-model "
                        "to write under that key")
            version = read_version(t.url).get("version")
            for mode in cfg.thinking:
                m = measure(w, cfg, t.url, t.model, k, mode, out / f"k{k}" / f"thinking-{mode}")
                cell = {**m.record(), "kind": t.kind, "server_version": version,
                        "model": t.model}
                if t.kind == "sim":  # the simulator's own acceptance: the truth to recover
                    cell["true_al"] = 1.0 + sum(default_rates(k))
                cells.append(cell)
                say(line(m))
                if m.error is None:
                    entries.append(Entry(mode_key(mode), k, m.al,
                                         provenance(m, t, version, draft, w)))
    gpath = golden_path(cfg, recipe.name if recipe and not cfg.golden_model else key, out)
    if entries:
        merge(gpath, key, entries)
    result = {"golden_file": str(gpath) if entries else None, "golden_model": key,
              "workload": w.describe(), "sampling": w.extra_body, "cells": cells}
    folder.write_json(CalibrationDir.JSON, result)
    result["output_dir"] = str(out)
    if recipe and entries:
        say(pin_note(recipe, path, gpath))
    elif entries:
        say(f"note: written to {gpath} under {key}; a recipe pins these values with "
            f"`golden_file: {gpath.resolve()}`, `synthetic_al: golden` and `golden_model: {key}`")
    return result


def _is_path(name: str) -> bool:
    """A served model name that is a filesystem path (vLLM's default: the --model argument)."""
    return os.path.isabs(name) or name.startswith(("~", "./", "../"))


def pin_note(recipe: Recipe, path: Path, gpath: Path) -> str:
    """How a recipe comes to use what was written (`synthetic_al: golden` reads its
    golden_file, relative to the recipe)."""
    reads = (path.parent / recipe.speculative.golden_file).resolve()
    if reads == gpath.resolve():
        return f"note: recipe {recipe.name} reads {gpath}: its golden AL uses these values"
    rel = os.path.relpath(gpath.resolve(), path.parent.resolve())
    rel = str(gpath.resolve()) if rel.startswith("..") else rel
    return (f"note: written to {gpath}; recipe {recipe.name} reads {reads}: merge into it "
            f"with --golden {reads}, or give the recipe `golden_file: {rel}` and "
            "`synthetic_al: golden`, to pin these values")


def line(m: Measurement) -> str:
    head = f"  K={m.k} thinking {m.thinking}:"
    if m.error:
        return f"{head} FAILED: {m.error}"
    iv = m.interval
    pos = ", ".join(f"{p:.2f}" for p in (m.per_position or []))
    return (f"{head} AL {m.al:.3f} [{iv.low:.3f}, {iv.high:.3f}] ({iv.source}), per position "
            f"[{pos}], {m.drafts:.0f} drafts, {m.completed} requests ok, {m.failed} failed")
