"""`load_traces(spec)`: one entry point from a name or path to a TraceSet.

`spec` is a built-in name (``swe``: the shipped synthetic agentic-coding trace) or a path:
a Weka JSON file, a directory of them (recursive, sorted by relative path), a ``.gz``/``.xz``
of one JSON, a ``.tar``/``.tar.gz``/``.tgz``/``.tar.xz``/``.txz`` archive of JSON files (members
sorted by name), or a Mooncake ``.jsonl`` (optionally ``.gz``/``.xz``; also recognised by content).
Built-in names win over a same-named relative path (write ``./swe`` for the path).

One load reads at most `max_trace_bytes()` of trace data, counted after decompression (768 MiB,
or $AGENTX_MAX_TRACE_BYTES): a few MB of gzip or xz can expand to many GB (a decompression
bomb), so every stream is read in chunks against that budget and refused, one line naming the
file, as soon as it would go past it; a tar member's size is checked before it is read.
"""
from __future__ import annotations

import gc
import gzip
import io
import lzma
import os
import re
import tarfile
import zlib
from pathlib import Path

import orjson

from ..errors import InputError
from ..shipped_data import data_dir
from .model import Trace, TraceSet
from .readers import Mooncake, Reader, for_document, for_record
from .weka import decode_json

BUILTIN_TRACES = {"swe": "swe.tar.xz"}
TRACES_DIR_ENV = "AGENTX_TRACES_DIR"
# The 533 real Claude Code sessions of tests/data/traces are 332 MiB of JSON (the largest
# 4.2 MB; 0.8 GB of memory once loaded): 768 MiB is 2.3x that, and a bomb stops there.
MAX_TRACE_BYTES = 768 << 20
MAX_TRACE_BYTES_ENV = "AGENTX_MAX_TRACE_BYTES"
_CHUNK = 1 << 20
_TAR_SUFFIXES = {".tar": "", ".tar.gz": ".gz", ".tgz": ".gz", ".tar.xz": ".xz", ".txz": ".xz"}
_DATA_SUFFIXES = (".json", ".jsonl")
_COMPRESSED = (".gz", ".xz")
_MEMBER_SUFFIXES = {d + c for d in _DATA_SUFFIXES for c in ("", *_COMPRESSED)}


def traces_dir() -> Path:
    """Where built-in traces live: $AGENTX_TRACES_DIR, the wheel's agentx/_traces, or the
    checkout's traces/ (agentx.shipped_data)."""
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


def max_trace_bytes() -> int:
    """$AGENTX_MAX_TRACE_BYTES (bytes, or with a K/M/G/T suffix: 4G), else MAX_TRACE_BYTES."""
    text = os.environ.get(MAX_TRACE_BYTES_ENV, "").strip()
    if not text:
        return MAX_TRACE_BYTES
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", text, re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise InputError(MAX_TRACE_BYTES_ENV, f"expected a positive size such as 4G or "
                         f"4294967296, got {text!r}")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


class _Budget:
    """The bytes one load may still read (after decompression)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, n: int, source: str) -> None:
        self.used += n
        if self.used > self.limit:
            limit = f"{self.limit / 2**20:g} MiB" if self.limit >= 2**20 else f"{self.limit:,} bytes"
            raise InputError(source, f"trace data exceeds {limit} once decompressed (a "
                             f"decompression bomb? set {MAX_TRACE_BYTES_ENV} to allow more)")


def _read_all(f, budget: _Budget, source: str) -> bytes:
    """Everything `f` (a plain or decompressing file) holds, in chunks against the budget."""
    chunks = []
    while chunk := f.read(_CHUNK):
        budget.take(len(chunk), source)
        chunks.append(chunk)
    return b"".join(chunks)


def _open(path: Path, comp: str):
    """`path` opened for reading through its decompressor ('.gz', '.xz' or '' for none)."""
    if comp == ".gz":
        return gzip.open(path, "rb")
    if comp == ".xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


class _Capped(io.RawIOBase):
    """A (decompressing) archive stream for tarfile that refuses, before doing the work, any
    read or forward seek past the budget: member data, skipped members, pax headers alike."""

    def __init__(self, f, budget: _Budget, source: str) -> None:
        self.f, self.budget, self.source, self.top = f, budget, source, 0

    def _charge(self, end: int) -> None:
        if end > self.top:
            self.budget.take(end - self.top, self.source)
            self.top = end

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return _read_all(self.f, self.budget, self.source)
        self._charge(self.f.tell() + n)
        return self.f.read(n)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._charge(pos)
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()


def load_path(path: Path) -> TraceSet:
    budget = _Budget(max_trace_bytes())
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of acyclic objects: collection passes only cost time here
    try:
        traces = _load_dir(path, budget) if path.is_dir() else _load_file(path, budget)
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


def _load_dir(root: Path, budget: _Budget) -> list[Trace]:
    files = sorted((p for p in root.rglob("*")
                    if p.is_file() and _suffix(p.name) in _MEMBER_SUFFIXES),
                   key=lambda p: p.relative_to(root).as_posix())
    out: list[Trace] = []
    for p in files:
        out.extend(_load_file(p, budget))
    return out


def _load_file(path: Path, budget: _Budget) -> list[Trace]:
    source, suf = str(path), _suffix(path.name)
    if suf in _TAR_SUFFIXES:
        return _load_tar(path, _TAR_SUFFIXES[suf], budget)
    comp = next((c for c in _COMPRESSED if suf.endswith(c)), "")
    try:
        with _open(path, comp) as f:
            data = _read_all(f, budget, source)
    except (EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(source, f"cannot decompress: {err}") from None
    except OSError as err:
        why = err.strerror or err
        raise InputError(source, f"cannot {'read' if err.strerror else 'decompress'}: {why}") from None
    return parse_blob(data, _inner(path.name, suf), source)


def _inner(name: str, suf: str) -> str:
    """File name once decompressed: 'a.json.gz' → 'a.json', 'a.xz' → 'a'."""
    for c in _COMPRESSED:
        if suf.endswith(c):
            return name[: len(name) - len(c)]
    return name


def _decompress(raw: bytes, suf: str, source: str, budget: _Budget) -> bytes:
    comp = next((c for c in _COMPRESSED if suf.endswith(c)), "")
    if not comp:
        return raw
    opener = gzip.GzipFile if comp == ".gz" else lzma.LZMAFile
    try:
        with opener(fileobj=io.BytesIO(raw)) as f:
            return _read_all(f, budget, source)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(source, f"cannot decompress: {err}") from None


def _load_tar(path: Path, comp: str, budget: _Budget) -> list[Trace]:
    """Members are read in archive order (xz streams do not seek) and sorted by name after."""
    found: list[tuple[str, list[Trace]]] = []
    try:
        with _open(path, comp) as f, tarfile.open(fileobj=_Capped(f, budget, str(path)),
                                                 mode="r:") as tf:
            for m in tf:
                base = m.name.rsplit("/", 1)[-1]
                suf = _suffix(base)
                if not m.isfile() or base.startswith("._") or suf not in _MEMBER_SUFFIXES:
                    continue
                src = f"{path}:{m.name}"
                fh = tf.extractfile(m)
                data = _decompress(fh.read() if fh else b"", suf, src, budget)
                found.append((m.name, parse_blob(data, _inner(base, suf), src)))
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(str(path), f"cannot read archive: {err}") from None
    found.sort(key=lambda x: x[0])
    return [t for _, ts in found for t in ts]


def parse_blob(data: bytes, name: str, source: str) -> list[Trace]:
    """Sessions in one decompressed file, by the reader (agentx/trace/readers.py) whose format
    it is: a .jsonl, or a .json whose first line is a record of a JSONL format, by its first
    record (Mooncake when none claims it: its parser names what is wrong); any other JSON
    document by its shape (Weka when no other claims it). `name` (e.g. 'trace_0001.json')
    gives the default session id."""
    stem = _stem(name)
    if name.lower().endswith(".jsonl"):
        return _read(for_record(first_record(data)) or Mooncake, data, None, source, stem)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        reader = for_record(first_record(data))
        if reader:
            return _read(reader, data, None, source, stem)
        doc = decode_json(data, source)  # raises with the line of the syntax error
    if isinstance(doc, dict) and (reader := for_record(doc)):  # a one-line JSONL file
        return _read(reader, data, None, source, stem)
    return _read(for_document(doc), data, doc, source, stem)


def first_record(data: bytes) -> object:
    """The first non-blank line as JSON (None when it is not JSON)."""
    for line in data.split(b"\n", 64):
        if line.strip():
            try:
                return orjson.loads(line)
            except orjson.JSONDecodeError:
                return None
    return None


def _read(reader: type[Reader], data: bytes, doc: object, source: str,
          stem: str) -> list[Trace]:
    traces = reader.parse(data, doc, source, stem)
    for t in traces:
        t.reader = reader.kind
    return traces
