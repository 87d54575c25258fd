"""Speculative-decoding acceptance, following vLLM's synthetic rejection sampler.

vLLM (`rejection_sample_method: synthetic`) takes per-position *unconditional* rates p1..pK
(non-increasing; p_i = probability that the first i drafts are all accepted), or a mean
acceptance length L that it resolves to the minimum-variance schedule
p_i = clip(L - i, 0, 1) (e.g. L=2.6, K=3 -> [1.0, 0.6, 0.0]; vLLM's own unit test, and the
H200 measurement in docs/references.md §5: L=2.5 accepted 976/509/0 of 976 drafts per position).
One uniform draw u per request-step accepts the prefix {i : u < p_i}, which realises exactly
those marginals, so E[accepted] = sum(p) and AL = 1 + accepted/drafts = 1 + sum(p).

Without a synthetic setting the simulator still needs *some* acceptance: it uses a
geometric-like decay p_i = a^i with a = 0.8 (mean AL for K=3 of 1+0.8+0.64+0.51 = 2.95),
in line with typical EAGLE3 acceptance on coding prompts (documented in docs/simulator.md).
"""
from __future__ import annotations

import random
from typing import Sequence

DEFAULT_DECAY = 0.8


def rates_from_length(length: float, k: int) -> list[float]:
    """vLLM's minimum-variance schedule for a mean acceptance length (counting the bonus token)."""
    if k <= 0:
        return []
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"acceptance length {length} outside [1, {k + 1}]")
    return [min(1.0, max(0.0, length - i)) for i in range(1, k + 1)]


def default_rates(k: int, decay: float = DEFAULT_DECAY) -> list[float]:
    return [decay ** i for i in range(1, k + 1)]


class Acceptance:
    """Draws the number of accepted drafts per request-step."""

    def __init__(self, k: int, rates: Sequence[float], seed: int = 0) -> None:
        self.k = k
        self.rates = list(rates)
        if len(self.rates) != k:
            raise ValueError("need one rate per draft position")
        self._rng = random.Random(seed)
        # number of leading rates equal to 1.0 are accepted without a draw
        self._sure = sum(1 for r in self.rates if r >= 1.0)

    @property
    def mean_length(self) -> float:
        return 1.0 + sum(self.rates)

    def draw(self) -> int:
        rates = self.rates
        u = self._rng.random()
        n = self._sure
        k = self.k
        while n < k and u < rates[n]:
            n += 1
        return n
