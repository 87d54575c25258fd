"""A run's instruments, started and stopped as one: the /metrics scraper (its own process, so
scrapes never queue behind benchmark requests) and the NVML sampler of this machine's GPUs at
the same cadence, both appending to metrics.jsonl. `async with Instruments(...) as inst:`;
after the block, `server_metrics(model)` and `gpu` (the sampler, or why there is none)."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..urls import redact_url
from .gpu import GpuSampler, say_once, server_on_this_host
from .server_metrics import kv_pool


@dataclass
class Instruments:
    """`interval_s` <= 0 turns both off. `headers`: the run's, of which only Authorization is
    sent with a scrape."""

    base_url: str
    interval_s: float
    headers: dict
    out_path: Path
    timeout_s: float = 10.0
    gpu_indices: Sequence[int] | None = None
    scraper: Any = field(default=None, init=False)
    gpu: GpuSampler | str = field(default="", init=False)

    @property
    def first(self) -> Any:
        """The baseline scrape, before any traffic (None: scraping off or it failed)."""
        return self.scraper.first if self.scraper else None

    @property
    def pool_tokens(self) -> int | None:
        """The server's KV pool in tokens, from the baseline scrape."""
        return kv_pool(self.first).get("kv_pool_tokens") if self.first is not None else None

    def server_metrics(self, model: str) -> dict | None:
        return self.scraper.compute(model) if self.scraper else None

    @property
    def gpu_rows(self) -> list[dict]:
        return [] if isinstance(self.gpu, str) else self.gpu.rows

    async def __aenter__(self) -> Instruments:
        if self.interval_s > 0:
            from .process import ScraperProcess

            auth = {k: v for k, v in self.headers.items() if k == "Authorization"}
            self.scraper = ScraperProcess(self.base_url.rstrip("/") + "/metrics",
                                          interval_s=self.interval_s, headers=auth,
                                          timeout_s=self.timeout_s, out_path=self.out_path)
            await self.scraper.start()
        self.gpu = self._gpu_sampler()  # after the scraper: both append to out_path
        if not isinstance(self.gpu, str):
            self.gpu.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.scraper:
            await self.scraper.stop()
        if not isinstance(self.gpu, str):
            await asyncio.to_thread(self.gpu.stop)

    def _gpu_sampler(self) -> GpuSampler | str:
        """NVML sampling of this machine's GPUs at the scrape cadence, or why not (a str)."""
        if self.interval_s <= 0:
            return "--scrape-interval 0 turns sampling off"
        if not server_on_this_host(self.base_url):
            return say_once(f"the server ({redact_url(self.base_url)}) is not on this machine, "
                            "whose GPUs NVML would read")
        return GpuSampler.open(self.interval_s, self.gpu_indices, self.out_path)
