"""The run's output directory: never mixes two runs, never left behind empty by a failed start,
never loses a user's file to --overwrite, never holds half a result file.

Every file agentx writes into a run directory is named in its manifest, `.agentx-files` (one
name a line, written when the directory is created, extended as worker files and plots are
written); `--overwrite` removes exactly the files the previous run's manifest names. A
directory from before manifests existed loses only the fixed names a run writes (LEGACY)."""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import orjson

from .errors import InputError, OutputError

FLAG = "--output-dir"
RUN_JSON, SUMMARY_JSON = "run.json", "summary.json"
REQUESTS, METRICS = "requests.jsonl", "metrics.jsonl"
MANIFEST = ".agentx-files"
RUN_FILES = (RUN_JSON, REQUESTS, METRICS, SUMMARY_JSON)
# what a run (and `agentx report` in it) wrote before manifests: exact names, never a pattern
# that could match a user's file (a user's diagram.png stays)
LEGACY = (*RUN_FILES, "latency_cdf.png", "server_timeseries.png")
LEGACY_WORKER = re.compile(r"requests\.w[0-9]+\.jsonl")
_JSON = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY


def write_json(path: Path, doc: dict) -> Path:
    """Write through a temporary file, synced, and a rename: a reader (or a later `agentx
    report`) sees the old file or the whole new one, never half of one, even when the disk
    fills (OutputError, the temporary file removed)."""
    return write_bytes(path, orjson.dumps(doc, option=_JSON))


def write_bytes(path: Path, data: bytes) -> Path:
    """`path` replaced whole by `data` (write_json's temporary file and rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputError(str(path), e, kept="the previous file, if any, is unchanged") \
            from None
    return path


def own_files(out: Path) -> list[str]:
    """The files agentx wrote in `out`, as its manifest names them (plain names only)."""
    try:
        text = (out / MANIFEST).read_text(errors="replace")
    except OSError:
        return []
    return [n for n in dict.fromkeys(text.splitlines())
            if n and n not in (".", "..", MANIFEST) and "/" not in n and "\\" not in n]


def register(out: Path, *names: str) -> None:
    """Add file names to `out`'s manifest (files agentx writes there; --overwrite's list)."""
    have = own_files(out)
    new = [n for n in names if n not in have]
    if new:
        write_bytes(out / MANIFEST, "".join(f"{n}\n" for n in [*have, *new]).encode())


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


def previous_files(out: Path) -> list[Path]:
    """What --overwrite removes: the files a previous run's manifest names; without one (a
    run from before manifests), the fixed names a run writes. Never anything else."""
    if (out / MANIFEST).exists():
        names = own_files(out)
    else:
        names = [*LEGACY, *(f.name for f in out.iterdir() if LEGACY_WORKER.fullmatch(f.name))]
    return [out / n for n in names if (out / n).is_file() or (out / n).is_symlink()]


def create_output_dir(out: Path, overwrite: bool) -> Path:
    """Create it (once start-up has succeeded), clear a previous run's files (its manifest's,
    nothing else) and start this run's manifest."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for f in previous_files(out):
                f.unlink()
            with contextlib.suppress(FileNotFoundError):
                (out / MANIFEST).unlink()
    except OSError as e:
        raise InputError(str(out), f"cannot be created or cleared ({e.strerror or e})",
                         field=FLAG) from None
    register(out, *RUN_FILES)
    return out
