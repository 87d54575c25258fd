"""Ground-truth log: one JSON line per request with the exact send time of every chunk.

Times are `time.perf_counter_ns()` of the simulator process (CLOCK_MONOTONIC on Linux, so
comparable with a client's perf_counter_ns on the same machine), plus the arrival in
`time.time_ns()` for wall-clock alignment. A chunk's time is taken immediately before its
bytes are handed to the socket. Format documented in docs/simulator.md §Truth log.
"""
from __future__ import annotations

from typing import IO

import orjson

from .request import SimRequest


class TruthLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._f: IO[bytes] | None = open(path, "ab", buffering=1 << 16)

    def write(self, record: dict) -> None:
        if self._f is not None:
            self._f.write(orjson.dumps(record) + b"\n")

    def request(self, req: SimRequest, chat: bool, stream: bool, chunks: list, finish: str | None,
                fault: str | None, headers_ns: int) -> None:
        """The line of one request (once: later calls for it are ignored). `chunks` holds
        [send time, tokens] pairs; headers_ns is when the response headers went out (0: none)."""
        if req.logged:
            return
        first = next((t for t, n in chunks if n > 0), None)
        self.write({
            "request_id": req.rid, "session_id": req.session, "endpoint": "chat" if chat else "completions",
            "stream": stream, "arrival_wall_ns": req.arrival_wall_ns, "arrival_ns": req.arrival_ns,
            "received_ns": req.received_ns or None,
            "headers_ns": headers_ns or None, "scheduled_ns": req.scheduled_ns or None, "first_chunk_ns": first,
            "chunks": chunks, "prompt_tokens": req.prompt_len, "cached_tokens_device": req.cached_device,
            "cached_tokens_host": req.cached_host, "completion_tokens": req.num_out, "max_tokens": req.max_tokens,
            "preemptions": req.preemptions, "finish": finish, "fault": fault})
        req.logged = True

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
