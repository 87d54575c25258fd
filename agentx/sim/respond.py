"""Writing a generation's response as the engine produces its tokens: the SSE stream (one
write per engine step, every chunk's send time kept for the truth log) or, without `stream`,
one JSON body at the end; and the mid-response faults (reset, stall, malformed) that act on
the wire. Which fault hits a request is sim/faults.py's choice; docs/simulator.md §Faults.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import time

import orjson
from aiohttp import web

from . import protocol as P
from .config import SimConfig
from .prompt import output_words
from .request import SimRequest
from .truthlog import TruthLog

JSON = "application/json"


class ResponseWriter:
    """Responses for one served model; `rng` picks where each answer starts in the word list
    (shared with the request parser, see parse.RequestParser)."""

    def __init__(self, cfg: SimConfig, rng: random.Random, truth: TruthLog | None) -> None:
        self.cfg, self.rng, self.truth = cfg, rng, truth
        self.model = cfg.model_name
        self.words = output_words()

    def log_truth(self, req: SimRequest, chat: bool, stream: bool, chunks: list, finish: str | None,
                  fault: str | None, headers_ns: int) -> None:
        if self.truth is not None:
            self.truth.request(req, chat, stream, chunks, finish, fault, headers_ns)

    def _reasoning_len(self, req: SimRequest, chat: bool, thinking: bool) -> int:
        return int(req.max_tokens * self.cfg.reasoning_fraction) if (chat and thinking) else 0

    def _words(self, start: int, n: int) -> str:
        w = self.words
        m = len(w)
        if n == 1:  # the common chunk: no generator
            return w[start % m]
        return "".join(w[(start + i) % m] for i in range(n))

    def _metrics(self, req: SimRequest) -> dict | None:
        if not self.cfg.per_request_metrics or not req.first_token_ns:
            return None
        queued = req.queued_ns or req.arrival_ns  # vLLM's queue time: from the engine core's queue
        return P.metrics_obj((req.first_token_ns - req.arrival_ns) / 1e6,
                             (req.last_token_ns - req.first_token_ns) / 1e6,
                             ((req.scheduled_ns or queued) - queued) / 1e6, req.num_out)

    def _cached(self, req: SimRequest) -> int | None:
        return req.cached_device + req.cached_host if self.cfg.prompt_tokens_details else None

    # ------------------------------------------------------------ stream: true
    async def stream(self, request: web.Request, reqs: list[SimRequest], rid: str, chat: bool, thinking: bool,
                     so: dict, fault: str | None) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                       "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
        except ConnectionError:  # the client left while the headers were held (slow-headers)
            return resp
        headers_ns = time.perf_counter_ns()
        created = int(time.time())
        include_usage = bool(so.get("include_usage", False))
        continuous = include_usage and bool(so.get("continuous_usage_stats", False))
        try:
            if len(reqs) == 1:
                await self._stream_one(resp, reqs[0], 0, rid, created, chat, thinking, continuous, fault, headers_ns)
            else:
                await asyncio.gather(*(self._stream_one(resp, r, i, rid, created, chat, thinking, continuous,
                                                        fault if i == 0 else None, headers_ns)
                                       for i, r in enumerate(reqs)))
            if include_usage:
                w = P.ChunkWriter(chat=chat, rid=rid, created=created, model=self.model,
                                  prompt_tokens=sum(r.prompt_len for r in reqs), continuous_usage=False)
                cached = None if self._cached(reqs[0]) is None else sum(self._cached(r) for r in reqs)
                final = w.final_usage(sum(r.num_out for r in reqs), cached, sum(r.created_cache for r in reqs),
                                      self._metrics(reqs[0]))
                await resp.write(final + P.DONE)
            else:
                await resp.write(P.DONE)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        return resp

    async def _stream_one(self, resp: web.StreamResponse, req: SimRequest, index: int, rid: str, created: int,
                          chat: bool, thinking: bool, continuous: bool, fault: str | None, headers_ns: int) -> None:
        w = P.ChunkWriter(chat=chat, rid=rid, created=created, model=self.model, prompt_tokens=req.prompt_len,
                          continuous_usage=continuous, index=index)
        n_reason = self._reasoning_len(req, chat, thinking)
        start_word = self.rng.randrange(len(self.words))
        chunks: list[list[int]] = []
        first = chat
        sent = 0
        mid = max(1, req.max_tokens // 2)
        fault_pending = fault in ("reset", "stall", "malformed")
        finish = None
        try:
            while finish is None:
                events = await req.next_events()
                parts, counts = [], []
                for n, fin in events:
                    if first:
                        parts.append(w.role())
                        counts.append(0)
                        first = False
                    r = max(0, min(n, n_reason - sent))
                    parts.append(w.tokens(self._words(start_word + sent + r, n - r), sent + n, fin,
                                          reasoning=self._words(start_word + sent, r) if r else ""))
                    counts.append(n)
                    sent += n
                    if fin is not None:
                        finish = fin
                t = time.perf_counter_ns()
                await resp.write(b"".join(parts))
                chunks.extend([t, c] for c in counts)
                if fault_pending and finish is None and sent >= mid:
                    fault_pending = False
                    if fault == "reset":
                        self.log_truth(req, chat, True, chunks, "abort", fault, headers_ns)
                        _reset(resp)
                        raise ConnectionResetError("simulated reset")
                    if fault == "stall":
                        await asyncio.sleep(self.cfg.stall_s)
                    elif fault == "malformed":
                        t = time.perf_counter_ns()
                        await resp.write(w.head.encode() + b'"choices":[{"index":0,"delta":{"content":\n\n')
                        chunks.append([t, 0])
        finally:
            if finish is None:
                self.log_truth(req, chat, True, chunks, "abort", fault, headers_ns)
        self.log_truth(req, chat, True, chunks, finish, fault, headers_ns)

    # ------------------------------------------------------------ stream: false
    async def complete(self, request: web.Request, reqs: list[SimRequest], rid: str, chat: bool, thinking: bool,
                       fault: str | None) -> web.StreamResponse:
        finishes = []
        for req in reqs:
            fin = None
            while fin is None:
                for _, f in await req.next_events():
                    fin = f or fin
            finishes.append(fin)
        created = int(time.time())
        if fault == "reset":
            _abort_transport(request.transport)
            self.log_truth(reqs[0], chat, False, [], "abort", fault, 0)
            return web.Response(status=500)
        if fault == "stall":
            await asyncio.sleep(self.cfg.stall_s)
        req = reqs[0]
        texts = []
        for r in reqs:
            start = self.rng.randrange(len(self.words))
            texts.append(self._words(start, r.num_out))
        if chat:
            n_reason = min(self._reasoning_len(req, chat, thinking), req.num_out)
            words = texts[0]
            # split on word boundaries: every word is one token with a leading space
            toks = words.split(" ")[1:]
            reasoning = "".join(" " + x for x in toks[:n_reason]) if n_reason else None
            content = "".join(" " + x for x in toks[n_reason:])
            body = P.chat_response(rid=rid, created=created, model=self.model, content=content, reasoning=reasoning,
                                   finish=finishes[0], prompt=req.prompt_len, n_out=req.num_out,
                                   cached=self._cached(req), created_cache=req.created_cache,
                                   metrics=self._metrics(req))
        else:
            cached = None if self._cached(req) is None else sum(self._cached(r) for r in reqs)
            body = P.completion_response(rid=rid, created=created, model=self.model, text=texts[0],
                                         finish=finishes[0], prompt=sum(r.prompt_len for r in reqs),
                                         n_out=sum(r.num_out for r in reqs), cached=cached,
                                         metrics=self._metrics(req))
            if len(reqs) > 1:
                d = orjson.loads(body)
                d["choices"] = [{**d["choices"][0], "index": i, "text": texts[i], "finish_reason": finishes[i]}
                                for i in range(len(reqs))]
                body = orjson.dumps(d)
        if fault == "malformed":
            body = body[: len(body) // 2]
        t = time.perf_counter_ns()
        resp = web.Response(body=body, content_type=JSON)
        for r in reqs:
            self.log_truth(r, chat, False, [[t, r.num_out]], r.finish, fault, 0)
        return resp


def _reset(resp: web.StreamResponse) -> None:
    """Abort a streaming response's connection with an RST, mid-stream."""
    tr = resp._req.transport if getattr(resp, "_req", None) is not None else None  # noqa: SLF001
    _abort_transport(tr)


def _abort_transport(tr) -> None:
    """Abort the TCP connection with an RST (SO_LINGER 0)."""
    if tr is None:
        return
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    tr.abort()
