"""How many tokens a message costs on the target: the three ways we know it.

- builtin: the embedded simulator's tokenizer; exact by construction.
- hf: a local Hugging Face tokenizer (`--tokenizer PATH`); words are restricted to the
  tokenizer's single-token words; the chat template is probed for pieces (exact.py) so that
  prompts are built as token ids incrementally, or, for a template that is not linear, its
  overheads are measured by rendering and each prompt is rendered in full; the engine checks
  each prompt's count and sends token ids (exact).
- calibrated: no tokenizer; the server's `/tokenize` measures the template overheads and the
  tokens-per-word ratio of our vocabulary once at start (approximate; tolerance in docs).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..tokens.tokenizer import BuiltinTokenizer, HFTokenizer, Message
from ..tokens.words import WORDS
from .blocks import BlockFactory
from .exact import Pieces, probe_template

ROLES = ("system", "user", "assistant")


@dataclass
class TokenModel:
    """Token accounting of a chat template: prompt = sum(overhead[role] + content) + gen."""

    kind: str  # builtin | hf | calibrated
    factory: BlockFactory
    overhead: dict[str, int] = field(default_factory=lambda: {r: 5 for r in ROLES})
    generation_prompt: int = 3
    base: int = 0  # tokens the template adds once (e.g. a BOS)
    tokenizer: Any = None  # Tokenizer when exact
    pieces: Pieces | None = None  # hf: the template's pieces, when prompts build incrementally
    build: str = ""  # hf: "incremental", or "full render: <why the template is not linear>"

    @property
    def exact(self) -> bool:
        return self.kind in ("builtin", "hf")

    def prompt_tokens(self, messages: Sequence[Message], content_tokens: Sequence[int]) -> int:
        return (self.base + self.generation_prompt
                + sum(self.overhead.get(m["role"], self.overhead["user"]) for m in messages)
                + sum(content_tokens))


def builtin_model() -> TokenModel:
    tok = BuiltinTokenizer(WORDS)
    return TokenModel("builtin", BlockFactory(WORDS), {r: tok.MESSAGE_OVERHEAD for r in ROLES},
                      tok.GENERATION_PROMPT, 0, tok)


_WORD_RE = re.compile(r"^[a-z]{2,12}$")


def single_token_words(tok: HFTokenizer, limit: int = 4000) -> list[str]:
    """Words w such that ' w' is exactly one token of this tokenizer and round-trips."""
    words = sorted(set(WORDS))
    out = [w for w, ids in zip(words, tok.encode_many([" " + w for w in words])) if len(ids) == 1]
    # widen the vocabulary with the tokenizer's own whole-word tokens
    byte_space = "\u0120"  # byte-level BPE's marker for a leading space
    seen = set(out)
    more = [p[1:] for p in sorted(tok.vocab())
            if p.startswith(byte_space) and _WORD_RE.match(p[1:]) and p[1:] not in seen]
    for w, ids in zip(more, tok.encode_many([" " + w for w in more])):
        if len(out) >= limit:
            break
        if len(ids) == 1:
            out.append(w)
    return out


def _render_count(tok: Any, messages: list[Message], gen: bool, kwargs: dict) -> int:
    return tok.count(tok.apply_chat_template(messages, add_generation_prompt=gen, **kwargs))


def measure_overheads(count_fn, factory: BlockFactory) -> tuple[dict[str, int], int, int]:
    """Measure per-role message overhead, generation prompt and base tokens of a template.

    count_fn(messages, add_generation_prompt) -> prompt token count. Content of a known
    length is rendered and the differences give the overheads; ChatML-family templates are
    linear in this sense, which `verify` re-checks on real prompts.
    """
    n = 32
    c = [factory.text("calib", i, n) for i in range(4)]
    sys_only = count_fn([{"role": "system", "content": c[0]}], False)
    sys_gen = count_fn([{"role": "system", "content": c[0]}], True)
    su = count_fn([{"role": "system", "content": c[0]}, {"role": "user", "content": c[1]}], False)
    sua = count_fn([{"role": "system", "content": c[0]}, {"role": "user", "content": c[1]},
                    {"role": "assistant", "content": c[2]}], False)
    suau = count_fn([{"role": "system", "content": c[0]}, {"role": "user", "content": c[1]},
                     {"role": "assistant", "content": c[2]}, {"role": "user", "content": c[3]}],
                    False)
    ntok = round(n * factory.tokens_per_word) if factory.tokens_per_word != 1.0 else n
    user = su - sys_only - ntok
    assistant = sua - su - ntok
    user2 = suau - sua - ntok
    gen = sys_gen - sys_only
    # The system message absorbs whatever the template adds once (BOS, default preamble).
    return {"system": sys_only - ntok, "user": max(user, user2), "assistant": assistant}, gen, 0


def hf_model(path: str, chat_template_kwargs: dict | None = None) -> TokenModel:
    tok = HFTokenizer(path)
    words = single_token_words(tok)
    factory = BlockFactory(words)
    kw = chat_template_kwargs or {}
    pieces, why = probe_template(tok, kw, factory)
    if pieces is not None:
        return TokenModel("hf", factory, {r: pieces.overhead(r) for r in ROLES}, len(pieces.gen),
                          0, tok, pieces, "incremental")
    overhead, gen, base = measure_overheads(
        lambda msgs, g: _render_count(tok, msgs, g, kw), factory)
    return TokenModel("hf", factory, overhead, gen, base, tok, None, f"full render: {why}")
