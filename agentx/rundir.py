"""A run's output directory: its file names, when it may be created or cleared, atomic writes,
the merge of per-worker record files, and reading its JSON-lines files strictly or leniently.

Rules: it never mixes two runs, is never left behind empty by a failed start, never loses a
user's file to --overwrite and never holds half a result file. A run claims its directory
with an exclusive lock (`.agentx-lock`, flock(2), held until the run ends and dropped by the
kernel when its process dies): creating, checking and clearing the directory happen under
it, so of two runs started together into one directory the second refuses, and `agentx
report` knows a live run from a killed one. Every file agentx writes into a
run directory is named in its manifest, `.agentx-files` (one name a line, written when the
directory is created, extended as worker files and plots are written); `--overwrite` removes
exactly the files the previous run's manifest names. A directory from before manifests existed
loses only the fixed names a run writes (LEGACY) and its worker files.

Every writer and reader of a run directory (run, report, sweep, A/B, calibrate, the simulator's
replay) takes the names from here, so the formats cannot drift apart. So does every other
command's output folder: `ResultDir` is the base (its files, its default name, the check before
any work, creation, the manifest, atomic writes) and RunDir, ReportDir, ABDir, SweepDir,
CompareDir, CliffDir and CalibrationDir each name their files once, here."""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar, TypeVar

import orjson

from .errors import InputError, OutputError

FLAG = "--output-dir"
_CANCELLED = b'"error":"cancelled"'  # as a record's JSON line says it (orjson, no spaces)
RESULTS = Path("results")  # where a command's default output directory goes
_JSON = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY


def default_dir(*parts: str, kind: str = "") -> Path:
    """results/[<kind>-]<YYYYmmdd-HHMMSS>[-<part>...]: a command's output directory when the
    user names none (`run`: results/<time>-<trace>-c<N>, `ab`: results/ab-<time>-..., ...)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return RESULTS / "-".join([*([kind] if kind else []), stamp, *parts])


R = TypeVar("R", bound="ResultDir")


def trace_label(trace: str) -> str:
    """A trace argument as a directory name part: the file's name up to its first dot."""
    return Path(trace).name.split(".")[0]


def _busy(path: Path, owner: str) -> InputError:
    """The refusal of a directory a live run holds (the early check and the claim alike)."""
    return InputError(str(path), f"another agentx run ({owner}) is writing to it (use another "
                      "--output-dir)", field=FLAG)


def _not_empty(path: Path) -> InputError:
    return InputError(str(path), "is not empty: a run's files would mix with another's (use "
                      "--overwrite, or another --output-dir)", field=FLAG)


class ResultDir:
    """An output folder of one agentx command (it may not exist yet). A subclass names its
    files as class attributes (readers need no instance), its default folder (`KIND`:
    results/<KIND>-<time>-...), and the file whose presence means the folder holds a result
    already (`RESULT`, refused without the command's flag). Files written through the folder
    (`write_json`) are atomic and named in its manifest, `.agentx-files`."""

    KIND: ClassVar[str] = ""
    RESULT: ClassVar[str] = ""
    REFUSAL: ClassVar[str] = "holds a result already ({}): give --overwrite or another --output-dir"
    MANIFEST = ".agentx-files"
    LOCK = ".agentx-lock"  # held (flock) by the live run that owns the directory

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @classmethod
    def default_path(cls, *parts: str) -> Path:
        """The folder when the user names none: results/[<KIND>-]<time>[-<part>...]."""
        return default_dir(*parts, kind=cls.KIND)

    @classmethod
    def at(cls: type[R], output_dir: str | os.PathLike | None, *parts) -> R:
        """--output-dir, or the default folder (`default_path(*parts)`): the one place every
        command makes that choice."""
        return cls(output_dir if output_dir else cls.default_path(*parts))

    def holds_result(self) -> bool:
        return bool(self.RESULT) and (self.path / self.RESULT).exists()

    def check(self, overwrite: bool) -> None:
        """Refuse, before any work, a folder that is a file or holds this command's result
        already (unless `overwrite`: --overwrite, or the sweep's --resume)."""
        if self.path.exists() and not self.path.is_dir():
            raise InputError(str(self.path), "exists and is not a directory", field=FLAG)
        if not overwrite and self.holds_result():
            raise InputError(str(self.path), self.REFUSAL.format(self.RESULT), field=FLAG)

    def create(self: R, overwrite: bool = False) -> R:
        """check, then make the folder (and its parents)."""
        self.check(overwrite)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(str(self.path), f"cannot be created ({e.strerror or e})",
                             field=FLAG) from None
        return self

    def write_json(self, name: str, doc: dict) -> Path:
        """`name` here, written atomically (write_json) and named in the manifest."""
        path = write_json(self.path / name, doc)
        self.register(name)
        return path

    def own_files(self) -> list[str]:
        """The files agentx wrote here, as the manifest names them (plain names only)."""
        try:
            text = (self.path / self.MANIFEST).read_text(errors="replace")
        except OSError:
            return []
        return [n for n in dict.fromkeys(text.splitlines())
                if n and n not in (".", "..", self.MANIFEST, self.LOCK) and "/" not in n
                and "\\" not in n]

    def register(self, *names: str) -> None:
        """Add file names to the manifest (files agentx writes here; --overwrite's list)."""
        have = self.own_files()
        new = [n for n in dict.fromkeys(names) if n not in have]
        if new:
            write_bytes(self.path / self.MANIFEST,
                        "".join(f"{n}\n" for n in [*have, *new]).encode())

    def read_json(self, name: str) -> tuple[dict | None, str]:
        """A JSON object file here (summary.json, run.json, ab.json), or None and why it cannot
        be used ("" when there is none): a run stopped by a full disk before summaries were
        written atomically left 0 bytes."""
        path = self.path / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, ""
        except OSError as e:
            raise InputError(str(path), f"cannot be read ({e.strerror or e})") from None
        if not data.strip():
            return None, "empty"
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            return None, f"not valid JSON ({e})"
        return (doc, "") if isinstance(doc, dict) else (None, "not a JSON object")


class RunDir(ResultDir):
    """One run directory (it may not exist yet): the paths of its files and what may be done
    with it. File names are class attributes, so readers need no instance."""

    RUN = "run.json"  # config, target, labels: written when the run starts
    REQUESTS = "requests.jsonl"  # one RequestRecord a line, streamed
    METRICS = "metrics.jsonl"  # the server's /metrics series, one scrape a line
    SUMMARY = "summary.json"  # written at the end (or rebuilt by `agentx report`)
    LATENCY_CDF, SERVER_TIMESERIES = "latency_cdf.png", "server_timeseries.png"  # report plots
    GPU_POWER = "gpu_power.png"  # report plot of the NVML samples (scrape/gpu.py)
    # per-session rows, per-turn bins and their plot (metrics/sessions.py, report/sessions.py)
    SESSIONS_CSV, TURNS_CSV, PER_TURN = "sessions.csv", "turns.csv", "per_turn.png"
    FILES = (RUN, REQUESTS, METRICS, SUMMARY)
    # what a run (and `agentx report` in it) wrote before manifests: exact names, never a
    # pattern that could match a user's file (a user's diagram.png stays)
    LEGACY = (*FILES, LATENCY_CDF, SERVER_TIMESERIES)
    WORKER = re.compile(r"requests\.w([0-9]+)\.jsonl")  # a worker's records before the merge

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        self._lock: int | None = None  # the claim's lock file descriptor
        self._made = False  # the claim created the directory

    @property
    def run_json(self) -> Path:
        return self.path / self.RUN

    @property
    def requests(self) -> Path:
        return self.path / self.REQUESTS

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def summary(self) -> Path:
        return self.path / self.SUMMARY

    def worker(self, n: int) -> Path:
        """Worker n's record file (merged into requests.jsonl when the run ends)."""
        return self.path / f"requests.w{n}.jsonl"

    def worker_files(self) -> list[Path]:
        """Worker record files still in the directory (a killed run's), by worker number."""
        if not self.path.is_dir():
            return []
        found = [(int(m.group(1)), f) for f in self.path.iterdir()
                 if (m := self.WORKER.fullmatch(f.name))]
        return [f for _, f in sorted(found)]

    def is_run(self) -> bool:
        """Holds a run's results (a summary, records, or unmerged worker records)."""
        return self.summary.exists() or self.requests.exists() or bool(self.worker_files())

    # -- creation and --overwrite ------------------------------------------------------------
    def check(self, overwrite: bool) -> None:
        """Refuse, before any traffic, a directory holding another run's results (unless
        overwrite) or one that cannot be created or written."""
        out = self.path
        if out.exists():
            if not out.is_dir():
                raise InputError(str(out), "exists and is not a directory", field=FLAG)
            if (owner := self.live_owner()) is not None:
                raise _busy(out, owner)
            if not overwrite and self.abandoned_files() is None:
                raise _not_empty(out)
            if not os.access(out, os.W_OK | os.X_OK):
                raise InputError(str(out), "is not writable", field=FLAG)
            return
        parent = out.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(str(out), f"cannot be created ({parent} is not a writable "
                             "directory)", field=FLAG)

    def claim(self, overwrite: bool) -> RunDir:
        """Create it (once start-up has succeeded) and take it for this run, atomically: the
        lock first, then, under it, the check that it holds no other run's files (or, with
        overwrite, the removal of the previous run's: its manifest's, nothing else), then
        this run's manifest. A second run claiming it meanwhile finds the lock taken and
        refuses; `release()` (the run's end, or its process dying) lets it go. What a run
        killed during its start-up left (its own files, not one record) is cleared."""
        try:
            self._made = not self.path.is_dir()
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / self.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise InputError(str(self.path), f"cannot be created ({e.strerror or e})",
                             field=FLAG) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise _busy(self.path, self._owner()) from None
        self._lock = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            if overwrite:
                doomed = self.previous_files()
            else:
                doomed = self.abandoned_files()
                if doomed is None:
                    raise _not_empty(self.path)
            for f in doomed:
                f.unlink()
            with contextlib.suppress(FileNotFoundError):
                (self.path / self.MANIFEST).unlink()
            self.register(*self.FILES)
        except BaseException as e:
            self.release(abandon=True)
            if isinstance(e, OSError):
                raise InputError(str(self.path), f"cannot be created or cleared "
                                 f"({e.strerror or e})", field=FLAG) from None
            raise
        return self

    def abandoned_files(self) -> list[Path] | None:
        """What a new run may clear without --overwrite: nothing in an empty directory; the
        files of a run killed during its start-up (only files its manifest names, and not
        one record: no summary, no non-empty record file); None for anything else."""
        names = {p.name for p in self.path.iterdir()} - {self.LOCK}
        if not names:
            return []
        own = {*self.own_files(), self.MANIFEST}
        own |= {f"{n}.tmp" for n in own}  # a write_bytes the kill cut short
        if not names <= own or self.has_records():
            return None
        return [self.path / n for n in names if n != self.MANIFEST]

    def release(self, abandon: bool = False) -> None:
        """Let the directory go (the run has ended). With abandon (a start-up that failed or
        was interrupted): when not one record was written, remove this run's files, and the
        directory when the claim made it and nothing else is left in it."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            if abandon and not self.has_records():
                for n in [*self.own_files(), self.MANIFEST]:
                    for name in (n, f"{n}.tmp"):
                        with contextlib.suppress(FileNotFoundError):
                            (self.path / name).unlink()
            (self.path / self.LOCK).unlink()
            if abandon and self._made:
                self.path.rmdir()  # only if empty: a user's file keeps it
        os.close(self._lock)
        self._lock = None

    def has_records(self) -> bool:
        """A summary, or a record of a request that was not cancelled: what a run killed
        during its start-up leaves (run.json, a manifest, the `cancelled` records of the
        requests its orphaned workers dropped) measured nothing and may be cleared."""
        if self.summary.exists():
            return True
        for f in [self.requests, *self.worker_files()]:
            with contextlib.suppress(FileNotFoundError), open(f, "rb") as lines:
                if any(ln.strip() and _CANCELLED not in ln for ln in lines):
                    return True
        return False

    def live_owner(self) -> str | None:
        """Who holds the directory's lock ("pid N"), when a live run does; None when no run
        is in progress here (no lock file, or one a killed run left unlocked)."""
        try:
            fd = os.open(self.path / self.LOCK, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return self._owner()
        finally:
            os.close(fd)
        return None

    def _owner(self) -> str:
        try:
            pid = (self.path / self.LOCK).read_text().strip()
        except OSError:
            pid = ""
        return f"pid {pid}" if pid.isdigit() else "pid unknown"

    def previous_files(self) -> list[Path]:
        """What --overwrite removes: the files a previous run's manifest names; without one
        (a run from before manifests), the fixed names a run writes and its worker files.
        Never anything else."""
        if (self.path / self.MANIFEST).exists():
            names = self.own_files()
        else:
            names = [*self.LEGACY, *(f.name for f in self.worker_files())]
        return [self.path / n for n in names if n != self.LOCK
                and ((self.path / n).is_file() or (self.path / n).is_symlink())]

    # -- the run's files ---------------------------------------------------------------------
    def write_run_json(self, meta: dict) -> Path:
        """run.json: the config, target, labels and run metadata, written when the run starts
        so that a run killed before its summary still says what it was."""
        return write_json(self.run_json, meta)

    def merge_workers(self, warm_until_ns: int | None = None) -> int:
        """Fold the unmerged worker files into requests.jsonl (see merge_record_files).
        Returns the number of worker files merged."""
        parts = self.worker_files()
        if parts:
            merge_record_files([self.requests, *parts], self.requests, warm_until_ns)
        return len(parts)


def common_parent(dirs: Iterable[str | os.PathLike]) -> Path:
    """The folder holding all of `dirs` (the parent of one)."""
    return Path(os.path.commonpath([str(Path(d).resolve().parent) for d in dirs]))


class ReportDir(ResultDir):
    """`agentx report` over several runs: runs.csv, the Pareto figure, report.html (one run's
    report.html goes in its run directory). Default: the runs' common parent folder."""

    RUNS_CSV, PARETO = "runs.csv", "pareto.png"
    HTML = "report.html"

    @classmethod
    def default_path(cls, *runs: str | os.PathLike) -> Path:
        return common_parent(runs)


class SweepDir(ReportDir):
    """`agentx sweep`: sweep.json (every cell, rewritten as cells finish), the report over
    its cells, and a run directory per cell (<point label>/c<conc>)."""

    KIND = "sweep"
    RESULT = JSON = "sweep.json"
    REFUSAL = "holds a sweep already ({}): give --resume to finish it, or another --output-dir"
    default_path = classmethod(ResultDir.default_path.__func__)  # type: ignore[assignment]

    def cell(self, label: str, conc: int) -> Path:
        return self.path / label / f"c{conc}"


class ABDir(ResultDir):
    """`agentx ab`: ab.json, its CDF figure, and a run directory per side and repeat."""

    KIND = "ab"
    RESULT = JSON = "ab.json"
    CDF = "ab_cdf.png"
    REFUSAL = "holds an A/B result already ({}): give --overwrite or another --output-dir"
    SIDES = ("a", "b")

    def side_run(self, side: str, repeat: int) -> Path:
        return self.path / side / str(repeat)


class CompareDir(ResultDir):
    """`agentx compare`: compare.json, compare.html and one CDF figure per pair."""

    KIND = "compare"
    JSON, HTML = "compare.json", "compare.html"

    def cdf(self, pair: int) -> Path:
        return self.path / f"compare_cdf_{pair}.png"


class CliffDir(ResultDir):
    """`agentx cliff`: cliff.json, cliff.png, and the --verify runs (c<lanes>)."""

    KIND = "cliff"
    JSON, PNG = "cliff.json", "cliff.png"


class CalibrationDir(ResultDir):
    """`agentx calibrate`: calibration.json (every cell, with its interval and run directory)
    and the runs and server logs per K (k<K>/...)."""

    KIND = "calibrate"
    JSON = "calibration.json"


# -- atomic writes ---------------------------------------------------------------------------
def write_json(path: str | os.PathLike, doc: dict) -> Path:
    """Write through a temporary file, synced, and a rename: a reader (or a later `agentx
    report`) sees the old file or the whole new one, never half of one, even when the disk
    fills (OutputError, the temporary file removed)."""
    return write_bytes(path, orjson.dumps(doc, option=_JSON))


def write_bytes(path: str | os.PathLike, data: bytes | Iterable[bytes]) -> Path:
    """`path` replaced whole by `data` (bytes, or chunks of them): written to `<name>.tmp`,
    flushed and fsynced, then renamed over `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                f.writelines(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # a full disk, or a signal mid-write: no *.tmp left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not isinstance(e, OSError):
            raise
        raise OutputError(str(path), e, kept="the previous file, if any, is unchanged") \
            from None
    return path


# -- reading ---------------------------------------------------------------------------------
def read_jsonl(path: str | os.PathLike, strict: bool = False) -> tuple[list[dict], int]:
    """Rows of a JSON-lines file and how many lines were unreadable. Lenient (the default,
    for a killed run's files: a process killed while writing can leave half a line): such
    lines are counted and skipped, a missing file has no rows. Strict (a file agentx has
    finished writing): a missing file or a line that is not a JSON object raises InputError
    naming the line."""
    rows: list[dict] = []
    bad = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        if strict:
            raise InputError(os.fspath(path), "does not exist") from None
        return rows, bad
    except OSError as e:  # e.g. its directory replaced by a file while the run went on
        raise InputError(os.fspath(path), f"cannot be read ({e.strerror or e})") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                if strict:
                    raise InputError(os.fspath(path), f"is not JSON ({e})", line=n) from None
                row = None
            if isinstance(row, dict):
                rows.append(row)
            elif strict:
                raise InputError(os.fspath(path), "is not a JSON object", line=n)
            else:
                bad += 1
    return rows, bad


# -- the worker merge ------------------------------------------------------------------------
def _start(r: dict, key: str = "start_ns") -> int:
    v = r.get(key)
    return v if type(v) is int else 0


def merge_record_files(parts: Sequence[str | os.PathLike], dest: str | os.PathLike,
                       warm_until_ns: int | None = None) -> tuple[int, int]:
    """Merge record files (worker files; `dest` may be one of them) into `dest`, ordered by
    request start, each request id once; remove the parts other than `dest`. Requests sent
    before `warm_until_ns` (the run's warm-up end, when it is the last of the workers' own)
    are flagged warm-up, as one process would have flagged them. Lines a killed writer left
    unreadable are skipped, so one dead worker cannot cost the others' records. Written
    atomically (write_bytes): a crash meanwhile leaves the parts as they were, and so does a
    full disk (OutputError). Returns (records written, unreadable lines skipped)."""
    rows: dict[str, dict] = {}
    bad = 0
    for part in parts:
        got, b = read_jsonl(part)
        bad += b
        for r in got:
            rows.setdefault(r.get("request_id") or f"{os.fspath(part)}:{len(rows)}", r)
    ordered = sorted(rows.values(), key=_start)  # a hand-edited start sorts first, not raises
    if warm_until_ns:
        for r in ordered:
            if not r.get("warmup") and _start(r, "intended_send_ns") < warm_until_ns:
                r["warmup"] = True
    try:
        write_bytes(dest, (orjson.dumps(r) + b"\n" for r in ordered))
    except OutputError as e:  # disk full: no half-written file, the parts as they were
        raise OutputError(e.path, e.reason, kept="the record files it merges are kept as they "
                          "were (agentx report DIR merges them once there is room)") from None
    for part in parts:
        if os.path.abspath(part) != os.path.abspath(dest):
            with contextlib.suppress(FileNotFoundError):
                os.remove(part)
    return len(ordered), bad
