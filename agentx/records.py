"""Per-request records: what was sent, what came back, and when (the raw truth of a run).

One `RequestRecord` per request that was started, written to requests.jsonl as soon as it
finishes (flushed per line, so a crashing server or client never loses finished records).
Times: wall-clock ns for correlation with server logs, monotonic ns (perf_counter) for all
durations; chunk arrival offsets are ns after the request start, taken when the bytes arrived,
before parsing. The client records raw facts (`client.facts.StreamFacts`) and fills a record from
them (`client.assemble`). This module is data and the rules of valid data only: it imports
only base modules (errors, rundir; docs/architecture.md).
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import IO

import orjson

from .errors import OutputError
from .rundir import read_jsonl

# How far a server's usage may be from the request before it is impossible (class bad_usage,
# docs/reliability.md). Completion tokens: vLLM stops at max_tokens exactly (its scheduler
# appends a speculative step's accepted tokens one by one and stops at the limit), so any
# excess is a lie; 16 tolerates a server that does not trim the last speculative step (K
# drafts + 1 bonus token, K <= 15). Prompt tokens: the intended count is the client's token
# model (exact with --tokenizer, else calibrated or assumed), and the chat template adds a
# few hundred; more than twice it plus 1000 is another prompt.
OSL_ALLOWANCE = 16
ISL_FACTOR, ISL_SLACK = 2, 1000
MAX_COUNT = 1 << 31  # a token count is below this (no model has a 2^31-token context)


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    session_id: str
    lane: int
    turn: int
    warmup: bool
    trace_id: str = ""
    subagent: str = ""
    kind: str = "turn"  # turn | prime (the lane's warm-up turn before its start turn)
    intended_send_ns: int = 0  # monotonic: when the engine wanted to send (end of think time)
    start_wall_ns: int = 0
    start_ns: int = 0  # monotonic, right before the request was handed to the socket
    first_token_ns: int = 0  # first event with non-empty choices (vLLM's first-token instant)
    first_content_ns: int = 0  # first non-reasoning content
    end_ns: int = 0
    ttft_ms: float | None = None
    ttfc_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    dispatch_lag_ms: float | None = None
    chunk_offsets_ns: list[int] = field(default_factory=list)  # arrival - start_ns
    chunk_tokens: list[int] = field(default_factory=list)
    isl_intended: int = 0
    osl_intended: int = 0
    cached_expected: int = 0  # the trace's in-session prefix hit for this request (tokens)
    cached_expected_pool: int = 0  # the same through the server's KV pool (+ offload tier)
    cached_expected_offload: int = 0  # the part of cached_expected_pool from the offload tier
    isl: int | None = None  # server usage.prompt_tokens
    osl: int | None = None  # server usage.completion_tokens (else counted tokens)
    osl_counted: int = 0  # tokens counted from chunks (usage deltas, else 1 per chunk)
    reasoning_tokens: int = 0
    cached_tokens: int | None = None
    server_ttft_ms: float | None = None  # per-request metrics, when the server sends them
    server_queue_ms: float | None = None
    spec_accepted: int | None = None  # per-request spec decode counts, when the server sends
    spec_steps: int | None = None  # them (accepted draft tokens, verify steps with drafts)
    status: int = 0
    ok: bool = False
    error: str | None = None  # error class: http_429, http_5xx, connect, reset, timeout, ...
    error_detail: str | None = None
    finish_reason: str | None = None
    retry_after_s: float | None = None  # a 429/503's Retry-After, as the lane honoured it (s)

    def to_json(self) -> bytes:
        # orjson serialises dataclasses natively: same bytes as asdict(), ~30x cheaper
        return orjson.dumps(self)


def is_count(v: object) -> bool:
    """A token count as a server may send it: a non-negative int below MAX_COUNT (a bool,
    float, string or null is not one)."""
    return type(v) is int and 0 <= v < MAX_COUNT


def usage_problem(isl: object, osl: object, cached: object, counted: object,
                  isl_intended: int, osl_intended: int) -> str | None:
    """Why a request's token counts are impossible, or None: each must be a token count
    (sse.is_count); completion tokens (the server's or those counted from the chunks) at
    most the request's max_tokens + OSL_ALLOWANCE, prompt tokens at most ISL_FACTOR x the
    intended + ISL_SLACK (checked when the intended counts are known), cached tokens at most
    the prompt."""
    for name, v in (("prompt_tokens", isl), ("completion_tokens", osl),
                    ("cached_tokens", cached), ("counted tokens", counted)):
        if v is not None and not is_count(v):
            return f"usage: {name} {repr(v)[:40]} is not a token count"
    if osl_intended:
        top = osl_intended + OSL_ALLOWANCE
        for name, v in (("completion_tokens", osl), ("counted tokens", counted)):
            if v is not None and v > top:
                return (f"usage: {name} {v} > max_tokens {osl_intended} + {OSL_ALLOWANCE} "
                        "(the server generated more than it was asked, or lies)")
    if isl is not None and isl_intended and isl > ISL_FACTOR * isl_intended + ISL_SLACK:
        return (f"usage: prompt_tokens {isl} > {ISL_FACTOR} x the intended {isl_intended} + "
                f"{ISL_SLACK} (not the prompt that was sent)")
    if cached is not None and isl is not None and cached > isl:
        return f"usage: cached_tokens {cached} > prompt_tokens {isl}"
    return None


def record_problem(r: dict) -> str | None:
    """usage_problem of a record read from a file (written by any version, or by hand), for
    the summaries: an `ok` record with impossible numbers counts as a `bad_usage` failure."""
    isl_i, osl_i = r.get("isl_intended"), r.get("osl_intended")
    return usage_problem(r.get("isl"), r.get("osl"), r.get("cached_tokens"),
                         r.get("osl_counted"), isl_i if is_count(isl_i) else 0,
                         osl_i if is_count(osl_i) else 0)


def _number(v: object) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


# what each field's declared type admits in a record read back from a file (JSON: an int may
# stand for a float, never a bool for an int)
_ADMITS = {
    "str": lambda v: type(v) is str,
    "str | None": lambda v: v is None or type(v) is str,
    "int": lambda v: type(v) is int,
    "int | None": lambda v: v is None or type(v) is int,
    "bool": lambda v: type(v) is bool,
    "float | None": lambda v: v is None or _number(v),
    "list[int]": lambda v: type(v) is list and all(type(x) is int for x in v),
}
# token counts are record_problem's: one that is no count makes the record a bad_usage
# failure, counted as such, not an invalid record
_COUNTS = ("isl", "osl", "cached_tokens", "osl_counted")
_FIELDS = [(f.name, _ADMITS[str(f.type)], f.default is MISSING and f.default_factory is MISSING)
           for f in fields(RequestRecord) if f.name not in _COUNTS]
# durations that cannot be negative (dispatch lag can: a request sent before it was due)
_DURATIONS = ("ttft_ms", "ttfc_ms", "e2e_ms", "tpot_ms")
_TIMES = ("start_ns", "end_ns", "first_token_ns", "first_content_ns", "intended_send_ns")


def record_invalid(r: dict) -> str | None:
    """Why a record read from a file (hand-edited, or cut by a crash) is no record the run
    could have written: a missing required field, a field of the wrong type, a negative time
    or duration, an end before the start, chunk lists of different lengths. None when it is
    one. Fields added by later versions may be missing (they take the dataclass defaults:
    `valid_records`). Token counts are `record_problem`'s (a bad_usage failure)."""
    for name, admits, required in _FIELDS:
        if name not in r:
            if required or name in ("start_ns", "end_ns", "ok"):
                return f"field {name!r} missing"
            continue
        if not admits(r[name]):
            return f"field {name!r} is {repr(r[name])[:40]}"
    for name in _TIMES:
        if r.get(name, 0) < 0:
            return f"field {name!r} is negative"
    for name in _DURATIONS:
        if (r.get(name) or 0) < 0:
            return f"field {name!r} is negative"
    if r["end_ns"] < r["start_ns"]:
        return "field 'end_ns' is before start_ns"
    if len(r.get("chunk_offsets_ns") or ()) != len(r.get("chunk_tokens") or ()):
        return "fields 'chunk_offsets_ns' and 'chunk_tokens' differ in length"
    return None


def valid_records(rows: list[dict]) -> tuple[list[dict], int, str]:
    """The records of `rows` that `record_invalid` passes, with the defaults of fields an
    older version did not write; how many were skipped, and why the first was."""
    good: list[dict] = []
    first = ""
    for i, r in enumerate(rows, 1):
        why = record_invalid(r)
        if why is None:
            good.append({**_DEFAULTS, **r} if len(r) < len(_DEFAULTS) else r)
        elif not first:
            first = f"record {i}: {why}"
    return good, len(rows) - len(good), first


_DEFAULTS = {f.name: (f.default if f.default is not MISSING else f.default_factory())
             for f in fields(RequestRecord)
             if f.default is not MISSING or f.default_factory is not MISSING}


class RecordWriter:
    """Writes this run's records to requests.jsonl, one complete line per record, one write(2)
    each with no buffer in between, so a SIGKILL leaves whole lines (at most the line being
    written is missing; `agentx report` drops a cut-off last line should the kernel have
    stopped a long write short). A file left by an earlier run in the same output directory
    is replaced, not appended to. A write that fails (disk full) is cut back off the file,
    which keeps every record before it whole, and raises OutputError; so does every later
    write (the lane that meets it ends the run)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        try:
            self._f: IO[bytes] = open(path, "wb", buffering=0)
        except OSError as e:
            raise OutputError(os.fspath(path), e) from None
        self.count = 0
        self._size = 0  # bytes of whole lines written
        self.failed: OutputError | None = None

    def write(self, rec: RequestRecord) -> None:
        if self.failed is None:
            line = rec.to_json() + b"\n"
            try:
                write_line(self._f, line)
                self._size += len(line)
                self.count += 1
                return
            except OSError as e:
                with contextlib.suppress(OSError):  # no half line left behind
                    self._f.truncate(self._size)
                self.failed = OutputError(os.fspath(self.path), e, kept=f"the {self.count} "
                                          "records written before are kept, whole")
        raise OutputError(self.failed.path, self.failed.reason, self.failed.kept)

    def close(self) -> None:
        if not self._f.closed:
            with contextlib.suppress(OSError):  # nothing buffered: a failure was reported
                self._f.close()


def write_line(f: IO[bytes], line: bytes) -> None:
    """Write a whole line to an unbuffered file: one write(2) unless the kernel stops short."""
    view = memoryview(line)
    while view:
        view = view[f.write(view):]


def read_records(path: str | os.PathLike) -> list[dict]:
    """The records of a finished record file, strictly: a line that is not a JSON object
    raises InputError naming it (`rundir.read_jsonl` reads a killed run's leniently)."""
    return read_jsonl(path, strict=True)[0]
