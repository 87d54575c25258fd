"""Turn a trace session into the chat messages of each request, with exact token counts.

Message structure: one system message (system prompt, then the tool definitions), then for
every turn a user message (the new input: a user prompt or tool results) and, once answered,
an assistant message. History is append-only, so turn i's prompt starts with turn i-1's
prompt byte for byte and a server's prefix cache sees what the trace's hash_ids describe.

Token budget of turn i, for a template with per-message overheads (see TokenModel):
    in_i = base + gen + Σ overhead(role) + Σ content tokens
The previous turn's assistant message takes min(out_{i-1}, what the growth allows) tokens
(agents drop thinking blocks from history, so the growth can be smaller than out); the new
user message takes the rest. A prompt that shrinks, or whose hash_ids keep less than half of
the previous turn's blocks, is a context compaction: history restarts from the system message.

Content comes from `BlockFactory` keyed by (namespace, hash_id): equal ids inside a session
instance give identical text; the namespace carries the run salt (per-run cache isolation,
unless --warm-cache), the trace id and the session instance. With --shared-prefix the system
(and tool) blocks use a run-wide namespace instead, so every session shares them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..trace.model import Trace, Turn
from ..trace.weka import common_prefix
from .blocks import M64, mix64_array
from .token_model import TokenModel

SHARED_PREFIX_MODES = ("none", "system", "system+tools")
SHARED_KEYS_NS = "shared"  # block_keys' namespace of the blocks every session shares


@dataclass
class SynthConfig:
    run_ns: str  # run salt (or the seed with --warm-cache): namespaces all content
    shared_prefix: str = "none"
    context_scale: float = 1.0  # multiply trace token counts (fit long traces to small models)
    live_history: bool = False
    max_prompt_tokens: int | None = None  # clamp (e.g. server max_model_len - out)
    # token-exact mode with a linear template sends ids built from `content_specs`, never the
    # text: messages then hold content None until `materialize` (a fallback render) asks
    lazy_text: bool = False


@dataclass
class PreparedTurn:
    messages: list[dict]
    intended_in: int  # prompt tokens we intend (after scaling / clamping)
    max_tokens: int
    compaction: bool = False
    expected_cached: int = 0  # the trace's in-session prefix hit (infinite cache), tokens


@dataclass
class Conversation:
    """The growing message list of one session instance."""

    trace: Trace
    instance: str  # unique per lane pick, e.g. "L3.7"
    cfg: SynthConfig
    model: TokenModel
    messages: list[dict] = field(default_factory=list)
    content_tokens: list[int] = field(default_factory=list)
    # how each message's content was made: [(namespace, hash_ids, n_tokens), ...] spans of
    # BlockFactory.span, or the literal text; token-exact mode rebuilds its ids from this
    content_specs: list = field(default_factory=list)
    wire: Any = None  # the sender's per-conversation state (token-exact: SessionIds)
    prev_ids: list = field(default_factory=list)
    prev_in: int = 0
    pending_out: int = 0  # tokens of the last answer not yet in history
    turn_index: int = -1
    _skip_blocks: int = 0
    _last_user_ids: list = field(default_factory=list)
    _live_text: str | None = None
    _keys: list[int] = field(default_factory=list)  # block_keys' last answer, for `_key_ids`
    _key_ids: Sequence = ()

    @property
    def own_ns(self) -> str:
        """Namespace of what only this session instance says (its answers)."""
        return f"{self.cfg.run_ns}/{self.trace.id}/{self.instance}"

    @property
    def ns(self) -> str:
        """Namespace of hash_id content: per session instance for traces whose ids are local
        (Weka), run-wide for traces whose ids are global (Mooncake)."""
        if self.trace.hash_id_scope == "global":
            return f"{self.cfg.run_ns}/global"
        return self.own_ns

    def _scale(self, n: int) -> int:
        return max(1, round(n * self.cfg.context_scale))

    # -- building blocks -------------------------------------------------------------------
    def _prefix_blocks(self) -> tuple[int, int]:
        """Trace blocks of the system prompt and of the tool definitions (a partial block counts)."""
        bs = self.trace.block_size
        return (-(-self.trace.system_tokens // bs) if self.trace.system_tokens else 0,
                -(-self.trace.tool_tokens // bs) if self.trace.tool_tokens else 0)

    def _system(self, in_tokens: int, ids: Sequence[int]) -> None:
        """Start (or restart) history with the system message of system+tool tokens."""
        tm = self.model
        sys_t = self._scale(self.trace.system_tokens) if self.trace.system_tokens else 0
        tool_t = self._scale(self.trace.tool_tokens) if self.trace.tool_tokens else 0
        fixed = tm.base + tm.generation_prompt + tm.overhead["system"] + tm.overhead["user"]
        budget = max(0, in_tokens - fixed - 1)  # keep >= 1 token for the first user message
        if sys_t + tool_t > budget:  # small trace or heavy scaling: shrink proportionally
            f = budget / max(1, sys_t + tool_t)
            sys_t, tool_t = int(sys_t * f), int(tool_t * f)
        sys_c = max(1, sys_t - tm.overhead["system"]) if sys_t else 1
        n_sys_blocks, n_tool_blocks = self._prefix_blocks()
        shared = self.cfg.shared_prefix
        sys_ns = f"{self.cfg.run_ns}/shared-system" if shared != "none" else self.ns
        tool_ns = f"{self.cfg.run_ns}/shared-tools" if shared == "system+tools" else self.ns
        spans = [(sys_ns, ["sys", *ids[:n_sys_blocks]], sys_c)]
        if tool_t:
            spans.append((tool_ns, ["tools", *ids[n_sys_blocks:n_sys_blocks + n_tool_blocks]],
                          tool_t))
        self.messages = [{"role": "system", "content": self._text(spans)}]
        self.content_tokens = [sys_c + tool_t]
        self.content_specs = [spans]
        self._skip_blocks = n_sys_blocks + n_tool_blocks

    def _append(self, role: str, text: str | None, n: int, spec: Any) -> None:
        self.messages.append({"role": role, "content": text})
        self.content_tokens.append(n)
        self.content_specs.append(spec)

    def _text(self, spans: list) -> str | None:
        """The text of a message's spans (None with lazy_text: made by `materialize`)."""
        if self.cfg.lazy_text:
            return None
        f, bs = self.model.factory, self.trace.block_size
        return "".join([f.span(ns, ids, n, bs) for ns, ids, n in spans])

    def _span(self, ns: str, ids: Sequence, n: int) -> tuple[str | None, list]:
        """Text of a one-span message and its spec."""
        spec = [(ns, ids, n)]
        return self._text(spec), spec

    def materialize(self) -> None:
        """Make the text of every message whose content lazy_text left out (in place: the
        message objects stay the same, so a sender's per-message state stays valid)."""
        f, bs = self.model.factory, self.trace.block_size
        for m, spec in zip(self.messages, self.content_specs):
            if m["content"] is None:
                m["content"] = "".join([f.span(ns, ids, n, bs) for ns, ids, n in spec])

    def _current_tokens(self, with_gen: bool = True) -> int:
        tm = self.model
        return (tm.base + (tm.generation_prompt if with_gen else 0)
                + sum(tm.overhead.get(m["role"], tm.overhead["user"]) for m in self.messages)
                + sum(self.content_tokens))

    # -- the public step ------------------------------------------------------------------
    def next_turn(self, turn: Turn, index: int) -> PreparedTurn:
        """Messages for `turn` (the session's index-th request); call `answered` after it."""
        tm, bs = self.model, self.trace.block_size
        target = self._scale(turn.in_tokens)
        max_tokens = self._scale(turn.out_tokens)
        if self.cfg.max_prompt_tokens:
            target = min(target, self.cfg.max_prompt_tokens)
        ids = turn.hash_ids
        common = common_prefix(self.prev_ids, ids)
        compaction = bool(self.messages) and (
            target < self.prev_in or common * 2 < len(self.prev_ids))
        if not self.messages or compaction:
            self._system(target, ids)
            new_ids = ids[self._skip_blocks:]
        else:
            new_ids = ids[common:]
            # previous answer into history: as much of it as the growth allows
            a_over, u_over = tm.overhead["assistant"], tm.overhead["user"]
            room = target - self._current_tokens() - a_over - u_over - 1
            a = self.pending_out if self.cfg.live_history else min(self.pending_out, max(0, room))
            self._append("assistant", *self._answer(a))
        user_n = target - self._current_tokens() - tm.overhead["user"]
        if user_n < 1:
            user_n = 1  # the trace's growth cannot hold the history: prompt runs long (counted)
        self._last_user_ids = list(new_ids) or [("u", self.own_ns, index)]
        text, spec = self._span(self.ns, self._last_user_ids, user_n)
        self._append("user", text, user_n, spec)
        expected = min(target, self._scale(common * bs)) if self.prev_ids else 0
        self.prev_ids, self.turn_index = ids, index
        intended = self._current_tokens()
        self.prev_in = intended
        return PreparedTurn(list(self.messages), intended, max_tokens, compaction, expected)

    def block_keys(self, ids: Sequence[int]) -> list[int]:
        """Cache identity of each trace block of a prompt, namespaced like its content: a
        64-bit hash of (namespace, hash id). Ints, not tuples: cheaper to hash, nothing to
        allocate per block, nothing for the garbage collector to track; two blocks collide
        with probability ~n^2 / 2^65 (1e-8 at a million blocks). Kept between calls: a turn
        that extends the previous prompt makes keys for its new blocks only (a long
        session's prompt has ~13k)."""
        common = common_prefix(self._key_ids, ids) if self._key_ids else 0
        n_sys, n_tool = self._prefix_blocks()
        shared = self.cfg.shared_prefix
        n_shared = n_sys if shared == "system" else n_sys + n_tool if shared != "none" else 0
        f = self.model.factory
        new = ids[common:]
        try:
            h = np.asarray(new, dtype=np.int64).astype(np.uint64)
        except (OverflowError, TypeError, ValueError):  # ids beyond int64: one at a time
            h = np.array([hash(x) & M64 for x in new], dtype=np.uint64)
        base = np.full(len(h), f.ns_base(self.ns), dtype=np.uint64)
        k = max(0, n_shared - common)  # shared blocks: by position, the same in every session
        base[:k] = f.ns_base(SHARED_KEYS_NS)
        h[:k] = np.arange(common, common + k, dtype=np.uint64)
        keys = self._keys[:common]
        keys += mix64_array(base ^ h).tolist()
        self._keys, self._key_ids = keys, ids
        return keys

    def _answer(self, n: int) -> tuple[str | None, int, Any]:
        """(text, tokens, spec) of the last turn's answer as it joins history."""
        if self.cfg.live_history and self._live_text is not None:
            return self._live_text, n, self._live_text
        text, spec = self._span(self.own_ns, [("a", self.turn_index)], n)
        return text, n, spec

    def answered(self, out_tokens: int, live_text: str | None = None) -> None:
        """Record the answer of the last turn: it joins history before the next user message."""
        self.pending_out = out_tokens
        self._live_text = live_text if self.cfg.live_history else None

    def fix_last_user(self, delta: int) -> None:
        """Grow (delta > 0) or shrink the last user message by delta tokens (exact mode)."""
        old = self.content_tokens[-1]
        n = max(1, old + delta)
        text, self.content_specs[-1] = self._span(self.ns, self._last_user_ids, n)
        self.messages[-1] = {"role": "user", "content": text}
        self.content_tokens[-1] = n
        self.prev_in += n - old
