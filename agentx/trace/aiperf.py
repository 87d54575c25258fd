"""AIPerf's multi-turn `mooncake_trace` rows (JSONL with `session_id`) -> sessions.

AIPerf (ai-dynamo/aiperf, src/aiperf/dataset/loader/mooncake_trace.py and models.py) extends
Mooncake's rows with `session_id` (rows sharing it are one conversation, in file order) and
`delay` (ms to wait before sending the turn); a row's input is `input_length` (+ `hash_ids`),
`text_input`, or `messages` (OpenAI messages, the whole conversation so far). Mapping
(docs/traces.md#aiperf-multi-turn-mooncake_trace):

- `input_length` / `text_input` rows are the turn's new input: AIPerf keeps the conversation's
  history, so the whole prompt is the previous prompt + the previous answer (`output_length`)
  + this input. Block ids: the first turn's `hash_ids` (512-token blocks, global like
  Mooncake's; fresh ids without them), then the previous prompt's full blocks and fresh ids
  for the rest, as the Weka fallback (docs/traces.md, "Fallbacks").
- `messages` rows are the whole prompt: tokens and block ids from their text
  (agentx/trace/textblocks.py, 4 characters a token).
- think time: `delay` / 1000 s, else the gap between `timestamp`s (ms; it then includes the
  previous request's own time, as for Mooncake), else 0. A session's first `timestamp` is its
  start for `--arrivals trace`.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import InputError
from .model import MAX_SECONDS, MAX_TOKENS, Trace, Turn
from .mooncake import json_rows
from .textblocks import estimate_tokens, messages_text, text_block_ids

AIPERF_BLOCK_SIZE = 512
TEXT_BLOCK_SIZE = 64
# ids for content no row names: above textblocks' 48-bit ids and any Mooncake-style id
FRESH_FROM = 1 << 50


def is_aiperf_row(rec: Mapping) -> bool:
    """A multi-turn AIPerf row: a session id and an input of one of its three kinds."""
    return isinstance(rec.get("session_id"), str) and any(
        k in rec for k in ("input_length", "text_input", "messages"))


def parse_aiperf(data: bytes, source: str, name: str) -> list[Trace]:
    sessions: dict[str, list[tuple[int, dict]]] = {}
    for lineno, rec in json_rows(data, source):
        if not isinstance(rec.get("session_id"), str):
            raise InputError(source, "a row must have a string session_id", line=lineno,
                             field="session_id")
        sessions.setdefault(rec["session_id"], []).append((lineno, rec))
    if not sessions:
        raise InputError(source, "no rows in AIPerf multi-turn JSONL")
    next_id = [FRESH_FROM]
    return [_session(f"{name}-{sid}", rows, source, next_id) for sid, rows in sessions.items()]


def _count(rec: dict, key: str, source: str, lineno: int) -> int | None:
    v = rec.get(key)
    if v is None:
        return None
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or not 0 <= v <= MAX_TOKENS:
        raise InputError(source, f"must be an integer in [0, {MAX_TOKENS}] (got {v!r})",
                         line=lineno, field=key)
    return v


def _ms(rec: dict, key: str, source: str, lineno: int) -> float | None:
    v = rec.get(key)
    if v is None:
        return None
    if type(v) not in (int, float) or not 0 <= v <= MAX_SECONDS * 1000:
        raise InputError(source, f"must be milliseconds in [0, {MAX_SECONDS * 1000:g}] "
                         f"(got {v!r})", line=lineno, field=key)
    return float(v)


def _fresh(next_id: list[int], n: int) -> list[int]:
    out = list(range(next_id[0], next_id[0] + n))
    next_id[0] += n
    return out


def _session(tid: str, rows: list[tuple[int, dict]], source: str,
             next_id: list[int]) -> Trace:
    steps: list[Turn] = []
    bs = TEXT_BLOCK_SIZE if all("messages" in r for _, r in rows) else AIPERF_BLOCK_SIZE
    t = 0.0
    t0 = prev_ts = None
    prev_in = prev_out = 0
    prev_ids: list[int] = []
    for lineno, rec in rows:
        out = _count(rec, "output_length", source, lineno)
        if out is None:
            raise InputError(source, "missing (the tokens to generate)", line=lineno,
                             field="output_length")
        ts, delay = _ms(rec, "timestamp", source, lineno), _ms(rec, "delay", source, lineno)
        if isinstance(rec.get("messages"), list):
            if bs != TEXT_BLOCK_SIZE:
                raise InputError(source, "a session mixes messages rows with input_length or "
                                 "text_input rows (AIPerf refuses it too)", line=lineno,
                                 field="messages")
            text = messages_text(rec["messages"])
            n_in = estimate_tokens(text)
            ids = text_block_ids(text, bs)
        else:
            new = _count(rec, "input_length", source, lineno)
            if new is None:
                if not isinstance(rec.get("text_input"), str):
                    raise InputError(source, "give input_length, text_input or messages",
                                     line=lineno, field="input_length")
                new = estimate_tokens(rec["text_input"])
            n_in = prev_in + prev_out + new if steps else new
            own = rec.get("hash_ids")
            if own is not None and (not isinstance(own, list)
                                    or not all(type(x) is int for x in own)):
                raise InputError(source, "must be a list of integers", line=lineno,
                                 field="hash_ids")
            total = -(-n_in // bs)
            if not steps:
                ids = list(own or _fresh(next_id, total))[:total]
                ids += _fresh(next_id, total - len(ids))
            else:
                keep = prev_ids[:min(len(prev_ids), prev_in // bs, total)]
                ids = keep + _fresh(next_id, total - len(keep))
        think = delay / 1000.0 if delay is not None else \
            (ts - prev_ts) / 1000.0 if ts is not None and prev_ts is not None else 0.0
        if not steps:
            think, t0 = 0.0, ts
        t = (ts - t0) / 1000.0 if ts is not None and t0 is not None else t + max(0.0, think)
        steps.append(Turn(in_tokens=n_in, out_tokens=max(1, out), hash_ids=ids, t=t,
                          think_time=max(0.0, think), api_time=None, kind="n"))
        prev_in, prev_out, prev_ids = n_in, out, ids
        prev_ts = ts if ts is not None else prev_ts
    return Trace(id=tid, steps=steps, block_size=bs, source=f"{source}:{rows[0][0]}",
                 hash_id_scope="global", start_s=t0 / 1000.0 if t0 is not None else None)
