"""The seeded workload of the twin tests (tests/test_vllm_lazy_tier.py,
tests/test_vllm_scheduler_twin.py): sessions that grow their prompt turn by turn."""
from __future__ import annotations

import random


class GrowingSessions:
    """Sessions starting with a shared two-block system prompt; each turn adds 1-3 blocks and a
    partial one of random tokens to the session's prompt. A full block's label names its content:
    `sys.I` for the system prompt's, `sS.I` for block I of session S."""

    def __init__(self, rng: random.Random, block_size: int) -> None:
        self.rng, self.bs = rng, block_size
        self.system = [rng.randrange(1000, 30000) for _ in range(2 * block_size)]
        self.streams: dict[int, list[int]] = {}
        self.turn: dict[int, int] = {}
        self._serial = iter(range(10**6))

    def new_session(self) -> int:
        s = next(self._serial)
        self.streams[s], self.turn[s] = list(self.system), 0
        return s

    def next_request(self, s: int) -> tuple[str, list[int], list[str]]:
        """Session `s`'s next turn: its request id, prompt tokens and full blocks' labels."""
        rng, bs = self.rng, self.bs
        toks = self.streams[s]
        toks += [rng.randrange(1000, 30000) for _ in range(rng.randint(1, 3) * bs + rng.randint(1, bs - 1))]
        rid = f"s{s}t{self.turn[s]}"
        self.turn[s] += 1
        return rid, list(toks), [("sys" if i < 2 else f"s{s}") + f".{i}" for i in range(len(toks) // bs)]

    def tokens(self, s: int) -> int:
        """Tokens of session `s`'s prompt so far."""
        return len(self.streams[s])
