"""A deliberately minimal SSE client (raw aiohttp) for the simulator's own tests and benchmark.

Independent of agentx's real client on purpose: the simulator is checked against what plain
bytes on the wire say, and the throughput benchmark measures the server, not our client.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


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
    res = StreamResult()
    res.sent_ns = time.perf_counter_ns()
    try:
        async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json",
                                                                      **(headers or {})}) as r:
            res.headers_ns = time.perf_counter_ns()
            res.status = r.status
            if r.status != 200 or not r.headers.get("Content-Type", "").startswith("text/event-stream"):
                raw = await r.read()
                try:
                    res.body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    res.body = raw
                return res
            buf = b""
            async for data in r.content.iter_any():
                t = time.perf_counter_ns()
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if not ev.startswith(b"data: "):
                        continue
                    payload = ev[6:]
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
