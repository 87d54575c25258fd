"""Deterministic text blocks: (namespace, hash_id) -> text of an exact token count.

A block is a run of single-token words, each written with one leading space, broken into
code-like lines by newline tokens, ending in a newline (never two in a row). Because every word is one
token and the newline never merges with its neighbours, the token count of any concatenation
of blocks is the sum of the blocks' counts, for the built-in tokenizer and for byte-level BPE
tokenizers restricted to single-token words (see `TokenModel`). Blocks are cached: a prompt is
a join of cached strings, never re-generated per turn.
"""
from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from typing import Sequence


def stable_seed(*parts: object) -> int:
    """A process-independent 64-bit seed (Python's hash() is salted per process)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class BlockFactory:
    """Makes and caches block texts for one vocabulary.

    `tokens_per_word` is 1 for exact tokenizers; a calibrated server-side ratio otherwise,
    in which case a block of n tokens gets round(n / ratio) words (approximate by design).
    """

    def __init__(self, words: Sequence[str], *, tokens_per_word: float = 1.0,
                 max_cached: int = 200_000) -> None:
        if len(words) < 16:
            raise ValueError("need at least 16 single-token words to synthesise text")
        self.words = [" " + w for w in words]
        self.tokens_per_word = tokens_per_word
        self._cache: OrderedDict[tuple, str] = OrderedDict()
        self._max = max_cached

    def _units(self, n_tokens: int) -> int:
        """Word+newline units that make n_tokens under this factory's ratio."""
        if self.tokens_per_word == 1.0:
            return n_tokens
        return max(1, round(n_tokens / self.tokens_per_word))

    def text(self, namespace: str, hash_id: object, n_tokens: int) -> str:
        """Text of n_tokens tokens for this (namespace, id); equal inputs give equal bytes."""
        if n_tokens <= 0:
            return ""
        key = (namespace, hash_id, n_tokens)
        cache = self._cache
        s = cache.get(key)
        if s is not None:
            cache.move_to_end(key)
            return s
        s = self._make(stable_seed(namespace, hash_id), self._units(n_tokens))
        cache[key] = s
        if len(cache) > self._max:
            cache.popitem(last=False)
        return s

    def _make(self, seed: int, units: int) -> str:
        """units-1 words broken into lines, then a closing newline. Never two newlines in a
        row (BPE tokenizers merge "\n\n"); a one-unit block is a single word."""
        rng = random.Random(seed)
        words = self.words
        nw = len(words)
        if units == 1:
            return words[rng.randrange(nw)]
        out: list[str] = []
        line = 0
        line_len = rng.randint(5, 13)
        last = units - 2
        for i in range(units - 1):
            if line >= line_len and i < last:
                out.append("\n")
                line = 0
                line_len = rng.randint(5, 13)
            else:
                out.append(words[rng.randrange(nw)])
                line += 1
        out.append("\n")
        return "".join(out)

    def span(self, namespace: str, ids: Sequence[object], n_tokens: int, block_size: int) -> str:
        """Text of exactly n_tokens from consecutive blocks `ids` (extended with derived ids
        when the ids cover fewer tokens than asked, cut at the last block when more)."""
        parts = []
        left = n_tokens
        i = 0
        while left > 0:
            hid = ids[i] if i < len(ids) else ("x", ids[-1] if ids else None, i)
            take = min(block_size, left)
            parts.append(self.text(namespace, hid, take))
            left -= take
            i += 1
        return "".join(parts)
