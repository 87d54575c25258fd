"""OpenTelemetry GenAI span files, as kubernetes-sigs/inference-perf's otel_trace_replay reads
them -> sessions.

A file is a JSON object with a `spans` list (inference-perf examples/otel/test_traces/); a span
whose attributes hold `gen_ai.input.messages` is one LLM call. Mapping
(docs/traces.md#opentelemetry-genai-spans):

- session: spans sharing a session attribute (`session.id`, `gen_ai.conversation.id`,
  `exgentic.session.id`), else the file's `trace_id`; turns by start time.
- prompt tokens: `gen_ai.usage.input_tokens` (or `prompt_tokens`), else the messages' text at
  4 characters a token (inference-perf's estimate); output tokens: `gen_ai.usage.output_tokens`
  (or `completion_tokens`), else the output text's estimate, else `gen_ai.request.max_tokens`.
- block ids: chained hashes of the messages' text (textblocks.py): a later call whose input
  repeats an earlier call's messages shares their blocks (the shared prefix), in the session
  and across files.
- think time: the gap from the previous span's end to this span's start (0 when they
  overlap: a fan-out is replayed one call after another); api time: the span's duration.
- error spans (status code 2) are left out, as inference-perf does by default.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import InputError
from .model import MAX_TOKENS, Trace, Turn
from .textblocks import estimate_tokens, messages_text, text_block_ids

BLOCK_SIZE = 64
SESSION_KEYS = ("session.id", "gen_ai.conversation.id", "exgentic.session.id")
INPUT = "gen_ai.input.messages"
ERROR = 2  # OTel status code ERROR


def is_otel_doc(doc: object) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("spans"), list)


def _attrs(span: Mapping) -> dict:
    """Attributes as a flat mapping (inference-perf's dict, or OTLP's [{key, value: {xValue}}])."""
    a = span.get("attributes") or {}
    if isinstance(a, list):
        return {x.get("key"): next(iter((x.get("value") or {}).values()), None)
                for x in a if isinstance(x, dict)}
    return a if isinstance(a, dict) else {}


def _time(v: object, source: str, where: str, key: str) -> float:
    """Seconds since the epoch from an ISO 8601 string or integer nanoseconds."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) / 1e9
    if isinstance(v, str):
        try:
            t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()
    raise InputError(source, f"must be an ISO 8601 time or nanoseconds (got {v!r})",
                     line=where, field=key)


def _json_list(v: object, source: str, where: str, key: str) -> list:
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            raise InputError(source, "is not a JSON list of messages", line=where,
                             field=key) from None
    if not isinstance(v, list):
        raise InputError(source, "must be a list of messages", line=where, field=key)
    return v


def _tokens(a: Mapping, keys: tuple[str, ...], source: str, where: str) -> int | None:
    for k in keys:
        v = a.get(k)
        if isinstance(v, str) and v.isdigit():
            v = int(v)
        if v is not None:
            if type(v) is not int or not 0 <= v <= MAX_TOKENS:
                raise InputError(source, f"must be a token count (got {v!r})", line=where,
                                 field=k)
            return v
    return None


def _output_text(a: Mapping) -> str:
    for k in ("gen_ai.output.text", "gen_ai.completion"):
        if isinstance(a.get(k), str):
            return a[k]
    out = a.get("gen_ai.output.messages")
    if isinstance(out, str):
        try:
            out = orjson.loads(out)
        except orjson.JSONDecodeError:
            return out
    return messages_text(out) if isinstance(out, list) else ""


def parse_otel(doc: dict, source: str, name: str) -> list[Trace]:
    calls: dict[str, list[dict[str, Any]]] = {}
    for i, span in enumerate(doc["spans"]):
        where = f"spans[{i}]"
        if not isinstance(span, dict):
            raise InputError(source, "a span must be a JSON object", line=where)
        a = _attrs(span)
        if INPUT not in a or (span.get("status") or {}).get("code") == ERROR:
            continue  # not an LLM call, or a failed one
        msgs = _json_list(a[INPUT], source, where, INPUT)
        start = _time(span.get("start_time", span.get("startTimeUnixNano")), source, where,
                      "start_time")
        end = _time(span.get("end_time", span.get("endTimeUnixNano")), source, where,
                    "end_time")
        text = messages_text(msgs)
        n_in = _tokens(a, ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"), source,
                       where)
        n_in = estimate_tokens(text) if n_in is None else n_in
        out = _tokens(a, ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
                      source, where)
        if out is None:
            out_text = _output_text(a)
            out = estimate_tokens(out_text) if out_text else _tokens(
                a, ("gen_ai.request.max_tokens",), source, where)
        sid = next((str(a[k]) for k in SESSION_KEYS if a.get(k) is not None),
                   str(span.get("trace_id") or doc.get("trace_id") or name))
        calls.setdefault(sid, []).append({
            "start": start, "end": max(start, end), "in": n_in, "out": max(1, out or 1),
            "ids": text_block_ids(text, BLOCK_SIZE, -(-n_in // BLOCK_SIZE),
                                  salt=f"{source}/{span.get('span_id', i)}")})
    if not calls:
        raise InputError(source, f"no LLM span (a span with {INPUT}) in the trace")
    return [_session(f"{name}-{sid}", cs, source) for sid, cs in calls.items()]


def _session(tid: str, calls: list[dict], source: str) -> Trace:
    calls.sort(key=lambda c: c["start"])
    t0, prev_end, steps = calls[0]["start"], None, []
    for c in calls:
        think = 0.0 if prev_end is None else max(0.0, c["start"] - prev_end)
        steps.append(Turn(in_tokens=c["in"], out_tokens=c["out"], hash_ids=c["ids"],
                          t=c["start"] - t0, think_time=think, api_time=c["end"] - c["start"],
                          kind="n"))
        prev_end = c["end"] if prev_end is None else max(prev_end, c["end"])
    return Trace(id=tid, steps=steps, block_size=BLOCK_SIZE, source=source,
                 hash_id_scope="global", start_s=t0)
