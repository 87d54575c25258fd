"""Alibaba Bailian (Qwen) usage traces, which AIPerf reads as `bailian_trace` -> sessions.

alibaba-edu/qwen-bailian-usagetraces-anon (Apache-2.0; KVCache@ATC'25): one request a line,
`chat_id`, `parent_chat_id` (-1 for a root), `timestamp` (s), `input_length`, `output_length`,
`type`, `turn`, `hash_ids` (salted SipHash of 16-token blocks, global). Mapping
(docs/traces.md#bailian-traces): a session is a root request and every request reachable
from it through `parent_chat_id`, ordered by `turn` then time; a row is the whole prompt (its
`hash_ids` cover it), so the shared prefix is read off the ids as for Mooncake; think time is
the gap between timestamps (it includes the previous request's own time), api time unknown.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import InputError
from .model import MAX_SECONDS, MAX_TOKENS, Trace, Turn
from .mooncake import json_rows

BAILIAN_BLOCK_SIZE = 16


def is_bailian_row(rec: Mapping) -> bool:
    return "chat_id" in rec and "parent_chat_id" in rec and "input_length" in rec


def _int(rec: dict, key: str, source: str, lineno: int, lo: int = 0) -> int:
    v = rec.get(key)
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or not lo <= v <= MAX_TOKENS * 1024:
        raise InputError(source, f"must be an integer >= {lo} (got {v!r})" if v is not None
                         else "missing", line=lineno, field=key)
    return v


def parse_bailian(data: bytes, source: str, name: str) -> list[Trace]:
    rows: dict[int, tuple[int, dict]] = {}
    for lineno, rec in json_rows(data, source):
        cid = _int(rec, "chat_id", source, lineno)
        _int(rec, "parent_chat_id", source, lineno, lo=-1)
        for key in ("input_length", "output_length"):
            if _int(rec, key, source, lineno) > MAX_TOKENS:
                raise InputError(source, f"must be at most {MAX_TOKENS}", line=lineno,
                                 field=key)
        ts = rec.get("timestamp")
        if type(ts) not in (int, float) or not 0 <= ts <= MAX_SECONDS:
            raise InputError(source, f"must be seconds in [0, {MAX_SECONDS:g}] (got {ts!r})",
                             line=lineno, field="timestamp")
        ids = rec.get("hash_ids", [])
        if not isinstance(ids, list) or not all(type(x) is int for x in ids):
            raise InputError(source, "must be a list of integers", line=lineno,
                             field="hash_ids")
        if cid in rows:
            raise InputError(source, f"chat_id {cid} repeats line {rows[cid][0]}", line=lineno,
                             field="chat_id")
        rows[cid] = (lineno, rec)
    if not rows:
        raise InputError(source, "no requests in Bailian JSONL")
    sessions: dict[int, list[tuple[int, dict]]] = {}
    for cid, row in rows.items():
        sessions.setdefault(_root(cid, rows, source), []).append(row)
    return [_session(f"{name}-{root}", members, source) for root, members in sessions.items()]


def _root(cid: int, rows: dict[int, tuple[int, dict]], source: str) -> int:
    """The root of a request's chain; a parent missing from the file makes its child a root
    (a slice of a longer trace), a cycle is an error."""
    seen = set()
    while True:
        parent = rows[cid][1]["parent_chat_id"]
        if parent == -1 or parent not in rows:
            return cid
        if cid in seen:
            raise InputError(source, f"parent_chat_id chain of chat_id {cid} loops",
                             line=rows[cid][0], field="parent_chat_id")
        seen.add(cid)
        cid = parent


def _session(tid: str, members: list[tuple[int, dict]], source: str) -> Trace:
    members.sort(key=lambda x: (x[1].get("turn", 1), x[1]["timestamp"], x[0]))
    t0 = members[0][1]["timestamp"]
    steps, prev = [], t0
    for lineno, rec in members:
        n_in, ts = rec["input_length"], rec["timestamp"]
        # a row without ids shares nothing: ids of its own, above any SipHash-derived id
        ids = list(rec.get("hash_ids") or ()) or [
            (1 << 50) + lineno * 65536 + k for k in range(-(-n_in // BAILIAN_BLOCK_SIZE))]
        steps.append(Turn(in_tokens=n_in, out_tokens=max(1, rec["output_length"]),
                          hash_ids=ids, t=ts - t0,
                          think_time=max(0.0, ts - prev), api_time=None,
                          kind=str(rec.get("type") or "n")))
        prev = ts
    return Trace(id=tid, steps=steps, block_size=BAILIAN_BLOCK_SIZE,
                 source=f"{source}:{members[0][0]}", hash_id_scope="global", start_s=t0)
