"""Ground-truth log: one JSON line per request with the exact send time of every chunk.

Times are `time.perf_counter_ns()` of the simulator process (CLOCK_MONOTONIC on Linux, so
comparable with a client's perf_counter_ns on the same machine), plus the arrival in
`time.time_ns()` for wall-clock alignment. A chunk's time is taken immediately before its
bytes are handed to the socket. Format documented in docs/simulator.md §Truth log.
"""
from __future__ import annotations

from typing import IO

import orjson


class TruthLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._f: IO[bytes] | None = open(path, "ab", buffering=1 << 16)

    def write(self, record: dict) -> None:
        if self._f is not None:
            self._f.write(orjson.dumps(record) + b"\n")

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
