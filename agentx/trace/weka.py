"""Native "Weka"/kv-cache-tester session JSON → trace model, with validation and fallbacks.

One document = one session: ``{"id", "block_size", "system_tokens", "tool_tokens",
"hash_id_scope", "requests": [...]}``; each request is a turn (``in``, ``out``, ``hash_ids``,
``t``, ``think_time``, ``api_time``, ``input_types``, ``type``) or a ``type: subagent`` entry
holding its own ``requests``. Optional fields are filled here by the rules in docs/traces.md so
nothing downstream guesses; anything malformed raises InputError naming the file, the record
path (``requests[12]``, ``requests[3].requests[0]``) and the field.

Memory: a real 533-session archive holds ~70 M block ids. Each turn's ids are rebuilt as
"previous turn's list prefix + new tail", so consecutive turns share int objects and only the
tail needs type checks; this keeps the in-memory set near 8 bytes per id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import InputError
from .model import MAX_SECONDS, MAX_TOKENS, Step, Subagent, Trace, Turn

DEFAULT_BLOCK_SIZE = 64


def decode_json(data: bytes, source: str) -> Any:
    """orjson.loads with syntax errors turned into InputError(file, line)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise InputError(source, f"invalid JSON: {err.msg} (column {err.colno})",
                         line=err.lineno) from None


def traces_from_json(doc: Any, source: str, default_id: str) -> list[Trace]:
    """All sessions in one JSON document: an object (one session) or a list of them."""
    if isinstance(doc, list):
        return [trace_from_doc(d, source, f"{default_id}_{i}", f"[{i}]")
                for i, d in enumerate(doc)]
    return [trace_from_doc(doc, source, default_id)]


@dataclass
class _Ctx:
    """Per-session parse state: where we are (for errors) and the next free block id."""

    source: str
    trace_id: str
    block_size: int
    scope: str
    next_id: int = 1  # one above the largest id seen in this session (parent and subagents)


def trace_from_doc(doc: Any, source: str, default_id: str, path: str = "") -> Trace:
    """One session object → Trace. `path` prefixes record paths (for list documents)."""
    where = path or None
    if not isinstance(doc, dict):
        raise InputError(source, "a session must be a JSON object", line=where)
    bs = _int(doc, "block_size", source, where, default=DEFAULT_BLOCK_SIZE, minimum=1)
    scope = doc.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        raise InputError(source, f"must be 'local' or 'global' (got {scope!r})", line=where,
                         field="hash_id_scope")
    tid = doc.get("id")
    tid = default_id if tid is None else str(tid)
    ctx = _Ctx(source, tid, bs, scope)
    steps = _parse_requests(doc, ctx, path)
    return Trace(id=tid, steps=steps, block_size=bs,
                 system_tokens=_int(doc, "system_tokens", source, where, default=0),
                 tool_tokens=_int(doc, "tool_tokens", source, where, default=0),
                 source=source, hash_id_scope=scope)


def _parse_requests(holder: dict, ctx: _Ctx, path: str) -> list[Step]:
    where = path or None
    reqs = holder.get("requests")
    if reqs is None:
        raise InputError(ctx.source, "missing", line=where, field="requests")
    if not isinstance(reqs, list):
        raise InputError(ctx.source, "must be a list", line=where, field="requests")
    if not reqs:
        raise InputError(ctx.source, "must hold at least one request", line=where,
                         field="requests")
    steps: list[Step] = []
    prev: Turn | None = None
    n_sub = 0
    for i, r in enumerate(reqs):
        rp = f"{path}.requests[{i}]" if path else f"requests[{i}]"
        if not isinstance(r, dict):
            raise InputError(ctx.source, "a request must be a JSON object", line=rp)
        kind = r.get("type", "n")
        if not isinstance(kind, str):
            raise InputError(ctx.source, "must be a string", line=rp, field="type")
        if kind == "subagent":
            n_sub += 1
            steps.append(_parse_subagent(r, ctx, rp, n_sub, steps))
            continue
        prev = _parse_turn(r, ctx, rp, kind, prev)
        steps.append(prev)
    return steps


def _parse_subagent(r: dict, ctx: _Ctx, rp: str, n: int, steps: list[Step]) -> Subagent:
    agent_id = r.get("agent_id")
    agent_id = f"agent_{n:03d}" if agent_id is None else str(agent_id)
    last_t = steps[-1].t if steps else 0.0
    t = _num(r, "t", ctx.source, rp, default=last_t)
    sub = Trace(id=f"{ctx.trace_id}/{agent_id}", steps=_parse_requests(r, ctx, rp),
                block_size=ctx.block_size,
                system_tokens=_int(r, "system_tokens", ctx.source, rp, default=0),
                tool_tokens=_int(r, "tool_tokens", ctx.source, rp, default=0),
                source=ctx.source, hash_id_scope=ctx.scope)
    return Subagent(agent_id=agent_id, trace=sub, t=t)


def _parse_turn(r: dict, ctx: _Ctx, rp: str, kind: str, prev: Turn | None) -> Turn:
    src = ctx.source
    n_in = _int(r, "in", src, rp)
    n_out = max(1, _int(r, "out", src, rp))  # 0 → 1: a replayed request must generate a token
    api = _num(r, "api_time", src, rp, default=None)
    t = _num(r, "t", src, rp, default=None)
    think = _num(r, "think_time", src, rp, default=None)
    if think is None:
        think = 0.0
        if prev is not None and t is not None:
            think = max(0.0, t - prev.t - (prev.api_time or 0.0))
    if t is None:
        t = 0.0 if prev is None else prev.t + (prev.api_time or 0.0) + think
    types = _input_types(r.get("input_types", []), src, rp)
    ids = _hash_ids(r, ctx, rp, n_in, prev)
    return Turn(in_tokens=n_in, out_tokens=n_out, hash_ids=ids, t=t, think_time=think,
                api_time=api, input_types=types, kind=kind)


_TYPES_OK: dict[tuple, tuple[str, ...]] = {}  # the few distinct input_types lists, validated


def _input_types(raw: Any, source: str, rp: str) -> tuple[str, ...]:
    try:
        key = tuple(raw) if isinstance(raw, list) else None
        ok = _TYPES_OK.get(key) if key is not None else None
    except TypeError:  # unhashable item (a nested list or object)
        key = ok = None
    if ok is not None:
        return ok
    if key is None or not all(isinstance(x, str) for x in key):
        raise InputError(source, "must be a list of strings", line=rp, field="input_types")
    if len(_TYPES_OK) < 4096:
        _TYPES_OK[key] = key
    return key


def _hash_ids(r: dict, ctx: _Ctx, rp: str, n_in: int, prev: Turn | None) -> list[int]:
    raw = r.get("hash_ids")
    prev_ids: list[int] = prev.hash_ids if prev is not None else []
    if raw is None:
        return synth_hash_ids(prev_ids, prev.in_tokens if prev else 0, n_in, ctx)
    if not isinstance(raw, list):
        raise InputError(ctx.source, f"must be a list of integers (got {type(raw).__name__})",
                         line=rp, field="hash_ids")
    k = common_prefix(prev_ids, raw)
    tail = raw[k:]
    for j, x in enumerate(tail):
        if type(x) is not int:
            raise InputError(ctx.source, f"must be a list of integers (item {k + j} is {x!r})",
                             line=rp, field="hash_ids")
    if tail:
        ctx.next_id = max(ctx.next_id, max(tail) + 1)
        if not k:
            return raw
        ids = prev_ids[:k]
        ids.extend(tail)
        return ids
    return prev_ids[:k]


def synth_hash_ids(prev_ids: list[int], prev_in: int, n_in: int, ctx: _Ctx) -> list[int]:
    """Fallback ids: keep the previous turn's full blocks that still fit, then fresh ids up to
    ceil(n_in / block_size) blocks (the old partial last block is new content now)."""
    bs = ctx.block_size
    keep = min(len(prev_ids), prev_in // bs, n_in // bs)
    n = -(-n_in // bs)
    start = ctx.next_id
    ctx.next_id = start + max(0, n - keep)
    ids = prev_ids[:keep]
    ids.extend(range(start, ctx.next_id))
    return ids


def common_prefix(a: list, b: list) -> int:
    """Length of the common prefix, by binary search over C-level slice comparisons (turns
    usually extend the previous one, so the first comparison settles it)."""
    n = min(len(a), len(b))
    if n == 0 or (b[:n] == a if n == len(a) else a[:n] == b):
        return n
    lo, hi = 0, n - 1  # lo: known equal length; hi: longest length still possible
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _int(d: dict, key: str, source: str, where: str | None, *, default: int | None = None,
         minimum: int = 0, maximum: int = MAX_TOKENS) -> int:
    v = d.get(key)
    if v is None:
        if default is None:
            raise InputError(source, "missing", line=where, field=key)
        return default
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int:
        raise InputError(source, f"must be an integer >= {minimum} (got {v!r})", line=where,
                         field=key)
    if not minimum <= v <= maximum:
        raise InputError(source, f"must be in [{minimum}, {maximum}] (got {d[key]!r})",
                         line=where, field=key)
    return v


def _num(d: dict, key: str, source: str, where: str | None, *, default: float | None
         ) -> float | None:
    v = d.get(key)
    if v is None:
        return default
    if type(v) not in (int, float) or not 0 <= v <= MAX_SECONDS:  # NaN fails too
        raise InputError(source, f"must be a number in [0, {MAX_SECONDS:g}] (got {v!r})",
                         line=where, field=key)
    return float(v)
