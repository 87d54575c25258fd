"""Prompt -> token ids for the simulator, with the client's BuiltinTokenizer and chat template.

Agentic sessions resend the whole growing conversation every turn, so re-tokenising 100k+
tokens per request would dominate the simulator's CPU. The ChatML-like template renders each
message independently (`<|im_start|>role\\n ... <|im_end|>\\n`), so the token ids of a
conversation are the concatenation of per-message ids; those are cached by message content
(LRU, bounded by total tokens). `check_concat()` lets a test prove the equivalence.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from ..tokens.tokenizer import BuiltinTokenizer
from ..tokens.words import WORDS

_EMPTY = np.zeros(0, dtype=np.uint32)


class PromptEncoder:
    def __init__(self, cache_tokens: int = 64_000_000) -> None:
        self.tok = BuiltinTokenizer(WORDS)
        self._cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._cached_tokens = 0
        self._limit = cache_tokens
        self._gen = np.asarray(self.tok.encode(self.tok.apply_chat_template([], add_generation_prompt=True)),
                               dtype=np.uint32)

    def _message(self, m: dict, kwargs: dict) -> np.ndarray:
        content = m.get("content")
        key = (m.get("role"), content if isinstance(content, str) else repr(content),
               m.get("reasoning") or m.get("reasoning_content"))
        ids = self._cache.get(key)
        if ids is not None:
            self._cache.move_to_end(key)
            return ids
        text = self.tok.apply_chat_template([m], add_generation_prompt=False, **kwargs)
        ids = np.asarray(self.tok.encode(text), dtype=np.uint32)
        if len(ids) >= 64:  # tiny messages are cheaper to re-encode than to cache
            self._cache[key] = ids
            self._cached_tokens += len(ids)
            while self._cached_tokens > self._limit and self._cache:
                _, old = self._cache.popitem(last=False)
                self._cached_tokens -= len(old)
        return ids

    def chat(self, messages: list[dict], add_generation_prompt: bool = True,
             template_kwargs: dict[str, Any] | None = None) -> np.ndarray:
        kwargs = template_kwargs or {}
        parts = [self._message(m, kwargs) for m in messages]
        if add_generation_prompt:
            parts.append(self._gen)
        return np.concatenate(parts) if parts else _EMPTY

    def text(self, prompt: str) -> np.ndarray:
        return np.asarray(self.tok.encode(prompt), dtype=np.uint32)

    def check_concat(self, messages: list[dict], add_generation_prompt: bool = True) -> bool:
        """True when per-message encoding equals encoding the whole rendered template."""
        whole = self.tok.encode(self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))
        return whole == self.chat(messages, add_generation_prompt).tolist()


def output_words() -> list[str]:
    """Generated text is drawn from these: each is exactly one BuiltinTokenizer token and needs no JSON escaping."""
    return [" " + w for w in WORDS if w.isascii() and w.isalnum()]
