"""Test-only helpers: hand-made traces, a free port, SSE splitting and a bare streaming client.

The bare client (`post_stream`) is deliberately independent of agentx's own client: the
simulator is checked against what the bytes on the wire say, not against our parser.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from agentx.client.sse import _data_of


def write_trace(path: Path, sessions: int = 6, turns: int = 8, think: float = 1.0,
                out: int = 20, subagent_at: int | None = None) -> Path:
    """Small hand-made sessions in the native trace format (not real data): each turn adds
    five 64-token blocks to a 39-block start; `subagent_at` spawns three-turn subagents."""
    path.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        reqs = []
        ids: list[int] = list(range(1, 40))
        for i in range(turns):
            ids = ids + list(range(1000 * (i + 1), 1000 * (i + 1) + 5))
            reqs.append({"t": float(i), "type": "n", "in": len(ids) * 64, "out": out,
                         "hash_ids": list(ids), "think_time": think, "api_time": 0.5})
            if subagent_at is not None and i == subagent_at:
                sub = [{"t": 0.0, "type": "n", "in": 3000 + 200 * j, "out": 10,
                        "hash_ids": list(range(1, 48 + 3 * j)), "think_time": 0.0}
                       for j in range(3)]
                reqs.append({"type": "subagent", "agent_id": f"a{s}", "t": float(i),
                             "system_tokens": 500, "tool_tokens": 1000, "requests": sub})
        doc = {"id": f"trace_{s:04d}", "block_size": 64, "system_tokens": 800,
               "tool_tokens": 1200, "requests": reqs}
        (path / f"trace_{s:04d}.json").write_text(json.dumps(doc))
    return path


async def serve_chat(handler: Any) -> tuple[web.AppRunner, str]:
    """A local aiohttp server with `handler` at POST /v1/chat/completions on a free port:
    (runner to clean up, base URL)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers run as processes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, tries: int = 300) -> None:
    """Poll `url`/health (0.1 s apart) until the server answers; a server process started by a
    test needs a moment to bind. Returns quietly after `tries`: the test's own requests fail."""
    for _ in range(tries):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return
        except OSError:
            time.sleep(0.1)


class SSESplitter:
    """Incremental SSE event splitter: bytes in, completed `data:` payloads out (CRLF,
    comments and multi-line data handled as the SSE spec says)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Return the payloads of the events completed by `data` (possibly none)."""
        buf = (self._buf + data).replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()  # the unfinished tail (b"" when data ended an event)
        return [p for p in map(_data_of, events) if p is not None]

    @property
    def pending(self) -> bytes:
        return self._buf


def sse_events(raw: bytes | str) -> list[dict]:
    """The JSON `data:` events of a whole SSE body, `[DONE]` left out."""
    if isinstance(raw, str):
        raw = raw.encode()
    return [orjson.loads(p) for p in SSESplitter().feed(raw) if p != b"[DONE]"]


@dataclass
class StreamResult:
    status: int = 0
    headers_ns: int = 0  # perf_counter_ns when the response headers arrived
    sent_ns: int = 0  # perf_counter_ns just before the request was sent
    events: list = field(default_factory=list)  # (t_ns, parsed JSON | None, raw bytes)
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None  # transport error (reset, ...)
    body: Any = None  # non-SSE response body (errors, non-streaming)

    @property
    def chunks(self) -> list[dict]:
        return [e[1] for e in self.events if e[1] is not None]

    def token_chunks(self) -> list[tuple[int, int]]:
        """(t_ns, tokens) for every chunk that carried tokens, from cumulative usage deltas."""
        out, prev = [], 0
        for t, obj, _ in self.events:
            if obj is None or not obj.get("choices"):
                continue
            u = obj.get("usage")
            if u is None:
                continue
            n = u["completion_tokens"] - prev
            prev = u["completion_tokens"]
            if n > 0:
                out.append((t, n))
        return out


async def post_stream(session: aiohttp.ClientSession, url: str, body: dict,
                      headers: dict | None = None) -> StreamResult:
    """POST `body`; collect each SSE event with the time its bytes arrived."""
    res = StreamResult()
    res.sent_ns = time.perf_counter_ns()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        async with session.post(url, data=orjson.dumps(body), headers=hdrs) as r:
            res.headers_ns = time.perf_counter_ns()
            res.status = r.status
            if r.status != 200 or not r.headers.get("Content-Type", "").startswith(
                    "text/event-stream"):
                raw = await r.read()
                try:
                    res.body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    res.body = raw
                return res
            splitter = SSESplitter()
            async for data in r.content.iter_any():
                t = time.perf_counter_ns()
                for payload in splitter.feed(data):
                    if payload == b"[DONE]":
                        res.done = True
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        obj = None
                    res.events.append((t, obj, payload))
    except (aiohttp.ClientError, ConnectionError) as e:
        res.error = type(e).__name__
    return res
