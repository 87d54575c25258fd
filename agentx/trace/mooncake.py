"""Mooncake (FAST'25) JSONL request traces → sessions of the trace model.

Each line is one request: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (one id per 512-token block, the last block may be partial; ids are global, so
equal ids in different requests mean shared content). There are no session ids, so sessions
are rebuilt from prefix reuse — the chaining rule (docs/traces.md):

Requests are taken in timestamp order. Request R continues the session of an earlier request E
when E's prompt is a prefix of R's, i.e. either
  (a) E's hash_ids are a strict prefix of R's, or
  (b) E's last block is partial (input_length not a multiple of 512) and E's ids without that
      last block (at least one full block) are a prefix of R's, with R at least as many blocks
      long — the partial block was completed by the answer and the next message;
and R's input_length is larger than E's. The deepest such prefix wins (most specific match);
among requests sharing that same prefix the latest one wins. Otherwise R starts a new session.

Known limit: a request made only of a common system prompt plus a short partial block can
capture later sessions that share that system prompt (rule b cannot tell them apart).
"""
from __future__ import annotations

from collections.abc import Iterator

import orjson

from ..errors import InputError
from .model import MAX_SECONDS, MAX_TOKENS, Trace, Turn

MOONCAKE_BLOCK_SIZE = 512


def json_rows(data: bytes, source: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line of a JSONL file (every JSONL trace format);
    a line that is not a JSON object is an InputError naming it."""
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise InputError(source, f"invalid JSON: {err.msg} (column {err.colno})",
                             line=lineno) from None
        if not isinstance(obj, dict):
            raise InputError(source, "a request must be a JSON object", line=lineno)
        yield lineno, obj


def parse_mooncake(data: bytes, source: str, name: str) -> list[Trace]:
    recs = _records(data, source)
    ids_max = max((max(r[4]) for r in recs if r[4]), default=-1)
    next_id = ids_max + 1
    for r in recs:  # requests without hash_ids get fresh ids: they never share content
        if r[4] is None:
            n = -(-r[2] // MOONCAKE_BLOCK_SIZE)
            r[4] = list(range(next_id, next_id + n))
            next_id += n
    recs.sort(key=lambda r: (r[0], r[1]))
    session_of = _chain(recs)
    sessions: dict[int, list[int]] = {}
    for i, s in enumerate(session_of):
        sessions.setdefault(s, []).append(i)
    width = max(5, len(str(len(sessions))))
    traces = []
    for k, members in enumerate(sessions.values()):
        t0 = recs[members[0]][0]
        steps, prev_ts = [], t0
        for i in members:
            ts, _, n_in, n_out, ids = recs[i]
            steps.append(Turn(in_tokens=n_in, out_tokens=max(1, n_out), hash_ids=ids,
                              t=(ts - t0) / 1000.0, think_time=(ts - prev_ts) / 1000.0,
                              api_time=None, kind="n"))
            prev_ts = ts
        traces.append(Trace(id=f"{name}-{k:0{width}d}", steps=steps,
                            block_size=MOONCAKE_BLOCK_SIZE,
                            source=f"{source}:{recs[members[0]][1]}", hash_id_scope="global",
                            start_s=t0 / 1000.0))
    return traces


def _records(data: bytes, source: str) -> list[list]:
    """[timestamp_ms, line, input_length, output_length, hash_ids | None] per non-blank line."""
    recs = []
    for lineno, obj in json_rows(data, source):
        ts = obj.get("timestamp")
        if type(ts) not in (int, float) or not 0 <= ts <= MAX_SECONDS * 1000:  # ms
            raise InputError(source, f"must be a number in [0, {MAX_SECONDS * 1000:g}] ms "
                             f"(got {ts!r})" if ts is not None else "missing", line=lineno,
                             field="timestamp")
        n_in = _count(obj, "input_length", source, lineno)
        n_out = _count(obj, "output_length", source, lineno)
        ids = obj.get("hash_ids")
        if ids is not None and (not isinstance(ids, list)
                                or not all(type(x) is int for x in ids)):
            raise InputError(source, "must be a list of integers", line=lineno,
                             field="hash_ids")
        recs.append([ts, lineno, n_in, n_out, ids])
    if not recs:
        raise InputError(source, "no requests in Mooncake JSONL")
    return recs


def _count(obj: dict, key: str, source: str, lineno: int) -> int:
    v = obj.get(key)
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or not 0 <= v <= MAX_TOKENS:
        raise InputError(source, f"must be an integer in [0, {MAX_TOKENS}] (got {v!r})"
                         if v is not None else "missing", line=lineno, field=key)
    return v


def _chain(recs: list[list]) -> list[int]:
    """Session index of every request (records in time order), by the rule in the docstring.

    Every request leaves a mark under the rolling hash of its full id list (rule a) and, if its
    last block is partial, of its list minus that block (rule b); a later request looks its own
    prefixes up, deepest first, and verifies a hit by comparing the lists (no hash trust)."""
    bs = MOONCAKE_BLOCK_SIZE
    marks: dict[int, int] = {}
    session_of: list[int] = []
    n_sessions = 0
    for idx, (_, _, n_in, _, ids) in enumerate(recs):
        keys, h = [], 0
        for x in ids:
            h = hash((h, x))
            keys.append(h)
        owner = None
        for depth in range(len(ids) - 1, 0, -1):
            e = marks.get(keys[depth - 1])
            if e is None:
                continue
            e_in, e_ids = recs[e][2], recs[e][4]
            if n_in <= e_in:
                continue
            exact = len(e_ids) == depth and e_ids == ids[:depth]  # rule (a)
            partial = len(e_ids) == depth + 1 and e_ids[:depth] == ids[:depth]  # rule (b)
            if exact or partial:
                owner = e
                break
        if owner is None:
            session_of.append(n_sessions)
            n_sessions += 1
        else:
            session_of.append(session_of[owner])
        if ids:
            marks[keys[-1]] = idx
            if len(ids) >= 2 and n_in % bs and len(ids) == -(-n_in // bs):
                marks[keys[-2]] = idx
    return session_of
