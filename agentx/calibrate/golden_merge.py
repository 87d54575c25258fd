"""Write or merge a golden AL file: `<model>: {thinking_on: {K: AL}, thinking_off: {...}}`
(InferenceX's layout), ALs rounded to 2 decimals, one provenance comment per entry in the
leading comment block. Merging keeps every other entry (and the other header lines); comments
elsewhere in the file are not kept. The result is loaded back strictly before it replaces the
old file, so a file that `synthetic_al: golden` cannot read is never left behind."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..golden_al import ModelAL, load_golden

HEADER = ["# Golden mean acceptance lengths (AL) by draft, thinking mode and K, written by "
          "`agentx calibrate`",
          "# (docs/calibration.md): AL = 1 + delta(vllm:spec_decode_num_accepted_tokens) / "
          "delta(vllm:spec_decode_num_drafts)",
          "# at concurrency 1 on a server with real verification, rounded to 2 decimals."]


@dataclass
class Entry:
    mode: str  # thinking_on | thinking_off
    k: int
    al: float
    provenance: str  # one line


def _tag(key: str, mode: str, k: int) -> str:
    return f"# {key} {mode} K={k}:"


def merge(path: Path, key: str, entries: list[Entry]) -> dict[str, ModelAL]:
    """Write `entries` under `key` into `path` (created if missing); returns the new table."""
    table: dict[str, ModelAL] = {}
    header = list(HEADER)
    if path.exists():
        table = load_golden(path)  # strict: a broken file is an error, not overwritten
        text = path.read_text(encoding="utf-8").splitlines()
        header = []
        for line in text:
            if not line.startswith("#"):
                break
            header.append(line)
    model = table.get(key) or ModelAL()
    for e in entries:
        tag = _tag(key, e.mode, e.k)
        header = [h for h in header if not h.startswith(tag)]
        header.append(f"{tag} {e.provenance}")
        getattr(model, e.mode)[e.k] = round(e.al, 2)
    table[key] = model
    data = {name: {mode: dict(sorted(getattr(m, mode).items()))
                   for mode in ("thinking_on", "thinking_off") if getattr(m, mode)}
            for name, m in table.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False),
                   encoding="utf-8")
    try:
        load_golden(tmp)
    except Exception:
        tmp.unlink()
        raise
    os.replace(tmp, path)
    return table
