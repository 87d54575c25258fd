"""Tokenizers the prompt synthesiser and the simulator agree on.

`BuiltinTokenizer` is the deterministic tokenizer of the embedded simulator: a word with at
most one leading space is one token, every newline is one token, ChatML markers are one token
each. Its ChatML-like template puts exactly MESSAGE_OVERHEAD tokens around each message, so a
prompt's token count is the sum of its parts and the client can hit an exact count without
asking the server.

`HFTokenizer` wraps a local Hugging Face tokenizer directory (no hub access) with the same
small interface; its chat template is applied client-side for token-exact replay.
"""
from __future__ import annotations

import re
import zlib
from typing import Any, Protocol, Sequence

Message = dict[str, Any]

_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>|\n| ?[^\s<]+|<| |[^\S\n ]")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 1 << 17  # ids of words outside the known vocabulary are hashed into this space


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: list[Message], *, add_generation_prompt: bool = True,
                            **kwargs: Any) -> str: ...


def _content_text(content: Any) -> str:
    """OpenAI content may be a string or a list of parts; only text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


class BuiltinTokenizer:
    """Word-level tokenizer + ChatML template, shared by client synthesis and the simulator."""

    name = "agentx-builtin"
    # <|im_start|> role \n ... <|im_end|> \n
    MESSAGE_OVERHEAD = 5
    # <|im_start|> assistant \n
    GENERATION_PROMPT = 3

    def __init__(self, words: Sequence[str] = ()) -> None:
        self._ids: dict[str, int] = {}
        self._strs: dict[int, str] = {}
        for tok in (*SPECIALS, "\n", " ", "<"):
            self._add(tok)
        for w in words:
            self._add(w)
            self._add(" " + w)

    def _add(self, tok: str) -> int:
        tid = self._ids.get(tok)
        if tid is None:
            tid = len(self._ids)
            self._ids[tok] = tid
            self._strs[tid] = tok
        return tid

    def tokens(self, text: str) -> list[str]:
        return _TOKEN_RE.findall(text)

    def count(self, text: str) -> int:
        return len(_TOKEN_RE.findall(text))

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        base = 1 << 16
        out = []
        for tok in _TOKEN_RE.findall(text):
            tid = ids.get(tok)
            if tid is None:  # unknown word: stable hashed id above the known range
                tid = base + (zlib.crc32(tok.encode()) % (VOCAB_SIZE - base))
            out.append(tid)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._strs.get(i, " <unk>") for i in ids)

    def apply_chat_template(self, messages: list[Message], *, add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        parts = []
        for m in messages:
            parts.append(f"<|im_start|>{m.get('role', 'user')}\n")
            reasoning = m.get("reasoning") or m.get("reasoning_content")
            if reasoning:
                parts.append(reasoning)
            parts.append(_content_text(m.get("content")))
            parts.append("<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)


class HFTokenizer:
    """A local Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer  # optional dependency: agentx-bench[hf]

        self.path = path
        self.name = path
        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """encode() of each text in one batch call (the Rust tokenizer's loop, not ours)."""
        return self._tok(list(texts), add_special_tokens=False)["input_ids"] if texts else []

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return self._tok.convert_ids_to_tokens(list(ids))

    def apply_chat_template(self, messages: list[Message], *, add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        return self._tok.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kwargs)
