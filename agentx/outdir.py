"""The run's output directory: never mixes two runs, never left behind empty by a failed start."""
from __future__ import annotations

import os
from pathlib import Path

import orjson

from .errors import InputError

FLAG = "--output-dir"
RUN_JSON, SUMMARY_JSON = "run.json", "summary.json"
# what a run writes; --overwrite removes exactly these, nothing else a user keeps there
RESULT_GLOBS = ("requests.jsonl", "requests.w*.jsonl", SUMMARY_JSON, RUN_JSON, "metrics.jsonl",
                "*.png")


def write_json(path: Path, doc: dict) -> Path:
    """Write through a temporary file and a rename: a reader (or a later `agentx report`)
    sees the old file or the whole new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)
    return path


def write_run_json(out: Path, meta: dict) -> Path:
    """run.json: the config, target, labels and run metadata, written when the run starts so
    that a run killed before its summary still says what it was."""
    return write_json(out / RUN_JSON, meta)


def check_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse, before any traffic, a directory holding another run's results (unless
    overwrite) or one that cannot be created or written."""
    if out.exists():
        if not out.is_dir():
            raise InputError(str(out), "exists and is not a directory", field=FLAG)
        if any(out.iterdir()) and not overwrite:
            raise InputError(str(out), "is not empty: a run's files would mix with another's "
                             "(use --overwrite, or another --output-dir)", field=FLAG)
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(str(out), "is not writable", field=FLAG)
        return
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(str(out), f"cannot be created ({parent} is not a writable directory)",
                         field=FLAG)


def create_output_dir(out: Path, overwrite: bool) -> Path:
    """Create it (once start-up has succeeded) and clear a previous run's result files."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for pattern in RESULT_GLOBS:
                for f in out.glob(pattern):
                    f.unlink()
    except OSError as e:
        raise InputError(str(out), f"cannot be created or cleared ({e.strerror or e})",
                         field=FLAG) from None
    return out
