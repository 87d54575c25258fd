"""Prompt synthesis: exact token counts, determinism, namespacing, prefix growth."""
from __future__ import annotations

import pytest

from agentx.prompt.blocks import BlockFactory
from agentx.prompt.synth import Conversation, SynthConfig
from agentx.prompt.token_model import builtin_model
from agentx.tokens.words import WORDS
from agentx.trace.model import Trace, Turn

TM = builtin_model()
TOK = TM.tokenizer


def _trace(tid: str = "t1") -> Trace:
    ids0 = list(range(1, 313))
    ids1 = ids0[:-1] + list(range(900, 918))
    ids2 = ids1[:-1] + list(range(1000, 1010))
    ids3 = ids0[:237] + list(range(2000, 2100))  # compaction: keeps system+tools only
    turns = [Turn(20000, 300, ids0), Turn(21000, 200, ids1), Turn(21600, 50, ids2),
             Turn(16000, 100, ids3)]
    return Trace(tid, list(turns), 64, 2800, 12300)


def _render(prepared) -> str:
    return TOK.apply_chat_template(prepared.messages)


def _replay(conv: Conversation, trace: Trace) -> list:
    out = []
    for i, t in enumerate(trace.turns):
        p = conv.next_turn(t, i)
        out.append(p)
        conv.answered(t.out_tokens)
    return out


def test_prompt_has_exactly_the_trace_tokens():
    trace = _trace()
    for p, t in zip(_replay(Conversation(trace, "L0.0", SynthConfig("r1"), TM), trace),
                    trace.turns):
        assert p.intended_in == t.in_tokens
        assert TOK.count(_render(p)) == t.in_tokens


def test_history_is_append_only_so_each_prompt_prefixes_the_next():
    trace = _trace()
    ps = _replay(Conversation(trace, "L0.0", SynthConfig("r1"), TM), trace)
    assert _render(ps[1]).startswith(_render(ps[0]))
    assert _render(ps[2]).startswith(_render(ps[1]))
    # turn 3 shrinks: compaction restarts history but keeps the system message
    assert ps[3].compaction and not _render(ps[3]).startswith(_render(ps[2]))
    assert ps[3].messages[0] == ps[0].messages[0]


def test_deterministic_and_namespaced():
    trace = _trace()
    a = _replay(Conversation(trace, "L0.0", SynthConfig("r1"), TM), trace)
    b = _replay(Conversation(trace, "L0.0", SynthConfig("r1"), TM), trace)
    assert [_render(x) for x in a] == [_render(x) for x in b]
    other_instance = _replay(Conversation(trace, "L1.0", SynthConfig("r1"), TM), trace)
    other_run = _replay(Conversation(trace, "L0.0", SynthConfig("r2"), TM), trace)
    for o in (other_instance, other_run):
        # not even the first 64-token block is shared: no cross-session prefix hits
        assert TOK.tokens(_render(o[0]))[:64] != TOK.tokens(_render(a[0]))[:64]


@pytest.mark.parametrize("mode,shared_sys,shared_tools", [
    ("none", False, False), ("system", True, False), ("system+tools", True, True)])
def test_shared_prefix_modes(mode, shared_sys, shared_tools):
    trace = _trace()
    a = _replay(Conversation(trace, "L0.0", SynthConfig("r1", shared_prefix=mode), TM), trace)
    b = _replay(Conversation(_trace("t2"), "L5.3", SynthConfig("r1", shared_prefix=mode), TM),
                trace)
    sa = TOK.tokens(a[0].messages[0]["content"])
    sb = TOK.tokens(b[0].messages[0]["content"])
    n_sys = 2800 - TM.overhead["system"]  # the system prompt comes first, then the tools
    assert (sa[:n_sys] == sb[:n_sys]) is shared_sys
    assert (sa == sb) is shared_tools
    assert a[0].messages[1] != b[0].messages[1]  # the sessions' own content never collides


def test_equal_hash_ids_in_a_session_give_identical_text():
    f = BlockFactory(WORDS)
    assert f.text("ns", 7, 64) == f.text("ns", 7, 64)
    assert f.text("ns", 7, 64) != f.text("ns", 8, 64)
    assert f.text("ns", 7, 64) != f.text("ns2", 7, 64)
    for n in (1, 2, 63, 64, 65, 500):
        assert TOK.count(f.text("ns", 3, n)) == n
    # concatenations are additive: block boundaries never merge tokens
    s = f.span("ns", [1, 2, 3], 150, 64)
    assert TOK.count(s) == 150


def test_assistant_history_shrinks_when_growth_is_smaller_than_output():
    # growth 300 < out 2000: the answer joins history truncated, the prompt stays exact
    turns = [Turn(20000, 2000, list(range(313))), Turn(20300, 10, list(range(318)))]
    trace = Trace("t", list(turns), 64, 2800, 12300)
    ps = _replay(Conversation(trace, "i", SynthConfig("r"), TM), trace)
    assert TOK.count(_render(ps[1])) == 20300


def test_context_scale_scales_prompt_and_output():
    trace = _trace()
    ps = _replay(Conversation(trace, "i", SynthConfig("r", context_scale=0.1), TM), trace)
    for p, t in zip(ps, trace.turns):
        assert p.intended_in == round(t.in_tokens * 0.1)
        assert TOK.count(_render(p)) == p.intended_in
        assert p.max_tokens == max(1, round(t.out_tokens * 0.1))


def test_blocks_never_contain_a_double_newline():
    f = BlockFactory(WORDS)
    for n in range(1, 130):
        assert "\n\n" not in f.span("ns", [n, n + 1], n, 64)


def test_live_history_puts_the_live_answer_in_the_next_prompt():
    trace = _trace()
    conv = Conversation(trace, "i", SynthConfig("r", live_history=True), TM)
    conv.next_turn(trace.turns[0], 0)
    conv.answered(4, " the live answer")
    p = conv.next_turn(trace.turns[1], 1)
    assert p.messages[-2] == {"role": "assistant", "content": " the live answer"}
    conv2 = Conversation(trace, "i", SynthConfig("r"), TM)
    conv2.next_turn(trace.turns[0], 0)
    conv2.answered(300, " ignored without --live-history")
    assert "ignored" not in conv2.next_turn(trace.turns[1], 1).messages[-2]["content"]
