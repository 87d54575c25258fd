"""Fault injection for the client's reliability tests: which fault (if any) hits a request.

A fault is chosen per request: the `X-Sim-Fault: <kind>` request header forces one (on-demand,
deterministic tests); otherwise with probability `fail_rate` a kind is drawn uniformly from
`fail_kinds`. What each kind does on the wire is implemented in respond.py and documented in
docs/simulator.md §Faults. Fault delays are real seconds (not divided by time_scale).
"""
from __future__ import annotations

import random

from .config import FAIL_KINDS

STATUS_KINDS = {"429": 429, "500": 500, "503": 503}
MESSAGES = {429: "The server is overloaded (simulated 429).", 500: "Internal server error (simulated 500).",
            503: "Service unavailable (simulated 503)."}


class FaultPlan:
    def __init__(self, rate: float, kinds: tuple[str, ...], seed: int = 0) -> None:
        self.rate = rate
        self.kinds = tuple(kinds) or FAIL_KINDS
        self._rng = random.Random(seed ^ 0x5EED)
        self.counts: dict[str, int] = {k: 0 for k in FAIL_KINDS}

    def pick(self, header: str | None) -> str | None:
        kind = None
        if header:
            kind = header.strip().lower()
            if kind not in FAIL_KINDS:
                kind = None
        elif self.rate > 0 and self._rng.random() < self.rate:
            kind = self._rng.choice(self.kinds)
        if kind is not None:
            self.counts[kind] += 1
        return kind
