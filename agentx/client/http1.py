"""HTTP/1.1 message framing for the streaming client: the request body it may resend, and the
incremental parse of a response whose body bytes go straight to the stream decoder.

Every `feed` carries the arrival timestamp the connection took before anything else ran
(`wire._Conn.data_received`); de-chunking here adds no copy in the common case of a whole chunk
per read.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .sse import StreamAbort, StreamDecoder

MAX_HEAD = 64 * 1024  # one response head
MAX_HEADS = 1 << 20  # all the heads of one response, interim (1xx) ones included
MAX_ERROR_BODY = 64 * 1024  # a non-200 (or non-SSE) body kept; beyond it the connection is closed
MAX_CHUNK_LINE = 4096  # a chunk-size line (the size in hex and any extensions) and its CRLF
MAX_TRAILER = 64 * 1024  # the trailer after the last chunk, and any bytes after `data: [DONE]`


class HTTPError(Exception):
    """A failure classified for RequestRecord.error (connect, reset, timeout, client_error)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Stale(Exception):
    """A reused keep-alive connection died before any response byte: safe to resend."""


class RequestBody:
    """A request body that the client lets go of once the response has begun: a resend is
    possible only before that, and an agentic prompt is ~1 MB per lane that would otherwise
    stay alive for the whole generation. Callers pass bytes (or fragments) and keep no
    reference of their own if they want the memory back early."""

    __slots__ = ("parts", "size")

    def __init__(self, body: bytes | Sequence[bytes]) -> None:
        self.parts: Sequence[bytes] | None = (body,) if type(body) is bytes else body
        self.size = sum(len(p) for p in self.parts)


_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_EOF, _DONE = range(8)


class Response:
    """Incremental parse of one HTTP/1.1 response; body bytes go to the decoder (status
    200, an event stream) or are kept as the error body (its first MAX_ERROR_BODY bytes: the
    response ends there and the connection is closed). Finishes `done` when the body is
    complete. A 200 whose Content-Type is not text/event-stream is `not_streamed` (JSON: the
    server ignored `"stream": true`) or `malformed` (an HTML page) without being decoded."""

    __slots__ = ("decoder", "done", "state", "buf", "status", "remaining", "keep_alive",
                 "err_body", "err_len", "sse", "head_len", "got_bytes", "last_rx", "body",
                 "retry_after", "after_done")

    def __init__(self, decoder: StreamDecoder, done: asyncio.Future, body: RequestBody) -> None:
        self.body = body
        self.decoder = decoder
        self.done = done
        self.state = _HEAD
        self.buf = b""
        self.status = 0
        self.remaining = 0
        self.keep_alive = False
        self.err_body: list[bytes] = []
        self.err_len = 0  # error body bytes received
        self.sse = False  # the body goes to the decoder
        self.head_len = 0  # bytes of the heads parsed so far
        self.got_bytes = False
        self.last_rx = 0
        self.retry_after: bytes | None = None  # a 429's or 503's Retry-After header
        self.after_done = 0  # bytes that came after the stream's `data: [DONE]`

    def feed(self, data: bytes, t: int) -> None:
        if not self.got_bytes:
            self.got_bytes = True
            self.body.parts = None  # no resend from here on: let the body go
        self.last_rx = t
        if self.sse and self.decoder.seen_done and self.state != _DONE:
            self.after_done += len(data)  # the answer is complete: only framing is left
            if self.after_done > MAX_TRAILER:
                self._framing(f"more than {MAX_TRAILER} bytes after data: [DONE] without the "
                              "response's end")
                return
        try:
            if self.state == _HEAD:
                data = self._heads(data)
                if not data:
                    return
            if self.state == _LENGTH:
                self._sink(data[:self.remaining], t)
                self.remaining -= min(len(data), self.remaining)
                if self.remaining == 0:
                    self.state = _DONE
                    self._finish()
            elif self.state == _UNTIL_EOF:
                self._sink(data, t)
            elif self.state != _DONE:
                self._chunked(data, t)
        except StreamAbort as exc:  # the decoder cannot go on (an oversized event)
            self._fail(HTTPError(exc.kind, str(exc)))
        except Exception as exc:  # noqa: BLE001 - whatever a server sends must not kill the loop
            self._fail(HTTPError("malformed", f"undecodable response: {type(exc).__name__}: "
                                 f"{exc}"[:300]))

    def _heads(self, data: bytes) -> bytes:
        """Parse heads until the final (non-1xx) one; returns the body bytes after it (b""
        when there are none yet, the head is incomplete or the response failed or ended). Any
        number of interim responses is read, in a loop, up to MAX_HEADS bytes in all."""
        buf = self.buf + data if self.buf else data
        pos = 0
        while True:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                rest = buf[pos:] if pos else buf
                if len(rest) > MAX_HEAD or self.head_len + len(rest) > MAX_HEADS:
                    self._fail(HTTPError("client_error", "response head too large"))
                    return b""
                self.buf = rest
                return b""
            self.head_len += end + 4 - pos
            if self.head_len > MAX_HEADS:
                self._fail(HTTPError("client_error", f"response heads beyond {MAX_HEADS} bytes "
                                     "(interim 1xx responses without end)"))
                return b""
            try:
                self._head(buf[pos:end])
            except (ValueError, IndexError) as exc:
                self._fail(HTTPError("client_error", f"bad response head: {exc}"))
                return b""
            pos = end + 4
            if self.state != _HEAD:  # not an interim 1xx head
                break
        self.buf = b""
        if self.state == _DONE:
            self._finish()
            return b""
        return buf[pos:]

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if not parts[0].startswith(b"HTTP/"):
            raise ValueError(lines[0][:80].decode("latin-1"))
        self.status = int(parts[1])
        if 100 <= self.status < 200:
            return  # state stays _HEAD
        hdr: dict[bytes, bytes] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            hdr[k.strip().lower()] = v.strip()
        if self.status in (429, 503):
            self.retry_after = hdr.get(b"retry-after")
        ctype = hdr.get(b"content-type", b"").lower()
        self.sse = self.status == 200 and (not ctype or b"event-stream" in ctype)
        if self.status == 200 and not self.sse:
            self._not_sse(ctype)
        conn = hdr.get(b"connection", b"").lower()
        self.keep_alive = parts[0] == b"HTTP/1.1" and conn != b"close" or conn == b"keep-alive"
        if b"chunked" in hdr.get(b"transfer-encoding", b"").lower():
            self.state = _CHUNK_SIZE
        elif b"content-length" in hdr:
            self.remaining = int(hdr[b"content-length"])
            self.state = _LENGTH if self.remaining else _DONE
        else:
            self.keep_alive = False
            self.state = _UNTIL_EOF

    def _chunked(self, data: bytes, t: int) -> None:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        ok = self.sse
        feed = self.decoder.feed
        while pos < n:
            st = self.state
            if st == _CHUNK_SIZE:
                j = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
                if j < 0:
                    if n - pos >= MAX_CHUNK_LINE:
                        self._framing(f"chunk-size line beyond {MAX_CHUNK_LINE} bytes without "
                                      "CRLF")
                        return
                    break
                try:
                    size = int(buf[pos:j].split(b";", 1)[0], 16)
                except ValueError:
                    self._framing("bad chunk size")
                    return
                pos = j + 2
                if not size:
                    self.state = _TRAILER
                    continue
                end = pos + size
                if end + 2 <= n:  # the whole chunk is here (the common case): one step
                    if ok:
                        feed(buf[pos:end], t)
                    elif self._keep_error(buf[pos:end]):
                        return
                    pos = end + 2
                    continue
                self.remaining = size
                self.state = _CHUNK_DATA
            elif st == _CHUNK_DATA:
                take = min(self.remaining, n - pos)
                piece = buf if take == n else buf[pos:pos + take]
                if ok:
                    feed(piece, t)
                elif self._keep_error(piece):
                    return
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = _CHUNK_CRLF
            elif st == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    self._framing("chunk data not followed by CRLF")
                    return
                pos += 2
                self.state = _CHUNK_SIZE
            elif st == _TRAILER:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    j = buf.find(b"\r\n\r\n", pos, pos + MAX_TRAILER)
                    if j < 0:
                        if n - pos >= MAX_TRAILER:
                            self._framing(f"trailer beyond {MAX_TRAILER} bytes")
                            return
                        break
                    pos = j + 4
                self.state = _DONE
                self.buf = b""
                self._finish()
                return
            else:
                return
        self.buf = buf[pos:] if pos < n else b""

    def _sink(self, data: bytes, t: int) -> None:
        if self.sse:
            self.decoder.feed(data, t)
        else:
            self._keep_error(data)

    def _keep_error(self, data: bytes) -> bool:
        """Keep the start of an error (or non-SSE) body; past MAX_ERROR_BODY the response
        ends here and its connection is closed (returns True): nobody reads the rest."""
        room = MAX_ERROR_BODY - self.err_len
        if room > 0:
            self.err_body.append(data if len(data) <= room else data[:room])
        self.err_len += len(data)
        if self.err_len <= MAX_ERROR_BODY:
            return False
        self.keep_alive = False
        self.state = _DONE
        self._finish()
        return True

    def _not_sse(self, ctype: bytes) -> None:
        """A 200 that is not an event stream: nothing in it is decoded."""
        f = self.decoder.facts
        shown = ctype.decode("latin-1")[:80]
        if b"json" in ctype:
            f.error = "not_streamed"
            f.error_detail = (f"server did not stream (HTTP 200, Content-Type {shown}): check "
                              "--extra-body (\"stream\" must stay true)")
        else:
            f.error = "malformed"
            f.error_detail = f"HTTP 200 with Content-Type {shown}, not text/event-stream"

    def _finish(self) -> None:
        if self.done.done():
            return
        if not self.sse and self.status == 200 and self.err_body:  # what the 200 said instead
            f = self.decoder.facts
            f.error_detail = f"{f.error_detail}: " + b"".join(self.err_body)[:200].decode(
                "utf-8", "replace")
        self.done.set_result(None)

    def _framing(self, detail: str) -> None:
        """Broken or endless HTTP framing: a stream already complete (`data: [DONE]` read) is
        kept and its connection closed; anything else fails as `client_error`."""
        if self.sse and self.decoder.seen_done:
            self.keep_alive = False
            self.state = _DONE
            self._finish()
        else:
            self._fail(HTTPError("client_error", f"bad chunk framing: {detail}"))

    def _fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        self.state = _DONE  # whatever else arrives is not read
        if not self.done.done():
            self.done.set_exception(exc)

    def closed(self, exc: BaseException | None) -> None:
        """The connection ended (EOF or error) while this response was current."""
        self.keep_alive = False
        if self.state == _UNTIL_EOF and exc is None:
            self.state = _DONE
            self._finish()
        elif self.state != _DONE:
            if not self.got_bytes:
                self._fail(Stale(str(exc or "connection closed before the response")))
            else:
                self._fail(HTTPError("reset", str(exc) if exc else
                                     "connection closed before the response ended"))
