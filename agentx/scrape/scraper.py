"""Periodic /metrics scraper that never takes the run down with it.

Scrapes at start, every ``interval_s`` and at stop. A failed scrape (refused
connection, HTTP error, timeout, unparseable text) is recorded in ``errors``
and the run goes on; the validator reports missing metrics instead.

A scrape costs 10-40 ms of Python (HTTP, then parsing a 50 KB page), which on the
event loop that timestamps streamed tokens delays every chunk arriving meanwhile: runs
scrape from a child process (process.py), which sends this object back when stopped.

With ``out_path`` each successful scrape is also appended to that file (metrics.jsonl) as one
complete line, one write(2) each, as it is taken: a run killed mid-way keeps its series.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from agentx.aio import cancel_and_wait
from agentx.records import write_line
from agentx.scrape import server_metrics as sm
from agentx.scrape.prom import SampleKey, Snapshot, parse_metrics
from agentx.urls import redact_url, scrub

# Short keys for the time series kept in results → (sample name, how engines combine).
SERIES_KEYS: dict[str, tuple[str, str]] = {
    "running": (sm.RUNNING, "sum"),
    "waiting": (sm.WAITING, "sum"),
    "kv_usage": (sm.KV_USAGE, "mean"),
    "prompt_tokens": (sm.PROMPT_TOKENS, "sum"),
    "prompt_cached": (sm.PROMPT_CACHED, "sum"),
    "generation_tokens": (sm.GEN_TOKENS, "sum"),
    "prefix_hits": (sm.PREFIX_HITS, "sum"),
    "prefix_queries": (sm.PREFIX_QUERIES, "sum"),
    "external_hits": (sm.EXT_HITS, "sum"),
    "external_queries": (sm.EXT_QUERIES, "sum"),
    "preemptions": (sm.PREEMPTIONS, "sum"),
    "spec_drafts": (sm.SPEC_DRAFTS, "sum"),
    "spec_draft_tokens": (sm.SPEC_DRAFT_TOKENS, "sum"),
    "spec_accepted": (sm.SPEC_ACCEPTED, "sum"),
}

MAX_ERRORS_KEPT = 100
# the largest /metrics page read, 80 times vLLM's ~50 kB (tests/data/vllm-samples/
# metrics_after.txt): parsing costs ~0.6 s of Python per MB, so a 312 MB page held a run for
# over a minute and 1.9 GB. Beyond it the scrape fails (counted) and the rest is not read.
MAX_PAGE = 4 << 20


def metrics_url(url: str) -> str:
    """Accept a server base URL or a full /metrics URL."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


async def _read_page(resp: aiohttp.ClientResponse) -> str:
    """The page's text, at most MAX_PAGE bytes (else an error: the rest is not read); the
    session's total timeout (--connect-timeout) bounds the time."""
    size = resp.content_length
    if size is not None and size > MAX_PAGE:
        raise RuntimeError(f"page of {size} bytes, over the {MAX_PAGE >> 20} MiB a scrape reads")
    parts, n = [], 0
    async for part in resp.content.iter_chunked(1 << 16):
        n += len(part)
        if n > MAX_PAGE:
            raise RuntimeError(f"page over the {MAX_PAGE >> 20} MiB a scrape reads")
        parts.append(part)
    return b"".join(parts).decode(resp.charset or "utf-8", "replace")


def _series_sample(name: str) -> bool:
    """Samples kept in the periodic series: everything but histogram buckets."""
    return not name.endswith("_bucket")


class MetricsScraper:
    """Start/periodic/stop scrapes of a Prometheus endpoint.

    ``first`` / ``last`` are the scrapes taken by ``start()`` / ``stop()``
    (None if that scrape failed); ``series`` holds every successful scrape in
    order, bucket samples dropped to bound memory on long runs. ``available``
    is True once any scrape succeeded. ``session`` may be None: the scraper
    then owns a small session of its own, which also keeps scrapes out of a
    load session whose connection pool is sized to the benchmark concurrency.
    """

    def __init__(self, session: aiohttp.ClientSession | None, url: str,
                 interval_s: float = 5.0, headers: dict | None = None,
                 timeout_s: float = 10.0, parse_in_thread: bool = True,
                 out_path: str | Path | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.url = metrics_url(url)
        self.interval_s = interval_s
        self.headers = dict(headers or {})
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._own_session = session is None
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None
        self.series: list[Snapshot] = []
        self.errors: list[dict] = []
        self.n_errors = 0
        self.n_scrapes = 0
        self._task: asyncio.Task | None = None
        self._keys: dict[SampleKey, SampleKey] = {}
        self._parse_in_thread = parse_in_thread  # False when already off the benchmark loop
        self._out = None
        if out_path is not None:  # appending: the GPU sampler (scrape/gpu.py) writes there too
            open(out_path, "wb").close()
            self._out = open(out_path, "ab", buffering=0)

    def __getstate__(self) -> dict:
        """What a scrape process sends back: the results, not its session, task, file or
        headers (which may hold an API key)."""
        state = dict(self.__dict__)
        state.update(_session=None, _task=None, _out=None, headers={})
        return state

    @property
    def available(self) -> bool:
        return bool(self.series)

    async def scrape_once(self) -> Snapshot | None:
        """One scrape; the full Snapshot or None (error recorded)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self.n_scrapes += 1
        t0 = time.monotonic()
        wall0 = time.time()
        try:
            async with self._session.get(self.url, headers=self.headers,
                                         timeout=self.timeout) as resp:
                body = await _read_page(resp)
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {body[:200].strip()}")
            t1 = time.monotonic()
            mid = (t1 - t0) / 2  # best guess of when the server rendered the page
            if self._parse_in_thread:
                snap = await asyncio.to_thread(parse_metrics, body, t0 + mid, wall0 + mid)
            else:
                snap = parse_metrics(body, t0 + mid, wall0 + mid)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # scrape failures must never end the run
            self._record_error(t0, exc)
            return None
        self.series.append(snap.reduced(_series_sample, self._keys))
        if self._out is not None:
            write_line(self._out, orjson.dumps(self._row(self.series[-1])) + b"\n")
        return snap

    def _record_error(self, t: float, exc: BaseException) -> None:
        self.n_errors += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            msg = str(exc) or type(exc).__name__
            self.errors.append({"t": t, "url": redact_url(self.url),
                                "error": scrub(f"{type(exc).__name__}: {msg}", self.url)})

    async def start(self) -> None:
        """Take the baseline scrape and begin periodic scraping."""
        self.first = await self.scrape_once()
        self._task = asyncio.create_task(self._loop(), name="metrics-scraper")

    async def _loop(self) -> None:
        next_t = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            await self.scrape_once()
            # drift-free schedule; if a scrape overran, go again right away once
            next_t = max(next_t + self.interval_s, time.monotonic())

    async def stop(self) -> None:
        """Stop periodic scraping, take the final scrape, close an owned session."""
        await cancel_and_wait(self._task)
        self._task = None
        self.last = await self.scrape_once()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
        if self._out is not None:
            self._out.close()

    def compute(self, model_name: str | None = None) -> dict:
        """``server_metrics`` for the scraped window (see server_metrics.compute)."""
        out = sm.compute(self.first, self.last, self.series, model_name=model_name)
        # the URL's user:password@ never reaches summary.json (a token in the URL is a key)
        out["scrape"] = {"url": redact_url(self.url), "interval_s": self.interval_s,
                         "attempts": self.n_scrapes, "errors": self.n_errors}
        return out

    def series_json(self, keys: Sequence[str] | None = None) -> list[dict]:
        """The time series for results: one dict per scrape.

        ``t`` is seconds since the first successful scrape, ``wall`` Unix time.
        ``keys`` picks short names from SERIES_KEYS (default: all); any other
        key is read as a raw sample name summed over label sets. A value is
        None when that scrape did not expose it.
        """
        return [self._row(snap, keys) for snap in self.series]

    def _row(self, snap: Snapshot, keys: Sequence[str] | None = None) -> dict:
        row: dict = {"t": round(snap.t - self.series[0].t, 3), "wall": snap.wall}
        for key in SERIES_KEYS if keys is None else keys:
            name, how = SERIES_KEYS.get(key, (key, "sum"))
            row[key] = snap.mean(name) if how == "mean" else snap.sum(name)
        return row
