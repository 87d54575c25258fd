"""`load_traces(spec)`: one entry point from a name or path to a TraceSet.

`spec` is a built-in name (``swe``: the shipped synthetic agentic-coding trace) or a path:
a Weka JSON file, a directory of them (recursive, sorted by relative path), a ``.gz``/``.xz``
of one JSON, a ``.tar``/``.tar.gz``/``.tgz``/``.tar.xz``/``.txz`` archive of JSON files (members
sorted by name), or a Mooncake ``.jsonl`` (optionally ``.gz``/``.xz``; also recognised by content).
Built-in names win over a same-named relative path (write ``./swe`` for the path).
"""
from __future__ import annotations

import gc
import gzip
import lzma
import os
import tarfile
import zlib
from pathlib import Path

import orjson

from ..errors import InputError
from ..shipped import data_dir
from .model import Trace, TraceSet
from .mooncake import looks_like_mooncake, parse_mooncake
from .weka import decode_json, traces_from_json

BUILTIN_TRACES = {"swe": "swe.tar.xz"}
TRACES_DIR_ENV = "AGENTX_TRACES_DIR"
_TAR_SUFFIXES = {".tar": "r:", ".tar.gz": "r:gz", ".tgz": "r:gz", ".tar.xz": "r:xz",
                 ".txz": "r:xz"}
_DATA_SUFFIXES = (".json", ".jsonl")
_COMPRESSED = (".gz", ".xz")
_MEMBER_SUFFIXES = {d + c for d in _DATA_SUFFIXES for c in ("", *_COMPRESSED)}


def traces_dir() -> Path:
    """Where built-in traces live: $AGENTX_TRACES_DIR, the wheel's agentx/_traces, or the
    checkout's traces/ (agentx.shipped)."""
    return data_dir("traces", TRACES_DIR_ENV)


def builtin_path(name: str) -> Path:
    return traces_dir() / BUILTIN_TRACES[name]


def load_traces(spec: str) -> TraceSet:
    """Load every session named by `spec` (see module docstring). Raises InputError."""
    if spec in BUILTIN_TRACES:
        path = builtin_path(spec)
        if not path.is_file():
            raise InputError(str(path), f"built-in trace '{spec}' is missing; regenerate it "
                             "with `agentx trace gen`")
        ts = load_path(path)
        ts.name = spec
        return ts
    path = Path(spec)
    if not path.exists():
        if os.sep not in spec and "/" not in spec and not _suffix(path.name):
            raise InputError(spec, "unknown trace name; built-in traces: "
                             + ", ".join(sorted(BUILTIN_TRACES)))
        raise InputError(spec, "no such file or directory")
    return load_path(path)


def load_path(path: Path) -> TraceSet:
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of acyclic objects: collection passes only cost time here
    try:
        traces = _load_dir(path) if path.is_dir() else _load_file(path)
        # Move what exists now out of the cyclic GC's reach: every later full collection
        # would otherwise walk all ~70 M hash ids (~0.3 s stop-the-world), a pause that would
        # land inside a replay's timing. The trace objects are acyclic (freed by refcount).
        gc.freeze()
    finally:
        if gc_was_on:
            gc.enable()
    if not traces:
        raise InputError(str(path), "no trace sessions found (expected *.json, *.json.gz, "
                         "*.json.xz or Mooncake *.jsonl)")
    return TraceSet(name=_stem(path.name), traces=traces, block_size=traces[0].block_size)


def _suffix(name: str) -> str:
    """The format-defining suffix of a file name ('.tar.xz', '.json.gz', '.jsonl', ...)."""
    low = name.lower()
    for suf in sorted([*_TAR_SUFFIXES, *(d + c for d in _DATA_SUFFIXES for c in _COMPRESSED),
                       *_DATA_SUFFIXES, *_COMPRESSED], key=len, reverse=True):
        if low.endswith(suf):
            return suf
    return ""


def _stem(name: str) -> str:
    suf = _suffix(name)
    return name[: len(name) - len(suf)] if suf and len(suf) < len(name) else name


def _load_dir(root: Path) -> list[Trace]:
    files = sorted((p for p in root.rglob("*")
                    if p.is_file() and _suffix(p.name) in _MEMBER_SUFFIXES),
                   key=lambda p: p.relative_to(root).as_posix())
    out: list[Trace] = []
    for p in files:
        out.extend(_load_file(p))
    return out


def _load_file(path: Path) -> list[Trace]:
    source, suf = str(path), _suffix(path.name)
    if suf in _TAR_SUFFIXES:
        return _load_tar(path, _TAR_SUFFIXES[suf])
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InputError(source, f"cannot read: {err.strerror or err}") from None
    data = _decompress(raw, suf, source)
    return parse_blob(data, _inner(path.name, suf), source)


def _inner(name: str, suf: str) -> str:
    """File name once decompressed: 'a.json.gz' → 'a.json', 'a.xz' → 'a'."""
    for c in _COMPRESSED:
        if suf.endswith(c):
            return name[: len(name) - len(c)]
    return name


def _decompress(raw: bytes, suf: str, source: str) -> bytes:
    try:
        if suf.endswith(".gz"):
            return gzip.decompress(raw)
        if suf.endswith(".xz"):
            return lzma.decompress(raw)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(source, f"cannot decompress: {err}") from None
    return raw


def _load_tar(path: Path, mode: str) -> list[Trace]:
    """Members are read in archive order (xz streams do not seek) and sorted by name after."""
    found: list[tuple[str, list[Trace]]] = []
    try:
        with tarfile.open(path, mode) as tf:
            for m in tf:
                base = m.name.rsplit("/", 1)[-1]
                suf = _suffix(base)
                if not m.isfile() or base.startswith("._") or suf not in _MEMBER_SUFFIXES:
                    continue
                src = f"{path}:{m.name}"
                fh = tf.extractfile(m)
                data = _decompress(fh.read() if fh else b"", suf, src)
                found.append((m.name, parse_blob(data, _inner(base, suf), src)))
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(str(path), f"cannot read archive: {err}") from None
    found.sort(key=lambda x: x[0])
    return [t for _, ts in found for t in ts]


def parse_blob(data: bytes, name: str, source: str) -> list[Trace]:
    """Sessions in one decompressed file; `name` (e.g. 'trace_0001.json') picks the format
    and default session id; a .json whose first line is a Mooncake record is Mooncake too."""
    stem = _stem(name)
    if name.lower().endswith(".jsonl"):
        return parse_mooncake(data, source, stem)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        first = data.split(b"\n", 1)[0]
        if looks_like_mooncake(first):
            return parse_mooncake(data, source, stem)
        doc = decode_json(data, source)  # raises with the line of the syntax error
    if isinstance(doc, dict) and "input_length" in doc and "requests" not in doc:
        return parse_mooncake(data, source, stem)
    return traces_from_json(doc, source, stem)
