"""The /metrics scraper in a child process, beside the benchmark's event loop.

A scrape costs 10-40 ms of Python: the HTTP read, then parsing a ~50 kB page (~30 ms for
vLLM's, tests/data/vllm-samples/metrics_after.txt), with thousands of objects allocated. In
a thread of the benchmark process that work holds the GIL and triggers the process's garbage
collections, and the loop that timestamps requests waits for both: 20-50 ms stalls every
scrape in token-exact runs (`bench/token_exact_lag.py --stalls 20`, with and without
`--scrape-interval 0`). In a child process none of it reaches the loop.

Same pattern as the simulator's child (sim/embedded.py): a plain `python -c` child, so no
caller needs a `__main__` guard. Its stdin carries the settings (the Authorization header
included: never on a command line or in a file) and then stays open as its lifeline; closing
it (stop(), or this process dying) makes the child take the final scrape, send its state
back on stdout and exit. The child ignores SIGINT: a Ctrl-C drains the run, and the final
scrape comes after that drain. The child writes metrics.jsonl itself, one line per scrape,
and runs at nice 10: on a client host short of cores its parsing waits, not the client or a
local server (a scrape's timestamp is its own HTTP round trip's midpoint either way).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ..aio import new_event_loop
from ..child_process import spawn_python
from .prom import Snapshot
from .scraper import MetricsScraper

_LEN = struct.Struct("<Q")
CHILD_SLACK_S = 10.0  # the child's start-up and a parse of a MAX_PAGE page, beyond the timeout


def _write(out: IO[bytes], obj: Any) -> None:
    blob = pickle.dumps(obj)
    out.write(_LEN.pack(len(blob)) + blob)
    out.flush()


def _read(src: IO[bytes]) -> Any:
    head = src.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the scraper process ended without an answer")
    return pickle.loads(src.read(_LEN.unpack(head)[0]))


class ScraperProcess:
    """A MetricsScraper in a child process: `await start()` (then `first` is the baseline
    scrape), `await stop()` (the final scrape), then `compute()` as MetricsScraper's. A child
    that fails is reported as the scraper's own errors: scraping never ends a run."""

    def __init__(self, url: str, interval_s: float = 5.0, headers: dict | None = None,
                 timeout_s: float = 10.0, out_path: str | Path | None = None) -> None:
        self._args = {"url": url, "interval_s": interval_s, "headers": dict(headers or {}),
                      "timeout_s": timeout_s,
                      "out_path": str(out_path) if out_path is not None else None}
        self._proc: subprocess.Popen | None = None
        self.first: Snapshot | None = None
        # the child's MetricsScraper once stopped; until then a local stand-in for errors
        self.scraper = MetricsScraper(None, url, interval_s, timeout_s=timeout_s)

    def _bound(self) -> float:
        """How long the child may take to answer: its scrape is bounded by the timeout
        (--connect-timeout) and its parse by MAX_PAGE; the rest is its start-up."""
        return self._args["timeout_s"] + CHILD_SLACK_S

    async def start(self) -> None:
        self._proc = p = spawn_python(  # a Ctrl-C while it starts is the parent's to handle
            "from agentx.scrape.process import _child_main; _child_main()")
        try:
            _write(p.stdin, self._args)
            self.first = await asyncio.wait_for(asyncio.to_thread(_read, p.stdout),
                                                self._bound())
        except (OSError, EOFError, pickle.UnpicklingError, asyncio.TimeoutError) as exc:
            self._failed(exc)
            if isinstance(exc, asyncio.TimeoutError):  # its read ends with the child
                self._proc = None
                p.kill()
                await asyncio.to_thread(p.wait)
                p.stdout.close()
        self.scraper.first = self.first

    async def stop(self) -> None:
        p = self._proc
        if p is None:
            return
        self._proc = None
        try:
            p.stdin.close()
            scraper = await asyncio.wait_for(asyncio.to_thread(_read, p.stdout), self._bound())
            if isinstance(scraper, MetricsScraper):
                self.scraper = scraper
        except (OSError, EOFError, pickle.UnpicklingError, asyncio.TimeoutError) as exc:
            self._failed(exc)
            p.kill()  # a child past its bound does not hold the run's end
        finally:
            try:
                await asyncio.to_thread(p.wait, 10.0)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
            p.stdout.close()

    def _failed(self, exc: BaseException) -> None:
        self.scraper.n_errors += 1
        self.scraper.errors.append({"t": 0.0, "url": self.scraper.url,
                                    "error": f"scraper process: {type(exc).__name__}: {exc}"})

    def compute(self, model_name: str | None = None) -> dict:
        return self.scraper.compute(model_name)


def _child_main() -> None:
    """The child: read the settings, scrape until stdin closes, send the scraper back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # yield the cores to the client and a local server
        os.nice(10)
    src, out = sys.stdin.buffer, sys.stdout.buffer
    args = _read(src)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    threading.Thread(target=lambda: (src.read(), loop.call_soon_threadsafe(closed.set)),
                     daemon=True).start()

    async def main() -> None:
        scraper = MetricsScraper(None, args["url"], args["interval_s"], args["headers"],
                                 args["timeout_s"], parse_in_thread=False,
                                 out_path=args["out_path"])
        await scraper.start()
        _write(out, scraper.first)
        await closed.wait()
        await scraper.stop()
        _write(out, scraper)

    try:
        loop.run_until_complete(main())
    except (BrokenPipeError, KeyboardInterrupt):  # the parent is gone: nobody to answer
        pass
    finally:
        loop.close()
