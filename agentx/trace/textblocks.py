"""Block ids and token counts for trace formats that carry text instead of ids (OpenTelemetry
GenAI spans, AIPerf `messages` rows): what the prefix-cache model needs from them.

Tokens are estimated at 4 characters each, inference-perf's own estimate for these traces
(estimate_token_count, chars_per_token=4.0 in inference_perf/datagen/replay/otel_trace_utils.py).
A block is `block_size` tokens of that estimate (4 x block_size characters) of the prompt's
text; its id is a chained hash of every block up to it, so two prompts share block i exactly
when their texts agree up to its end, across sessions and files alike (ids are `global`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import orjson

CHARS_PER_TOKEN = 4
ID_BITS = 48  # hash ids are ints below 2^48: no collision in any trace set of a sane size


def estimate_tokens(text: str) -> int:
    """Tokens of `text` at CHARS_PER_TOKEN characters each (at least 1 for non-empty text)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def message_text(m: object) -> str:
    """One chat message as text: its role, then its content (a string, a list of text parts,
    or an OTel `parts` list), then its tool calls as JSON."""
    if not isinstance(m, Mapping):
        return str(m)
    out = [str(m.get("role", ""))]
    content = m.get("content")
    parts = content if isinstance(content, list) else m.get("parts")
    if isinstance(content, str):
        out.append(content)
    for p in parts if isinstance(parts, list) else ():
        if isinstance(p, Mapping):
            text = p.get("text", p.get("content"))
            out.append(text if isinstance(text, str) else orjson.dumps(p).decode())
        else:
            out.append(str(p))
    if m.get("tool_calls"):
        out.append(orjson.dumps(m["tool_calls"]).decode())
    return "\n".join(out) + "\n"


def messages_text(messages: Iterable[object]) -> str:
    return "".join(message_text(m) for m in messages)


def text_block_ids(text: str, block_size: int, n_blocks: int | None = None,
                   salt: str = "") -> list[int]:
    """Chained-hash ids of the text's blocks (4 x block_size characters each, the last one
    partial). `n_blocks`: the prompt's block count when its token count is known otherwise
    (a span's reported usage): the list is cut to it, or filled with ids unique to `salt`."""
    width = CHARS_PER_TOKEN * block_size
    h = hashlib.blake2b(digest_size=8)
    ids = []
    for i in range(0, len(text), width):
        h.update(text[i:i + width].encode())
        ids.append(int.from_bytes(h.copy().digest(), "big") >> (64 - ID_BITS))
    if n_blocks is None:
        return ids
    ids = ids[:n_blocks]
    for k in range(len(ids), n_blocks):  # content the text does not show: its own ids
        d = hashlib.blake2b(f"{salt}/{k}".encode(), digest_size=8).digest()
        ids.append(int.from_bytes(d, "big") >> (64 - ID_BITS))
    return ids
