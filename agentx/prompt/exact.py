"""Token-exact prompts built incrementally: a turn costs the ids of what it adds, not a render
and re-tokenisation of the whole conversation (~5 µs per token with a Hugging Face tokenizer:
0.6-0.8 s for a 130k-token prompt, measured with bench/prompt_build.py's session).

Two facts make this exact:
- Synthetic content is made of words that are each one token, and newlines (blocks.py), so a
  span's token ids are a lookup of its word indices (`BlockFactory.span_index`).
- Most chat templates are linear over the conversations agentx sends (a system message, then
  user / assistant alternating, ending with a user message): the render is the concatenation,
  per message, of head(role) + content + tail(role), then a generation prompt (which carries
  the thinking on/off piece). `probe_template` extracts those pieces by rendering a few
  conversations, then checks, on a realistic conversation, that the pieces' ids equal the
  tokenizer's ids of the full render at every user turn. A template that rewrites what
  precedes a new message (e.g. drops earlier thinking), treats a role differently by
  position, or tokenises across a message boundary fails the probe: the run then renders in
  full for every turn (off the event loop) and says why in its token info.

`SessionIds` keeps, per conversation, each message's ids serialised as a JSON fragment, so a
request body is those fragments plus the new message's and the generation prompt's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import orjson

from ..aio import Steps
from .blocks import BlockFactory

ROLES = ("system", "user", "assistant")
_NP = orjson.OPT_SERIALIZE_NUMPY


class NotIncremental(Exception):
    """This message cannot be built from pieces (the template rewrites its content)."""


@dataclass
class Pieces:
    """A linear chat template's pieces as token ids (and text, for literal content)."""

    tok: Any
    kwargs: dict
    factory: BlockFactory
    word_ids: np.ndarray  # token id of factory word i; the last entry is the newline's
    head_text: dict[str, str]
    tail_text: dict[str, str]
    gen_text: str
    head: dict[str, np.ndarray] = field(default_factory=dict)
    tail: dict[str, np.ndarray] = field(default_factory=dict)
    gen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    stubs: tuple[str, str] = ("", "")  # system / user contents for `renders_verbatim`

    def __post_init__(self) -> None:
        enc = self._encode
        self.head = {r: enc(t) for r, t in self.head_text.items()}
        self.tail = {r: enc(t) for r, t in self.tail_text.items()}
        self.gen = enc(self.gen_text)

    def _encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text), dtype=np.int64) if text else np.zeros(0, np.int64)

    def overhead(self, role: str) -> int:
        return len(self.head[role]) + len(self.tail[role])

    def span_ids(self, spans: Sequence[tuple], block_size: int) -> np.ndarray:
        """Token ids of concatenated spans (namespace, hash_ids, n_tokens)."""
        f = self.factory
        parts = [f.span_index(ns, ids, n, block_size) for ns, ids, n in spans]
        return self.word_ids[np.concatenate(parts)] if parts else np.zeros(0, np.int64)

    def message_ids(self, role: str, spec: Any, block_size: int) -> np.ndarray:
        """ids of one message: head + content + tail. `spec` is a list of spans (synthetic
        content) or a str (literal content, e.g. a live answer), which is tokenised with its
        head and tail when the template renders it verbatim."""
        if isinstance(spec, str):
            if not self.renders_verbatim(role, spec):
                raise NotIncremental(f"the template rewrites this {role} message")
            return self._encode(self.head_text[role] + spec + self.tail_text[role])
        return np.concatenate((self.head[role], self.span_ids(spec, block_size), self.tail[role]))

    def render(self, messages: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt=gen, **self.kwargs)

    def renders_verbatim(self, role: str, text: str) -> bool:
        """Does `text` as a mid-conversation `role` message render as head + text + tail?
        (Qwen3's template, e.g., moves what precedes '</think>' in an answer elsewhere.)"""
        s, u = self.stubs
        msgs = [{"role": "system", "content": s}, {"role": "user", "content": u},
                {"role": role, "content": text}, {"role": "user", "content": u}]
        h, t = self.head_text, self.tail_text
        want = (h["system"] + s + t["system"] + h["user"] + u + t["user"]
                + h[role] + text + t[role] + h["user"] + u + t["user"])
        try:
            return self.render(msgs, False) == want
        except Exception:  # a template that refuses this shape is not verbatim either
            return False


def word_ids(tok: Any, factory: BlockFactory) -> np.ndarray | None:
    """Token id of each factory word (each one token) and, last, of the newline; None when
    a word or the newline is not exactly one token."""
    enc = getattr(tok, "encode_many", None)
    texts = [*factory.words, "\n"]
    ids = enc(texts) if enc else [tok.encode(t) for t in texts]
    if any(len(x) != 1 for x in ids):
        return None
    return np.array([x[0] for x in ids], dtype=np.int64)


_PROBE_ROLES = ("system", "user", "assistant", "user", "assistant", "user")
_PROBE_TOKENS = (70, 65, 130, 1, 2, 200)  # block ends with a newline, a word, a lone word


def _split(delta: str, content: str) -> tuple[str, str] | None:
    if not content or delta.count(content) != 1:
        return None
    h, _, t = delta.partition(content)
    return h, t


def probe_template(tok: Any, kwargs: dict, factory: BlockFactory) -> tuple[Pieces | None, str]:
    """The template's pieces, or None and why it cannot be built incrementally."""
    wids = word_ids(tok, factory)
    if wids is None:
        return None, "the synthetic words or the newline are not single tokens"
    bs = 64
    spans = [[(f"probe/{i}", [i * 100 + j for j in range(4)], n)]
             for i, n in enumerate(_PROBE_TOKENS)]
    msgs = [{"role": r, "content": factory.span(*sp[0], bs)}
            for r, sp in zip(_PROBE_ROLES, spans)]

    def render(n: int, gen: bool) -> str:
        return tok.apply_chat_template(msgs[:n], add_generation_prompt=gen, **kwargs)

    try:
        r1, r2, r4, r6 = (render(n, False) for n in (1, 2, 4, 6))
        gens = [render(n, True) for n in (2, 4, 6)]
    except Exception as exc:  # e.g. a template that requires a user message first
        return None, f"template probe failed: {type(exc).__name__}: {exc}"[:200]
    c = [m["content"] for m in msgs]
    sys_pieces = _split(r1, c[0])
    if sys_pieces is None or not r2.startswith(r1):
        return None, "the system message does not render as head + content + tail"
    user = _split(r2[len(r1):], c[1])
    if user is None:
        return None, "a user message does not render as head + content + tail"
    head = {"system": sys_pieces[0], "user": user[0]}
    tail = {"system": sys_pieces[1], "user": user[1]}
    for lo, hi, a, u in ((r2, r4, c[2], c[3]), (r4, r6, c[4], c[5])):
        if not hi.startswith(lo):
            return None, "adding a turn changes how earlier messages render"
        tail_u = head["user"] + u + tail["user"]
        delta = hi[len(lo):]
        if not delta.endswith(tail_u):
            return None, "a user message renders differently after an assistant message"
        ans = _split(delta[:-len(tail_u)], a)
        if ans is None or head.setdefault("assistant", ans[0]) != ans[0] \
                or tail.setdefault("assistant", ans[1]) != ans[1]:
            return None, "an assistant message does not render as head + content + tail"
    gen_text = gens[0][len(r2):]
    if any(g != r + gen_text for g, r in zip(gens, (r2, r4, r6))):
        return None, "the generation prompt depends on the conversation"
    p = Pieces(tok, dict(kwargs), factory, wids, head, tail, gen_text, stubs=(c[0], c[1]))
    # token level: the pieces' ids must equal the tokenizer's ids of every full render
    for n, g in zip((2, 4, 6), gens):
        ids = np.concatenate([p.message_ids(r, sp, bs) for r, sp in zip(_PROBE_ROLES[:n], spans)]
                             + [p.gen])
        if ids.tolist() != list(tok.encode(g)):
            return None, "token ids across message boundaries differ from the full render's"
    return p, ""


class SessionIds:
    """The token ids of one conversation's messages, each serialised once as a JSON fragment
    ('1,2,3,'), with the message object it was made from (history is append-only; a message
    replaced or a history restarted is re-encoded from there)."""

    __slots__ = ("msgs", "chunks", "counts", "total")

    def __init__(self) -> None:
        self.msgs: list[dict] = []
        self.chunks: list[bytes] = []
        self.counts: list[int] = []
        self.total = 0

    def sync(self, messages: list[dict], specs: list, pieces: Pieces, block_size: int,
             step_ns: int = 300_000) -> Steps[None]:
        """Bring the fragments up to `messages` (raises NotIncremental), stepped: a step ends
        after the message that takes it past `step_ns` of work (a lane's first request
        encodes its whole history: hundreds of messages, tens of ms in one piece)."""
        k, n, old = 0, min(len(messages), len(self.msgs)), self.msgs
        while k < n and messages[k] is old[k]:
            k += 1
        if k < len(old):
            del old[k:], self.chunks[k:], self.counts[k:]
            self.total = sum(self.counts)
        t0 = time.perf_counter_ns()
        for j in range(k, len(messages)):
            m = messages[j]
            ids = pieces.message_ids(m["role"], specs[j], block_size)
            self.msgs.append(m)
            self.chunks.append(orjson.dumps(ids, option=_NP)[1:-1] + b"," if len(ids) else b"")
            self.counts.append(len(ids))
            self.total += len(ids)
            if time.perf_counter_ns() - t0 > step_ns and j + 1 < len(messages):
                yield
                t0 = time.perf_counter_ns()

    def prompt_parts(self, gen: np.ndarray) -> list[bytes]:
        """The JSON fragments of the prompt's ids (without brackets): messages, then `gen`."""
        parts = [c for c in self.chunks if c]
        if len(gen):
            parts.append(orjson.dumps(gen, option=_NP)[1:-1])
        elif parts:
            parts[-1] = parts[-1][:-1]  # drop the trailing comma
        return parts
