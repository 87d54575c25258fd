"""When a request's first bytes were read off its socket (the truth log's `received_ns`).

aiohttp hands a request to its handler only after its protocol parsed the bytes, queued the
message and a handler task got its turn: on a busy server several loop iterations, tens of ms
at a thousand streams. That wait is the server's own front-end queue. Stamped only in the
handler it looks like the client's send delay; stamped here it is attributed to the server,
where vLLM's front end would put it too (its TTFT also includes its API server's queue).

Each connection gets a thin protocol in front of aiohttp's `RequestHandler` that stamps the
first read after the previous request claimed its stamp. The handler claims it once the body
is read (`take`), so the body's later reads never stamp the next request. HTTP/1.1 clients
here do not pipeline; a pipelined request would get its predecessor's later read time.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

_now = time.perf_counter_ns


class ReceiveStamps:
    """First-read stamp per connection (transport), claimed once per request."""

    def __init__(self) -> None:
        self._first: dict[asyncio.BaseTransport, int] = {}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """Protocol factory for `loop.create_server` wrapping aiohttp's (`runner.server`)."""
        return lambda: _Stamped(inner(), self._first)

    def take(self, transport: asyncio.BaseTransport | None) -> int | None:
        """The stamp of the request being handled on `transport`, once; None if unknown."""
        if transport is None:
            return None
        return self._first.pop(transport, None)


class _Stamped(asyncio.Protocol):
    """Forwards every protocol call to aiohttp's handler; stamps reads on the way."""

    __slots__ = ("inner", "first", "tr")

    def __init__(self, inner: asyncio.Protocol, first: dict) -> None:
        self.inner = inner
        self.first = first
        self.tr: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.tr not in self.first:
            self.first[self.tr] = _now()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.first.pop(self.tr, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
