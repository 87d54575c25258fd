"""Incremental Server-Sent-Events decoding of OpenAI-style streams into StreamFacts.

Bytes are fed with the timestamp the transport took when they arrived (before any parsing);
each complete `data:` event is decoded once, never on partial data, and every event completed
by one read gets that read's timestamp. `StreamDecoder` does the per-event accounting
(definitions in docs/metrics.md): a chunk's token count is the increase of
`usage.completion_tokens` when the server streams continuous usage (several tokens per chunk
under speculative decoding), else 1 per chunk that carries text; `delta.reasoning` /
`delta.reasoning_content` count as tokens. Only raw facts are recorded (arrival times, token
counts, usage); the metrics are computed from them by `metrics.definitions`.

What a server sends is checked before it is believed (docs/reliability.md): lines may end with
CRLF, LF or CR (the SSE spec); an event may hold at most MAX_EVENT bytes (else the response is
dropped, class `oversized`), and the bytes of an unfinished event are kept as a list and
joined once, so decoding stays linear in the body; every token count must be a non-negative
integer below MAX_COUNT and the continuous count may not go down (else class `bad_usage`:
the number is not kept); an event that is JSON but not the shape of a chunk is `malformed`;
nothing after `data: [DONE]` is read.
"""
from __future__ import annotations

import orjson

from ..records import MAX_COUNT, is_count
from .facts import StreamFacts

DONE = b"[DONE]"
MAX_EVENT = 16 << 20  # bytes one SSE event may hold (the largest vLLM chunk is a few KiB)
_loads = orjson.loads
_JSONError = orjson.JSONDecodeError
# what a JSON event of the wrong shape raises in the accounting below (a list for an object,
# a number for a string, ...)
_SHAPE = (AttributeError, TypeError, KeyError, IndexError, ValueError)


class StreamAbort(Exception):
    """The response cannot be read on (an event beyond MAX_EVENT): the connection is dropped
    and the request fails with class `kind`."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


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

    __slots__ = ("facts", "t0", "seen_done", "text_parts", "_pend", "_pend_n", "_cr",
                 "_prev_usage", "_offsets", "_tokens", "_usage")

    def __init__(self, facts: StreamFacts, keep_text: bool = False) -> None:
        self.facts = facts
        self.t0 = 0
        self.seen_done = False
        self.text_parts: list[str] | None = [] if keep_text else None
        self._pend: list[bytes] = []  # the unfinished event's bytes, one piece per read
        self._pend_n = 0
        self._cr = False  # the last read ended with CR: a LF starting the next is its CRLF
        self._prev_usage = 0
        self._usage: dict | None = None
        self._offsets = facts.chunk_offsets_ns
        self._tokens = facts.chunk_tokens

    def feed(self, data: bytes, t: int) -> None:
        if self.seen_done:
            return  # bytes after [DONE] are not part of the answer
        if self._cr or b"\r" in data:
            data = self._lf(data)
        if self._pend:
            data = self._complete(data)
            if not data:
                return
        pos = 0
        find = data.find
        while True:
            end = find(b"\n\n", pos)
            if end < 0:
                break
            if data.startswith(b"data: ", pos) and find(b"\n", pos, end) < 0:
                self._event(data[pos + 6:end], t)  # the common one-line event
            else:
                payload = _data_of(data[pos:end])
                if payload is not None:
                    self._event(payload, t)
            if self.seen_done:
                return
            pos = end + 2
        if pos < len(data):  # an unfinished event: held (nothing else is)
            rest = data[pos:] if pos else data
            self._pend.append(rest)
            self._pend_n = len(rest)
            if self._pend_n > MAX_EVENT:
                self._oversized()

    def _lf(self, data: bytes) -> bytes:
        """CRLF and a lone CR end lines as LF does (the SSE spec); a CRLF split across two
        reads is one line end. Each read is rewritten once, never the held bytes."""
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = data[-1:] == b"\r"
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _oversized(self) -> None:
        self._pend.clear()
        self._pend_n = 0
        raise StreamAbort("oversized", f"an SSE event passed {MAX_EVENT >> 20} MiB without "
                          "ending (no blank line): not an event stream")

    def _complete(self, data: bytes) -> bytes:
        """An event is held from earlier reads: when `data` ends it, the held bytes and
        `data` joined (scanned from the start again, once); else `data` is held too and b""
        is returned. Only the new bytes are searched, so a long event costs linear time."""
        if not data:
            return b""
        pend = self._pend
        if data[:1] == b"\n" and pend[-1][-1:] == b"\n":
            pass  # the blank line straddles the two reads
        elif data.find(b"\n\n") < 0:
            pend.append(data)
            self._pend_n += len(data)
            if self._pend_n > MAX_EVENT:
                self._oversized()
            return b""
        pend.append(data)
        data = b"".join(pend)
        pend.clear()
        self._pend_n = 0
        return data

    def _error(self, kind: str, detail: str) -> None:
        """The request fails with `kind` (the first fault found is the one reported)."""
        f = self.facts
        if f.error is None:
            f.error = kind
            f.error_detail = detail[:300]

    def _bad_count(self, name: str, v: object) -> None:
        prev = self._prev_usage
        why = (f"went down from {prev}" if type(v) is int and 0 <= v < prev
               else "is not a token count")
        self._error("bad_usage", f"{name} {repr(v)[:40]} {why}")

    def _event(self, payload: bytes, t: int) -> None:
        if payload == DONE:
            self.seen_done = True
            return
        if self.text_parts is None:
            k = _fast_content_tokens(payload)
            if k >= 0:  # a plain content chunk: no JSON parse needed
                n = k - self._prev_usage
                if n < 0 or k >= MAX_COUNT:
                    self._bad_count("usage.completion_tokens", k)
                    return
                f = self.facts
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
        if type(ev) is not dict:
            self._error("malformed", payload[:200].decode("utf-8", "replace"))
            return
        try:
            self._json_event(ev, t)
        except _SHAPE as exc:  # JSON, but not a chunk: a list for `choices`, a number for text
            self._error("malformed", f"unexpected event shape ({type(exc).__name__}: {exc}): "
                        + payload[:200].decode("utf-8", "replace"))

    def _json_event(self, ev: dict, t: int) -> None:
        f = self.facts
        choices = ev.get("choices")
        usage = ev.get("usage")
        if usage is not None and type(usage) is not dict:
            self._bad_count("usage", usage)
            return
        if not choices:
            if "error" in ev:
                self._error("stream_error", str(ev["error"]))
                return
            if usage:  # the final usage-only chunk (cached tokens, per-request metrics)
                self.finish()
                self._take_usage(usage)
                m = ev.get("metrics")
                if m:
                    f.server_ttft_ms = _ms_or_none(m.get("time_to_first_token_ms"))
                    f.server_queue_ms = _ms_or_none(m.get("queue_time_ms"))
                    sd = m.get("speculative_decoding")
                    if sd:
                        acc, steps = sd.get("num_accepted_draft_tokens"), sd.get("num_spec_steps")
                        f.spec_accepted = acc if is_count(acc) else None
                        f.spec_steps = steps if is_count(steps) else None
            return
        ch = choices[0]
        delta = ch.get("delta")
        if delta is not None:
            content = delta.get("content")
            reasoning = (None if content is not None and len(delta) == 1 else
                         delta.get("reasoning") or delta.get("reasoning_content"))
        else:  # /v1/completions
            content, reasoning = ch.get("text"), None
        if content is not None and type(content) is not str or \
                reasoning is not None and type(reasoning) is not str:
            raise TypeError("content or reasoning is not a string")
        ct = usage.get("completion_tokens") if usage else None
        if ct is not None:
            if type(ct) is not int or not self._prev_usage <= ct < MAX_COUNT:
                self._bad_count("usage.completion_tokens", ct)
                return
            k = ct - self._prev_usage
            self._prev_usage = ct
            self._usage = usage  # applied once, at the end: only the last one counts
        else:
            k = 1 if content or reasoning else 0
        f.last_chunk_ns = t  # vLLM's first/last "token" instants: any non-empty choices
        if not f.first_chunk_ns:
            f.first_chunk_ns = t
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
            f.finish_reason = fr if type(fr) is str else str(fr)[:40]

    def _take_usage(self, usage: dict) -> None:
        """prompt, completion and cached tokens of a usage object, each kept only when it is
        a token count (else the request is `bad_usage` and the number is not kept)."""
        f = self.facts
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if type(details) is dict else None
        for name, v in (("usage.prompt_tokens", pt), ("usage.completion_tokens", ct),
                        ("usage.prompt_tokens_details.cached_tokens", cached)):
            if v is not None and not is_count(v):
                self._bad_count(name, v)
                return
        if pt is not None:
            f.isl = pt
        if ct is not None:
            f.osl = ct
        if cached is not None:
            f.cached_tokens = cached

    def finish(self) -> None:
        """Apply the last per-chunk usage (prompt and completion tokens so far): a stream cut
        before its final usage chunk keeps what it had. Plain token chunks skip the JSON parse,
        so their running completion count is the decoder's own."""
        if self._usage is not None:
            self._take_usage(self._usage)
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


def _ms_or_none(v: object) -> float | None:
    """A server-reported duration in ms: a finite non-negative number, else not kept."""
    if type(v) in (int, float) and 0 <= v < 1e12:  # False for NaN and infinity
        return v
    return None
