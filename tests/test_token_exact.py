"""Token-exact prompts built incrementally equal a full chat-template render, token for token.

Real parts only: the tiny Qwen3-style tokenizer tests/vllm_env builds (no hub), with its own
chat template and with Qwen3's published template (tests/data/chat-templates/qwen3.jinja,
which rewrites earlier assistant turns that carry thinking), the real Claude Code traces, and
the request bodies agentx's own sender builds (what goes on the wire). Timings are printed by
bench/prompt_build.py and bench/token_exact_lag.py, not asserted here.
"""
from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from agentx.aio import run_steps
from agentx.client.http import ClientConfig
from agentx.engine.sender import TokenIdsSender
from agentx.prompt.blocks import BlockFactory
from agentx.prompt.exact import SessionIds
from agentx.prompt.synth import Conversation, SynthConfig
from agentx.prompt.token_model import hf_model
from agentx.tokens.tokenizer import BuiltinTokenizer
from agentx.tokens.words import WORDS
from agentx.trace.load import load_traces
from agentx.trace.model import Trace, Turn
from conftest import DATA, REAL_TRACES

pytest.importorskip("transformers")

QWEN3_TEMPLATE = DATA / "chat-templates" / "qwen3.jinja"
# Not linear: the newest user message is marked, so adding a turn changes an earlier one.
MARK_LAST_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
    "{%- if loop.last %} (latest){% endif %}{{ m['content'] }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
N_SESSIONS = 50
SCALE = 0.02  # real sessions at 2% of their tokens: every turn, every template piece, in seconds


def _with_template(src: Path, dst: Path, template: str) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def tok_dirs(vllm_assets, tmp_path_factory) -> dict[str, Path]:
    src = Path(vllm_assets.tokenizer_dir)
    tmp = tmp_path_factory.mktemp("tok")
    return {"tiny": src,
            "qwen3": _with_template(src, tmp / "qwen3", QWEN3_TEMPLATE.read_text()),
            "mark-last": _with_template(src, tmp / "mark", MARK_LAST_TEMPLATE)}


@pytest.fixture(scope="module")
def sessions() -> list[Trace]:
    """50 real sessions spread over the 533 (their subagents are replayed too)."""
    traces = sorted(load_traces(str(REAL_TRACES)).traces, key=lambda t: t.id)
    return traces[::len(traces) // N_SESSIONS][:N_SESSIONS]


def _sender(thinking: str) -> TokenIdsSender:
    return TokenIdsSender(None, ClientConfig("http://x", model="m", thinking=thinking))


def _wire_ids(snd: TokenIdsSender, conv: Conversation, turn) -> list[int]:
    """The prompt ids of the body the sender would put on the wire."""
    parts = asyncio.run(snd.build(conv, turn))
    return orjson.loads(b"".join(parts))["prompt"]


def _incremental_ids(snd: TokenIdsSender, conv: Conversation, turn) -> list[int]:
    """As _wire_ids, for a turn that must build incrementally (no event loop needed)."""
    parts = snd.prompt_parts(conv, turn)
    assert parts is not None
    return orjson.loads(b"".join(snd.body(parts, turn.max_tokens)))["prompt"]


def test_span_index_is_span_word_by_word():
    """The ids path and the text path make the same blocks, for every block shape."""
    f = BlockFactory(WORDS)
    table = [*f.words, "\n"]
    tok = BuiltinTokenizer(WORDS)
    rng = random.Random(7)
    for k in range(300):
        n = rng.choice([1, 2, 3, 63, 64, 65, 129, 1000, 4000])
        ids = [rng.choice([rng.randrange(10**9), ("u", "ns", k), 0, 2**64 - 1, -5])
               for _ in range(rng.randrange(0, 4))]
        bs = rng.choice([1, 2, 16, 64, 512])
        text = f.span(f"ns{k}", ids, n, bs)
        idx = f.span_index(f"ns{k}", ids, n, bs)
        assert "".join(table[i] for i in idx) == text
        assert len(idx) == n == tok.count(text)
    f._max_window = 8  # blocks longer than a tape window are generated word by word
    assert "".join(table[i] for i in f.span_index("g", [3], 100, 64)) == f.span("g", [3], 100, 64)


@pytest.mark.parametrize("name", ["tiny", "qwen3"])
def test_probe_finds_the_pieces(tok_dirs, name):
    off = hf_model(str(tok_dirs[name]), {"enable_thinking": False})
    on = hf_model(str(tok_dirs[name]), {"enable_thinking": True})
    assert off.build == on.build == "incremental"
    assert off.pieces.head_text["user"] == "<|im_start|>user\n"
    assert off.pieces.tail_text["assistant"] == "<|im_end|>\n"
    assert on.pieces.gen_text == "<|im_start|>assistant\n"
    assert off.pieces.gen_text == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert off.generation_prompt == on.generation_prompt + len(off.tokenizer.encode(
        "<think>\n\n</think>\n\n"))


@pytest.mark.parametrize("name,n_sessions", [("tiny", N_SESSIONS), ("qwen3", 10)])
@pytest.mark.parametrize("thinking", ["on", "off"])
def test_every_turn_of_50_real_sessions_equals_the_full_render(tok_dirs, sessions, name,
                                                               n_sessions, thinking):
    """The tiny model's own template on all 50 sessions; Qwen3's on 10 of them (the full
    renders are the cost: ~5 us per token to tokenise)."""
    tm = hf_model(str(tok_dirs[name]), {"enable_thinking": thinking == "on"})
    assert tm.build == "incremental"
    tok, snd = tm.tokenizer, _sender(thinking)
    turns = compactions = 0
    picked = sessions[:n_sessions] + [s.trace for t in sessions[:n_sessions] for s in t.subagents]
    for s in picked:
        conv = Conversation(s, "L0.0", SynthConfig("exact", context_scale=SCALE), tm)
        wire, texts = [], []
        for i, turn in enumerate(s.turns):
            p = conv.next_turn(turn, i)
            compactions += p.compaction
            ids = _incremental_ids(snd, conv, p)
            assert len(ids) == p.intended_in
            wire.append(ids)
            texts.append(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                                 enable_thinking=thinking == "on"))
            conv.answered(p.max_tokens)
        for i, (ids, full) in enumerate(zip(wire, tok.encode_many(texts))):
            assert ids == full, f"{s.id} turn {i}: first difference at " \
                f"{next(j for j, (a, b) in enumerate(zip(ids, full)) if a != b)}"
        turns += len(wire)
    print(f"\n{name} thinking {thinking}: {len(picked)} sessions, {turns} turns equal, "
          f"{compactions} compactions")
    assert turns > 20 * n_sessions and compactions > 0


def test_answer_the_template_rewrites_falls_back_to_a_full_render(tok_dirs):
    """Live history: Qwen3's template moves an earlier answer's '<think>' block out of it, so
    that message is not head + content + tail; the turn is rendered in full (off the loop),
    and the next session state still matches."""
    tm = hf_model(str(tok_dirs["qwen3"]), {"enable_thinking": True})
    tok, snd = tm.tokenizer, _sender("on")
    tr = Trace("t", [Turn(400 + 150 * i, 40, list(range(1, 8 + 3 * i))) for i in range(4)],
               64, 120, 200)
    conv = Conversation(tr, "L0.0", SynthConfig("live", live_history=True), tm)
    answers = [" plain answer\n", "<think>\nsome reasoning\n</think>\n\n the answer", " again"]
    built = []
    for i, turn in enumerate(tr.turns):
        p = conv.next_turn(turn, i)
        built.append(snd.prompt_parts(conv, p) is not None)
        ids = _wire_ids(snd, conv, p)
        assert ids == tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                                         enable_thinking=True))
        assert len(ids) == p.intended_in
        if i < len(answers):
            conv.answered(40, answers[i])
    # turn 2 holds the rewritten answer: from there the session renders in full
    assert built == [True, True, False, False]


def test_template_that_is_not_linear_renders_in_full(tok_dirs):
    tm = hf_model(str(tok_dirs["mark-last"]), None)
    assert tm.pieces is None and tm.build.startswith("full render: ")
    tok, snd = tm.tokenizer, _sender(None)
    tr = Trace("t", [Turn(300 + 100 * i, 30, list(range(1, 6 + 2 * i))) for i in range(3)],
               64, 100, 100)
    conv = Conversation(tr, "L0.0", SynthConfig("nl"), tm)
    for i, turn in enumerate(tr.turns):
        p = conv.next_turn(turn, i)
        ids = _wire_ids(snd, conv, p)
        assert ids == tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True))
        assert len(ids) == p.intended_in
        conv.answered(30)


def test_same_seed_same_bytes(tok_dirs, sessions):
    """Lanes stay deterministic: two conversations of the same run salt send equal bodies,
    whatever else was built in between (the kept ids are per conversation)."""
    tm = hf_model(str(tok_dirs["tiny"]), None)
    snd = _sender(None)
    s = max(sessions[:10], key=lambda t: len(t.turns))
    bodies = []
    for _ in range(2):
        conv = Conversation(s, "L1.0", SynthConfig("seed", context_scale=SCALE), tm)
        out = []
        for i, turn in enumerate(s.turns[:20]):
            p = conv.next_turn(turn, i)
            out.append(b"".join(asyncio.run(snd.build(conv, p))))
            conv.answered(p.max_tokens)
        bodies.append(out)
    assert bodies[0] == bodies[1]
    assert np.all([len(b) > 0 for b in bodies[0]])


def test_lazy_text_sends_the_same_bytes_and_materializes_the_same_text(tok_dirs, sessions):
    """The engine's token-exact conversations make no message text (lazy_text): the bodies
    equal those of conversations that make it, and `materialize` (what a fallback render
    asks for) gives the same messages, in the same message objects the sender keeps."""
    tm = hf_model(str(tok_dirs["tiny"]), None)
    snd = _sender(None)
    s = max(sessions[:10], key=lambda t: len(t.turns))
    text = Conversation(s, "L1.0", SynthConfig("lazy", context_scale=SCALE), tm)
    lazy = Conversation(s, "L1.0", SynthConfig("lazy", context_scale=SCALE, lazy_text=True), tm)
    for i, turn in enumerate(s.turns[:25]):
        p, q = text.next_turn(turn, i), lazy.next_turn(turn, i)
        assert all(m["content"] is None for m in lazy.messages)
        assert b"".join(asyncio.run(snd.build(text, p))) == b"".join(asyncio.run(snd.build(lazy, q)))
        text.answered(p.max_tokens)
        lazy.answered(q.max_tokens)
    kept = list(lazy.messages)
    lazy.materialize()
    assert lazy.messages == text.messages
    assert all(a is b for a, b in zip(kept, lazy.messages))


def test_history_sync_is_stepped_and_equals_one_piece(tok_dirs, sessions):
    """A lane's first request encodes its whole history; `SessionIds.sync` hands the loop
    back between messages once a step's budget is spent, and the result is the same."""
    tm = hf_model(str(tok_dirs["tiny"]), None)
    s = max(sessions[:10], key=lambda t: len(t.turns))
    conv = Conversation(s, "L2.0", SynthConfig("steps", context_scale=SCALE, lazy_text=True), tm)
    for i, turn in enumerate(s.turns[:40]):
        conv.answered(conv.next_turn(turn, i).max_tokens)
    one, stepped = SessionIds(), SessionIds()
    run_steps(one.sync(conv.messages, conv.content_specs, tm.pieces, s.block_size))
    gen = stepped.sync(conv.messages, conv.content_specs, tm.pieces, s.block_size, step_ns=0)
    steps = 0
    while True:
        try:
            next(gen)
            steps += 1
        except StopIteration:
            break
    assert steps == len(conv.messages) - 1  # a zero budget: one message per step
    assert stepped.chunks == one.chunks and stepped.total == one.total
