"""Minimal HTTP/1.1 streaming client over `asyncio.Protocol` (the request hot path).

Keep-alive connections, chunked or length-framed bodies, TLS when the URL says https. A
response's bytes are timestamped first thing in `data_received`, de-chunked and SSE-decoded
inside that callback, so a chunk costs no task wake-up, no stream-reader queue and no per-read
future. Under load a general-purpose client (aiohttp's StreamReader + a task per stream)
delays every timestamp by the time its task waits for the event loop; here the timestamp is
taken when the loop hands over the bytes. Message framing is in `http1`; what the client
observes goes into the decoder's StreamFacts (raw facts only). The control plane (/v1/models,
/tokenize) uses aiohttp (`HTTPClient.aio`).
"""
from __future__ import annotations

import asyncio
import email.utils
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..urls import redact_url
from .config import ClientConfig
from .facts import StreamFacts
from .http1 import HTTPError, RequestBody, Response, Stale
from .sse import StreamDecoder

__all__ = ["HTTPClient", "HTTPError", "RequestBody"]

perf_ns = time.perf_counter_ns
WRITE_SLICE = 256 * 1024


def retry_after_s(value: bytes) -> float | None:
    """A `Retry-After` header in seconds from now: delay-seconds or an HTTP-date (RFC 9110
    10.2.3); None when it is neither. A date in the past is 0."""
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v.decode("latin-1"))
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. The arrival timestamp is the first statement of
    data_received: nothing of ours runs between the loop reading the socket and it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.resp: Response | None = None
        self.closed = False
        self._drain: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        t = perf_ns()
        r = self.resp
        if r is not None:
            r.feed(data, t)
        else:  # bytes nobody asked for: this connection cannot be trusted any more
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def eof_received(self) -> bool:
        self.closed = True
        if self.resp is not None:
            self.resp.closed(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.resume_writing()
        if self.resp is not None:
            self.resp.closed(exc)

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        d, self._drain = self._drain, None
        if d is not None and not d.done():
            d.set_result(None)

    async def send(self, head: bytes, body: RequestBody, timeout_s: float,
                   deadline_ns: int) -> None:
        """Write head + body. Small bodies go in one synchronous write. Large ones go in
        slices as the socket drains: the transport copies whatever the kernel does not take
        at once, and 1024 lanes x ~1 MB bodies would otherwise sit twice in memory. Each
        wait for the socket to drain is bounded by `timeout_s` and by the request's
        deadline. A connection that closed before the write (the server went away while it
        sat in the pool, or during the wait for it) is `Stale`: uvloop raises RuntimeError on
        a write to a closed transport where asyncio's loop drops it."""
        tr = self.transport
        parts = body.parts
        assert tr is not None and parts is not None
        if self.closed or tr.is_closing():
            raise Stale("connection closed before the request was sent")
        if body.size < WRITE_SLICE:
            if len(parts) == 1:
                tr.write(head + parts[0])
            else:
                tr.writelines((head, *parts))
            return
        tr.write(head)
        for part in parts:
            mv = memoryview(part)
            for i in range(0, len(mv), WRITE_SLICE):
                if self._drain is not None:
                    left = (deadline_ns - perf_ns()) / 1e9
                    try:
                        await asyncio.wait_for(asyncio.shield(self._drain),
                                               min(timeout_s, left))
                    except asyncio.TimeoutError:
                        raise HTTPError("timeout", f"request body not taken for {timeout_s:g} s"
                                        " (--timeout)" if left > timeout_s else
                                        "request body still being sent at the --request-timeout"
                                        ) from None
                if self.closed:
                    return  # the response side reports what happened
                tr.write(mv[i:i + WRITE_SLICE])

    @property
    def reusable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self, abort: bool = False) -> None:
        if self.transport is not None:
            self.transport.abort() if abort else self.transport.close()


@dataclass(frozen=True)
class _Target:
    key: tuple  # (scheme, host, port)
    host: str
    port: int
    tls: bool
    path: str
    head: bytes  # request line + fixed headers, without Content-Length and per-request ones


class HTTPClient:
    """Keep-alive connections for the streaming hot path, plus an aiohttp session for the
    control plane. One per process (or per worker); use as an async context manager."""

    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self._idle: dict[tuple, list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._targets: dict[str, _Target] = {}
        self._aio: aiohttp.ClientSession | None = None
        self._sem = asyncio.Semaphore(cfg.max_connections) if cfg.max_connections else None
        self._ssl: ssl.SSLContext | None = None
        # the API key, else the URL's user:password (as aiohttp sends it for the control plane)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in {**cfg.headers(), **cfg.url_auth()}
                              .items() if k.lower() not in ("host", "content-length"))
        self._request_ns = int(cfg.request_timeout_s * 1e9)
        self.connections_opened = 0

    @property
    def aio(self) -> aiohttp.ClientSession:
        """aiohttp session for non-streaming calls (model list, /tokenize, ...)."""
        if self._aio is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout_s,
                                            sock_read=self.cfg.timeout_s)
            self._aio = aiohttp.ClientSession(timeout=timeout, headers=self.cfg.headers())
        return self._aio

    async def __aenter__(self) -> "HTTPClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()
        for c in list(self._busy):
            c.close(abort=True)
        self._busy.clear()
        if self._aio is not None:
            await self._aio.close()
            self._aio = None

    def target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise HTTPError("client_error", f"unsupported URL {redact_url(url)!r}")
            tls = u.scheme == "https"
            port = u.port or (443 if tls else 80)
            host_hdr = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
            if ":" in u.hostname:  # IPv6 literal
                host_hdr = f"[{u.hostname}]" + (f":{u.port}" if u.port else "")
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            head = (f"POST {path} HTTP/1.1\r\nHost: {host_hdr}\r\n{self._fixed}"
                    "User-Agent: agentx\r\n").encode("latin-1")
            t = _Target((u.scheme, u.hostname, port), u.hostname, port, tls, path, head)
            self._targets[url] = t
        return t

    async def _connect(self, t: _Target, timeout_s: float | None = None) -> _Conn:
        try:
            conn = await asyncio.wait_for(self._open(t), timeout_s or self.cfg.connect_timeout_s)
        except asyncio.TimeoutError:
            raise HTTPError("connect", f"connect to {t.host}:{t.port} timed out") from None
        except OSError as exc:
            raise HTTPError("connect", f"cannot connect to {t.host}:{t.port}: {exc}") from None
        self.connections_opened += 1
        return conn

    async def _open(self, t: _Target) -> _Conn:
        loop = asyncio.get_running_loop()
        ctx = None
        if t.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        _, conn = await loop.create_connection(_Conn, t.host, t.port, ssl=ctx,
                                               server_hostname=t.host if ctx else None)
        return conn

    async def preconnect(self, url: str, n: int, parallel: int = 64) -> int:
        """Open `n` keep-alive connections to `url`'s server before the run starts, so the
        first requests do not each wait for a TCP handshake and the server's accept queue
        (at hundreds of lanes starting together that wait is the server's, not the request's,
        yet falls inside the TTFT). Failures are left to the requests themselves."""
        t = self.target(url)
        sem = asyncio.Semaphore(parallel)

        async def one() -> _Conn | None:
            async with sem:
                try:
                    return await self._connect(t)
                except HTTPError:
                    return None

        conns = [c for c in await asyncio.gather(*(one() for _ in range(n))) if c is not None]
        self._idle.setdefault(t.key, []).extend(conns)
        return len(conns)

    async def _acquire(self, t: _Target, deadline_ns: int) -> tuple[_Conn, bool]:
        idle = self._idle.get(t.key)
        while idle:
            c = idle.pop()
            if c.reusable:
                return c, True
        left = (deadline_ns - perf_ns()) / 1e9
        if left <= 0:
            raise HTTPError("timeout", "not complete within the --request-timeout")
        return await self._connect(t, min(self.cfg.connect_timeout_s, left)), False

    def _release(self, t: _Target, c: _Conn, reuse: bool) -> None:
        self._busy.discard(c)
        c.resp = None
        if reuse and c.reusable:
            self._idle.setdefault(t.key, []).append(c)
        else:
            c.close(abort=not c.closed)

    async def stream(self, url: str, body: RequestBody, headers: dict[str, str],
                     decoder: StreamDecoder) -> StreamFacts:
        """Send one POST and wait until its response has been fully consumed; a 200 body goes
        to `decoder`. The start, the status and a non-200 body's first bytes are stamped on
        `decoder.facts` (also when this raises, so a failure keeps them), which is returned.
        The body may be fragments (e.g. per-message JSON kept by the caller), written with one
        vectored write instead of being joined into a copy."""
        if self._sem is not None:
            async with self._sem:
                return await self._stream(url, body, headers, decoder)
        return await self._stream(url, body, headers, decoder)

    async def _stream(self, url: str, body: RequestBody, headers: dict[str, str],
                      decoder: StreamDecoder) -> StreamFacts:
        t = self.target(url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = t.head + f"{extra}Content-Length: {body.size}\r\n\r\n".encode("latin-1")
        loop = asyncio.get_running_loop()
        facts = decoder.facts
        deadline = perf_ns() + self._request_ns  # the whole request, connect and resend too
        for attempt in range(2):
            facts.start_ns = decoder.t0 = perf_ns()  # kept if the connection cannot be made
            conn, reused = await self._acquire(t, deadline)
            # the start is stamped once a connection is in hand, right before the write: a
            # new connection's handshake and the server's accept queue are not the server's
            # time to first token (stamped before them, the 1024 first requests of a run
            # starting at once read +0.9-1.1 s too high at p50, bench/fidelity.py); they
            # show in dispatch_lag_ms instead, and preconnect() keeps them out of the first wave
            facts.start_ns = decoder.t0 = perf_ns()
            resp = Response(decoder, loop.create_future(), body)
            conn.resp = resp
            self._busy.add(conn)
            ok = False
            try:
                await conn.send(head, body, self.cfg.timeout_s, deadline)
                await self._wait(resp, deadline)
                ok = True
                return facts
            except Stale as exc:
                if reused and attempt == 0:
                    continue  # the server had closed the idle connection: resend once
                raise HTTPError("reset", str(exc)) from None
            finally:
                if resp.status >= 200:  # not an interim 1xx head
                    facts.status = resp.status
                if resp.err_body:
                    facts.error_body = b"".join(resp.err_body)[:300]
                if resp.retry_after is not None:  # a 429 or 503 said when to come back
                    facts.retry_after_s = retry_after_s(resp.retry_after)
                self._release(t, conn, ok and resp.keep_alive)
        raise AssertionError("unreachable")

    async def _wait(self, resp: Response, deadline_ns: int) -> None:
        """Await the response; fail with `timeout` after timeout_s without a byte, or at the
        request's deadline however steadily bytes come (one timer either way: nothing per
        chunk)."""
        limit = self.cfg.timeout_s
        loop = asyncio.get_running_loop()
        start = perf_ns()
        handle = None

        def check() -> None:
            nonlocal handle
            if resp.done.done():
                return
            now = perf_ns()
            idle = (now - (resp.last_rx or start)) / 1e9
            left = (deadline_ns - now) / 1e9
            if idle >= limit or left <= 0:
                resp.keep_alive = False
                resp.done.set_exception(HTTPError("timeout", (
                    f"no data for {limit:g} s (--timeout)" if idle >= limit else
                    f"not complete within {self.cfg.request_timeout_s:g} s (--request-timeout)")))
            else:
                handle = loop.call_later(min(limit - idle, left), check)

        handle = loop.call_later(min(limit, (deadline_ns - start) / 1e9), check)
        try:
            await resp.done
        finally:
            handle.cancel()
