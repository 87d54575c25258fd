"""Per-lane back-off after connection failures: a server that cannot be reached (down,
restarting) is not hammered.

Without it each lane sent its next request the moment a connect failed: a 3 s server restart
became 17,392 connect attempts (5.6k/s), 15.6 MB of records and a 98.9% error rate. A lane
whose request could not connect waits BASE_S, then twice that after each further failure, at
most MAX_S (2 s), with jitter (half to all of it, so lanes do not come back in lock-step), as the
circuit breakers of kv-cache-tester and inference-perf do; the first request the server
answers resets it. The waits are counted (summary.json `client.backoff_s`), and
`metrics.outages` reports the outage itself as one event.
"""
from __future__ import annotations

import random

BASE_S = 0.1  # the first wait after a connect failure
MAX_S = 2.0  # the longest: a restarted server is found again within this


class Backoff:
    def __init__(self, seed: int = 0) -> None:
        self._failures: dict[int, int] = {}
        self._rng = random.Random(seed)

    def failed(self, lane: int) -> float:
        """A connect failure on `lane`: the seconds it waits before its next request."""
        n = self._failures.get(lane, 0)
        self._failures[lane] = n + 1
        cap = min(MAX_S, BASE_S * 2.0 ** min(n, 32))
        return cap * (0.5 + 0.5 * self._rng.random())

    def answered(self, lane: int) -> None:
        """The server answered a request of `lane`: no back-off any more."""
        self._failures.pop(lane, None)
