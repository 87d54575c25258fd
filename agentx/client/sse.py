"""Incremental Server-Sent-Events decoding of OpenAI-style streams into StreamFacts.

Bytes are fed with the timestamp the transport took when they arrived (before any parsing);
each complete `data:` event is decoded once, never on partial data, and every event completed
by one read gets that read's timestamp. `StreamDecoder` does the per-event accounting
(definitions in docs/metrics.md): a chunk's token count is the increase of
`usage.completion_tokens` when the server streams continuous usage (several tokens per chunk
under speculative decoding), else 1 per chunk that carries text; `delta.reasoning` /
`delta.reasoning_content` count as tokens. Only raw facts are recorded (arrival times, token
counts, usage); the metrics are computed from them by `metrics.definitions`.
"""
from __future__ import annotations

import orjson

from .facts import StreamFacts

DONE = b"[DONE]"
_loads = orjson.loads
_JSONError = orjson.JSONDecodeError


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data: "):
        if b"\n" not in event:
            return event[6:]
    elif event.startswith(b"data:") and b"\n" not in event:
        return event[5:].lstrip()
    lines = [ln for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None  # comment / keep-alive / other field
    return b"\n".join(ln[5:].lstrip() if not ln.startswith(b"data: ") else ln[6:] for ln in lines)


class StreamDecoder:
    """One response stream -> `facts` (chunk offsets and tokens, first chunk, usage...).

    `t0` is the request's start (monotonic ns); `feed(data, t)` takes body bytes and their
    arrival time. vLLM's plain token chunks are recognised by byte search (no JSON parse,
    the payload slice is the only allocation); every other event is parsed once."""

    __slots__ = ("facts", "t0", "seen_done", "text_parts", "_buf", "_prev_usage", "_offsets",
                 "_tokens", "_usage")

    def __init__(self, facts: StreamFacts, keep_text: bool = False) -> None:
        self.facts = facts
        self.t0 = 0
        self.seen_done = False
        self.text_parts: list[str] | None = [] if keep_text else None
        self._buf = b""
        self._prev_usage = 0
        self._usage: dict | None = None
        self._offsets = facts.chunk_offsets_ns
        self._tokens = facts.chunk_tokens

    def feed(self, data: bytes, t: int) -> None:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            if buf[-1:] == b"\r":  # a CRLF may be split across reads: wait for its LF
                self._buf = buf
                return
            buf = buf.replace(b"\r\n", b"\n")
        pos = 0
        find = buf.find
        while True:
            end = find(b"\n\n", pos)
            if end < 0:
                break
            if buf.startswith(b"data: ", pos) and find(b"\n", pos, end) < 0:
                self._event(buf[pos + 6:end], t)  # the common one-line event
            else:
                payload = _data_of(buf[pos:end])
                if payload is not None:
                    self._event(payload, t)
            pos = end + 2
        self._buf = buf[pos:] if pos else buf

    def _event(self, payload: bytes, t: int) -> None:
        if payload == DONE:
            self.seen_done = True
            return
        if self.text_parts is None:
            k = _fast_content_tokens(payload)
            if k >= 0:  # a plain content chunk: no JSON parse needed
                f = self.facts
                n = k - self._prev_usage
                self._prev_usage = k
                f.last_chunk_ns = t
                if not f.first_chunk_ns:
                    f.first_chunk_ns = t
                if not f.first_content_ns:
                    f.first_content_ns = t
                self._offsets.append(t - self.t0)
                self._tokens.append(n)
                return
        try:
            ev = _loads(payload)
        except _JSONError:
            ev = None
        f = self.facts
        if type(ev) is not dict:
            f.error = "malformed"
            f.error_detail = payload[:200].decode("utf-8", "replace")
            return
        choices = ev.get("choices")
        usage = ev.get("usage")
        if not choices:
            if "error" in ev:
                f.error = "stream_error"
                f.error_detail = str(ev["error"])[:300]
                return
            if usage:  # the final usage-only chunk (cached tokens, per-request metrics)
                self.finish()
                take_usage(f, usage)
                m = ev.get("metrics")
                if m:
                    f.server_ttft_ms = m.get("time_to_first_token_ms")
                    f.server_queue_ms = m.get("queue_time_ms")
                    sd = m.get("speculative_decoding")
                    if sd:
                        f.spec_accepted = sd.get("num_accepted_draft_tokens")
                        f.spec_steps = sd.get("num_spec_steps")
            return
        f.last_chunk_ns = t  # vLLM's first/last "token" instants: any non-empty choices
        if not f.first_chunk_ns:
            f.first_chunk_ns = t
        ch = choices[0]
        delta = ch.get("delta")
        if delta is not None:
            content = delta.get("content")
            reasoning = (None if content is not None and len(delta) == 1 else
                         delta.get("reasoning") or delta.get("reasoning_content"))
        else:  # /v1/completions
            content, reasoning = ch.get("text"), None
        ct = usage.get("completion_tokens") if usage else None
        if ct is not None:
            k = ct - self._prev_usage
            self._prev_usage = ct
            self._usage = usage  # applied once, at the end: only the last one counts
        else:
            k = 1 if content or reasoning else 0
        if k > 0 or content or reasoning:
            if reasoning:
                f.reasoning_tokens += k
            elif content and not f.first_content_ns:
                f.first_content_ns = t
            self._offsets.append(t - self.t0)
            self._tokens.append(k)
            if content and self.text_parts is not None:
                self.text_parts.append(content)
        fr = ch.get("finish_reason")
        if fr:
            f.finish_reason = fr

    def finish(self) -> None:
        """Apply the last per-chunk usage (prompt and completion tokens so far): a stream cut
        before its final usage chunk keeps what it had. Plain token chunks skip the JSON parse,
        so their running completion count is the decoder's own."""
        if self._usage is not None:
            take_usage(self.facts, self._usage)
            self.facts.osl = self._prev_usage
            self._usage = None

    @property
    def text(self) -> str | None:
        return "".join(self.text_parts) if self.text_parts is not None else None


_FAST_HEAD = b'"choices":[{"index":0,"delta":{"content":"'
_FAST_TAIL = b'"},"logprobs":null,"finish_reason":null'
_FAST_CT = b'"completion_tokens":'
_HEAD_LEN, _CT_LEN = len(_FAST_HEAD), len(_FAST_CT)


def _fast_content_tokens(p: bytes) -> int:
    """The cumulative completion_tokens of a chunk whose only choice delta is non-empty
    `content` with no finish_reason and continuous usage (vLLM's token chunk), found by
    byte search; -1 for anything else, which then takes the JSON path. Inside a JSON string
    every quote is escaped, so the tail pattern can only match where the content ends."""
    i = p.find(_FAST_HEAD)
    if i < 0:
        return -1
    a = i + _HEAD_LEN
    if p[a:a + 1] == b'"':  # empty content (vLLM's role chunk): the JSON path decides
        return -1
    j = p.find(_FAST_TAIL, a)
    if j < 0:
        return -1
    b = j
    while p[b - 1] == 92:  # backslashes before the quote: an odd count escapes it
        b -= 1
    if (j - b) & 1:
        return -1
    c = p.find(_FAST_CT, j)
    if c < 0:
        return -1
    c += _CT_LEN
    e = c
    n = len(p)
    while e < n and 48 <= p[e] <= 57:
        e += 1
    return int(p[c:e]) if e > c else -1


def take_usage(f: StreamFacts, usage: dict) -> None:
    if usage.get("prompt_tokens") is not None:
        f.isl = usage["prompt_tokens"]
    if usage.get("completion_tokens") is not None:
        f.osl = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if details and details.get("cached_tokens") is not None:
        f.cached_tokens = details["cached_tokens"]
