"""Deterministic text blocks: (namespace, hash_id) -> text of an exact token count.

A block is a run of single-token words, each written with one leading space, broken into
code-like lines by newline tokens, ending in a newline (never two in a row). Because every word is one
token and the newline never merges with its neighbours, the token count of any concatenation
of blocks is the sum of the blocks' counts, for the built-in tokenizer and for byte-level BPE
tokenizers restricted to single-token words (see `TokenModel`).

Blocks are windows of one shared "tape": a fixed pseudo-random text of TAPE_TOKENS tokens
(lines of 5-13 words), built once per vocabulary and process. A block's seed picks the
window, so making a block is one string slice (no per-word generation): a 300k-token prompt
builds cold in a few ms, and the text of thousands of long sessions costs only what their
messages hold, not a per-block cache. Blocks too long for a window are generated word by word.
"""
from __future__ import annotations

import hashlib
import random
from array import array
from typing import Iterator, Sequence

import numpy as np

TAPE_TOKENS = 1 << 20
TAPE_SEED = 0x5EED_B10C
_TAPES: dict[tuple[str, ...], "_Tape"] = {}


def stable_seed(*parts: object) -> int:
    """A process-independent 64-bit seed (Python's hash() is salted per process)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """mix64 over a uint64 array (wrapping arithmetic: identical on every platform)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class _Tape:
    """n tokens of text: lines of 5-13 words separated by single newlines; starts[i] is the
    char offset of token i. Pure integer hashing (no RNG library), so every process and host
    builds the same tape."""

    __slots__ = ("text", "starts", "newline", "index", "n")

    def __init__(self, words: Sequence[str], n: int = TAPE_TOKENS) -> None:
        nw = len(words)
        n_lines = n // 5 + 1
        line_len = 5 + (mix64_array(np.arange(n_lines, dtype=np.uint64) + np.uint64(TAPE_SEED))
                        % np.uint64(9)).astype(np.int64)
        nl_pos = np.cumsum(line_len + 1) - 1  # the newline after each line
        nl_pos = nl_pos[nl_pos < n]
        # word i is drawn with weight 1/len(i)^2 (integer weights: exact everywhere): about
        # 4.8 bytes per token with the built-in vocabulary instead of 5.9 uniformly, nearer
        # the ~4 of real BPE tokenizers on code, so bodies and histories are not inflated
        weights = np.array([max(1, 10**6 // len(w) ** 2) for w in words], dtype=np.int64)
        cum = np.cumsum(weights)
        h = mix64_array(np.arange(n, dtype=np.uint64) + np.uint64(TAPE_SEED * 3))
        idx = np.searchsorted(cum, (h % np.uint64(cum[-1])).astype(np.int64), side="right")
        idx[nl_pos] = nw  # the newline token
        table = np.array(list(words) + ["\n"], dtype=object)
        toks = table[idx]
        lens = np.array([len(w) for w in words] + [1], dtype=np.int64)[idx]
        starts = np.zeros(n + 1, dtype=np.uint32)
        np.cumsum(lens, out=starts[1:], dtype=np.uint32)
        newline = np.zeros(n, dtype=np.uint8)
        newline[nl_pos] = 1
        self.text = "".join(toks.tolist())
        self.starts = array("I", starts.tobytes())
        self.newline = bytes(newline)
        # word index of every token (len(words) = the newline): token-exact mode maps it to
        # the tokenizer's ids, so a block's ids are a slice, never a tokenizer call
        self.index = idx.astype(np.uint16 if nw < 65535 else np.uint32)
        self.n = n

    def offset(self, seed: int, count: int) -> int:
        """Start of the `count` consecutive tokens of `seed`: they neither start nor end with a
        newline."""
        nl = self.newline
        off = seed % (self.n - count - 32)
        while nl[off] or nl[off + count - 1]:  # newlines are >= 5 words apart: a few steps
            off += 1
        return off

    def window(self, seed: int, count: int) -> str:
        """The text of `offset(seed, count)`'s tokens."""
        off = self.offset(seed, count)
        s = self.starts
        return self.text[s[off]:s[off + count]]


def tape_for(words: Sequence[str]) -> _Tape:
    key = tuple(words)
    t = _TAPES.get(key)
    if t is None:
        t = _TAPES[key] = _Tape(key)
    return t


class BlockFactory:
    """Makes block texts for one vocabulary.

    `tokens_per_word` is 1 for exact tokenizers; a calibrated server-side ratio otherwise,
    in which case a block of n tokens gets round(n / ratio) words (approximate by design).
    """

    def __init__(self, words: Sequence[str], *, tokens_per_word: float = 1.0,
                 max_cached: int = 0) -> None:
        if len(words) < 16:
            raise ValueError("need at least 16 single-token words to synthesise text")
        self.words = [" " + w for w in words]
        self.tokens_per_word = tokens_per_word
        self._tape: _Tape | None = None
        self._max_window = TAPE_TOKENS // 4
        self._ns_seed: dict[str, int] = {}
        del max_cached  # blocks are slices of the tape: nothing worth caching

    @property
    def tape(self) -> _Tape:
        if self._tape is None:
            self._tape = tape_for(self.words)
        return self._tape

    def prepare(self) -> None:
        """Build the tape now (~0.2 s once per process) rather than in the first request."""
        _ = self.tape

    def _units(self, n_tokens: int) -> int:
        """Word+newline units that make n_tokens under this factory's ratio."""
        if self.tokens_per_word == 1.0:
            return n_tokens
        return max(1, round(n_tokens / self.tokens_per_word))

    def text(self, namespace: str, hash_id: object, n_tokens: int) -> str:
        """Text of n_tokens tokens for this (namespace, id); equal inputs give equal bytes."""
        if n_tokens <= 0:
            return ""
        return self._make(self.seed(namespace, hash_id), self._units(n_tokens))

    def seed(self, namespace: str, hash_id: object) -> int:
        """stable_seed for any id; for the common integer trace ids a per-namespace seed
        mixed with the id (a blake2b per block would cost more than making the block)."""
        if type(hash_id) is not int:
            return stable_seed(namespace, hash_id)
        return mix64(self.ns_base(namespace) ^ (hash_id & M64))

    def ns_base(self, namespace: str) -> int:
        """stable_seed(namespace), kept: every block of a namespace mixes it with its id."""
        base = self._ns_seed.get(namespace)
        if base is None:
            if len(self._ns_seed) > 65536:
                self._ns_seed.clear()
            base = self._ns_seed[namespace] = stable_seed(namespace)
        return base

    def _make(self, seed: int, units: int) -> str:
        """units-1 tokens (words and single newlines), then a closing newline; a one-unit
        block is a single word."""
        if units == 1:
            return self.words[seed % len(self.words)]
        if units - 1 <= self._max_window:
            return self.tape.window(seed, units - 1) + "\n"
        return self._generate(seed, units)

    def _generate(self, seed: int, units: int) -> str:
        """Word by word, for blocks longer than a tape window (never hit by 64-token blocks)."""
        table = (*self.words, "\n")
        return "".join([table[i] for i in self._generate_index(seed, units)])

    def _generate_index(self, seed: int, units: int) -> list[int]:
        """Word indices of `_generate`'s block (len(words) = a newline)."""
        rng = random.Random(seed)
        nw = len(self.words)
        out: list[int] = []
        line = 0
        line_len = rng.randint(5, 13)
        last = units - 2
        for i in range(units - 1):
            if line >= line_len and i < last:
                out.append(nw)
                line = 0
                line_len = rng.randint(5, 13)
            else:
                out.append(rng.randrange(nw))
                line += 1
        out.append(nw)
        return out

    @staticmethod
    def _blocks(ids: Sequence[object], n_tokens: int, block_size: int) -> Iterator[tuple[object, int]]:
        """(hash_id, tokens) of a span's consecutive blocks: `ids` extended with derived ids
        when they cover fewer tokens than asked, cut at the last block when more."""
        left = n_tokens
        i = 0
        while left > 0:
            take = min(block_size, left)
            yield (ids[i] if i < len(ids) else ("x", ids[-1] if ids else None, i)), take
            left -= take
            i += 1

    def span(self, namespace: str, ids: Sequence[object], n_tokens: int, block_size: int) -> str:
        """Text of exactly n_tokens from consecutive blocks `ids` (see `_blocks`)."""
        text = self.text
        return "".join([text(namespace, hid, take) for hid, take in self._blocks(ids, n_tokens, block_size)])

    def span_index(self, namespace: str, ids: Sequence[object], n_tokens: int,
                   block_size: int) -> np.ndarray:
        """Word indices (len(words) = a newline) of `span`'s tokens, one per token. With a
        tokenizer whose words are single tokens the span's token ids are a lookup of these, so
        token-exact mode builds prompts without tokenizing. Vectorised over blocks (same seeds
        and tape windows as `span`): a 130k-token span costs a few ms, not one Python step per
        block."""
        if self.tokens_per_word != 1.0:
            raise ValueError("span_index needs one token per word (an exact token model)")
        if n_tokens <= 0:
            return np.zeros(0, dtype=np.uint32)
        nb = -(-n_tokens // block_size)
        takes = np.full(nb, block_size, dtype=np.int64)
        takes[-1] = n_tokens - block_size * (nb - 1)
        seeds = self._seeds(namespace, ids, nb)
        tape, nw = self.tape, len(self.words)
        counts = takes - 1  # tape tokens of each block; its closing newline is added below
        win = (counts >= 1) & (counts <= self._max_window)
        off = np.zeros(nb, dtype=np.int64)
        if win.any():
            c = counts[win]
            o = (seeds[win] % (tape.n - c - 32).astype(np.uint64)).astype(np.int64)
            nl = np.frombuffer(tape.newline, dtype=np.uint8)
            bad = (nl[o] | nl[o + c - 1]).astype(bool)
            while bad.any():  # as _Tape.offset: step past newlines (>= 5 words apart)
                o[bad] += 1
                bad = (nl[o] | nl[o + c - 1]).astype(bool)
            off[win] = o
        ends = np.cumsum(takes)
        starts = ends - takes
        pos = np.arange(n_tokens, dtype=np.int64) + np.repeat(off - starts, takes)
        out = tape.index[np.minimum(pos, tape.n - 1)].astype(np.uint32)
        out[ends - 1] = nw  # every block of two or more tokens closes with a newline
        for j in np.flatnonzero(takes == 1):  # a one-token block is a single word
            out[starts[j]] = int(seeds[j]) % nw
        for j in np.flatnonzero(counts > self._max_window):  # longer than a tape window
            out[starts[j]:ends[j]] = self._generate_index(int(seeds[j]), int(takes[j]))
        return out

    def _seeds(self, namespace: str, ids: Sequence[object], nb: int) -> np.ndarray:
        """`seed` of each of a span's nb blocks (ids as `_blocks` extends them), vectorised
        for the common integer ids."""
        seeds = np.empty(nb, dtype=np.uint64)
        k = min(nb, len(ids))
        try:
            head = np.asarray(ids[:k]) if k else None
        except (ValueError, OverflowError, TypeError):  # tuple ids among them
            head = None
        if head is not None and head.ndim == 1 and head.dtype.kind in "iu":
            seeds[:k] = mix64_array(head.astype(np.uint64) ^ np.uint64(self.ns_base(namespace)))
        else:
            for j in range(k):
                seeds[j] = self.seed(namespace, ids[j])
        last = ids[-1] if len(ids) else None
        for j in range(k, nb):
            seeds[j] = self.seed(namespace, ("x", last, j))
        return seeds
