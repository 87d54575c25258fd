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

import re

import orjson

from ..records import MAX_COUNT, OSL_ALLOWANCE, is_count
from .facts import StreamFacts

DONE = b"[DONE]"
TEMPLATE_TRIES = 4  # chunks of a stream that may set its template (each costs a second parse)
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
    arrival time. Every event is parsed once, except vLLM's plain token chunks once one of
    them has been parsed and its shape verified (_Template): the stream's next ones are
    matched against its bytes, which believes exactly what the parse would (no JSON parse)."""

    __slots__ = ("facts", "t0", "seen_done", "text_parts", "_pend", "_pend_n", "_cr",
                 "_prev_usage", "_offsets", "_tokens", "_usage", "_tmpl", "_tries", "_counted",
                 "_limit", "_max_tokens")

    def __init__(self, facts: StreamFacts, keep_text: bool = False, max_tokens: int = 0) -> None:
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
        self._tmpl: _Template | None = None  # the verified shape of this stream's chunks
        self._tries = TEMPLATE_TRIES
        # a server that goes on past max_tokens + OSL_ALLOWANCE is not read on (bad_usage):
        # it would hold the lane to the request timeout and grow the record without bound
        self._max_tokens = max_tokens
        self._limit = max_tokens + OSL_ALLOWANCE if max_tokens > 0 else MAX_COUNT
        self._counted = 0

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

    def _runaway(self) -> None:
        raise StreamAbort("bad_usage", f"usage: counted tokens {self._counted} > max_tokens "
                          f"{self._max_tokens} + {OSL_ALLOWANCE}: the server went on past "
                          "the limit; stopped reading there")

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
        tmpl = self._tmpl
        if tmpl is not None:
            k = tmpl.match(payload)
            if k >= 0:  # a plain content chunk of the verified shape: no JSON parse needed
                n = k - self._prev_usage
                if n < 0 or k >= MAX_COUNT:
                    self._bad_count("usage.completion_tokens", k)
                    return
                f = self.facts
                self._prev_usage = k
                self._usage = tmpl.usage  # as the JSON path keeps it (same prompt tokens)
                f.last_chunk_ns = t
                if not f.first_chunk_ns:
                    f.first_chunk_ns = t
                if not f.first_content_ns:
                    f.first_content_ns = t
                self._offsets.append(t - self.t0)
                self._tokens.append(n)
                self._counted += n
                if self._counted > self._limit:
                    self._runaway()
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
            return
        if self._tries and self.text_parts is None and self.facts.error is None \
                and _FAST_HEAD in payload:  # the next chunks of this shape skip the parse
            self._tries -= 1
            self._tmpl = _Template.of(payload, ev) or tmpl

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
            self._counted += k
            if self._counted > self._limit:
                self._runaway()
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
_TOTAL, _CT = b'"total_tokens":', b'"completion_tokens":'
# a JSON string's inside as orjson reads it, less \\u escapes (surrogates: the JSON path
# decides), one character at least; and a JSON integer without sign or leading zero
_STRING = rb'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])+'
_INT = rb'(?:0|[1-9][0-9]{0,9})'


class _Template:
    """The bytes of one verified vLLM token chunk, cut around its three variable parts: the
    content string and the total_tokens and completion_tokens integers. A later chunk that
    is these exact bytes with other well-formed values in those places parses, as JSON, to
    the verified chunk with those values (a string token for a string token, an integer
    for an integer): so the byte match believes exactly what the JSON path would."""

    __slots__ = ("head", "mid", "ct", "tail", "usage", "_rest")

    def __init__(self, head: bytes, mid: bytes, ct: bytes, tail: bytes, usage: dict) -> None:
        self.head, self.mid, self.ct, self.tail, self.usage = head, mid, ct, tail, usage
        self._rest = re.compile(_STRING + re.escape(mid) + _INT + re.escape(ct) + b"(" + _INT
                                + b")" + re.escape(tail))

    def match(self, p: bytes) -> int:
        """The chunk's completion_tokens when `p` is this template with valid values in its
        slots, else -1 (the JSON path decides)."""
        if not p.startswith(self.head):
            return -1
        m = self._rest.fullmatch(p, len(self.head))
        if m is None or not p.isascii() and not _utf8(p):
            return -1
        return int(m.group(1))

    @classmethod
    def of(cls, p: bytes, ev: dict) -> "_Template | None":
        """The template of chunk `p`, already parsed as `ev`, when it is a plain vLLM token
        chunk whose slots the byte search finds where the parse found them; else None."""
        a = p.find(_FAST_HEAD)
        if a < 0:
            return None
        a += len(_FAST_HEAD)
        j = p.find(_FAST_TAIL, a)
        t = p.find(_TOTAL, j) if j > a else -1
        c = p.find(_CT, t) if t > 0 else -1
        if c < 0:
            return None
        t += len(_TOTAL)
        c += len(_CT)
        te, ce = _digits(p, t), _digits(p, c)
        if te < 0 or ce < 0:
            return None
        tmpl = cls(p[:a], p[j:t], p[te:c], p[ce:], ev.get("usage"))
        probe = tmpl.head + b"Q" + tmpl.mid + b"8" + tmpl.ct + b"7" + tmpl.tail
        try:  # the slots are where the JSON is: the probe parses to the chunk, slots changed
            want = orjson.loads(probe)
            ch = ev["choices"][0]
            ok = (type(ev["usage"]) is dict and type(ch.get("delta")) is dict
                  and len(ch["delta"]) == 1 and ch.get("finish_reason") is None
                  and want == {**ev, "choices": [{**ch, "delta": {"content": "Q"}},
                                                 *ev["choices"][1:]],
                               "usage": {**ev["usage"], "total_tokens": 8,
                                         "completion_tokens": 7}})
        except (_JSONError, *_SHAPE):
            return None
        return tmpl if ok and tmpl.match(p) >= 0 else None


def _utf8(p: bytes) -> bool:
    try:
        p.decode()
    except UnicodeDecodeError:
        return False
    return True


def _digits(p: bytes, i: int) -> int:
    """End of the JSON integer at p[i:] (no sign, no leading zero, at most 10 digits), or -1."""
    e, n = i, min(len(p), i + 11)
    while e < n and 48 <= p[e] <= 57:
        e += 1
    if e == i or e - i > 10 or (p[i] == 48 and e - i > 1):
        return -1
    return e


def _ms_or_none(v: object) -> float | None:
    """A server-reported duration in ms: a finite non-negative number, else not kept."""
    if type(v) in (int, float) and 0 <= v < 1e12:  # False for NaN and infinity
        return v
    return None
