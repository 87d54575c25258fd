"""The run's output directory: never mixes two runs, never left behind empty by a failed start."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError

FLAG = "--output-dir"
# what a run writes; --overwrite removes exactly these, nothing else a user keeps there
RESULT_GLOBS = ("requests.jsonl", "requests.w*.jsonl", "summary.json", "metrics.jsonl",
                "*.png")


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
