#!/usr/bin/env python3
"""Prompt build cost: time to produce a request body, chat messages and token-exact ids.

Part 1 (built-in tokenizer, chat messages): per prompt size, the first build of a session's
history (every block generated) and the steady-state cost of one more turn (history reused,
new blocks only, body serialised).

Part 2 (token-exact, `--tokenizer`; default: the tiny Qwen3-style tokenizer tests/vllm_env
builds locally): the time agentx's own sender takes to make a turn's /v1/completions body
(next_turn + token ids + body fragments), per turn of sessions growing to 10k / 100k / 130k
tokens and of the real Claude Code sessions whose prompts stay within 130k tokens; first
turns (a lane starting a session: its whole history at once) apart from later ones. Each
body's ids are checked against a full render of the template once per session, and the full
render + tokenisation that token-exact mode did before is timed for comparison.
Target (issue 12): later turns p50 <= 2 ms, p99 <= 10 ms up to 130k tokens.

    python bench/prompt_build.py [--tokenizer DIR] [--sessions N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from agentx.client.http import ClientConfig, chat_body
from agentx.engine.sender import TokenIdsSender
from agentx.prompt.synth import Conversation, SynthConfig
from agentx.prompt.token_model import builtin_model, hf_model
from agentx.trace.model import Trace, Turn

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = REPO / "tests" / "data" / "traces" / "claude-code-traces.tar.xz"


def session(total: int, turns: int = 40) -> Trace:
    """A session growing linearly to `total` tokens over `turns` turns; each turn's hash_ids
    extend the previous turn's (minus its partial last block), as in real traces."""
    ts, ids, next_id = [], [], 1
    for i in range(turns):
        n = total * (i + 1) // turns
        keep = ids[: n // 64] if i else []
        keep = keep[: len(ids) - 1] if ids else keep
        new = list(range(next_id, next_id + -(-n // 64) - len(keep)))
        next_id += len(new)
        ids = keep + new
        ts.append(Turn(n, 300, list(ids)))
    return Trace("bench", list(ts), 64, 2800, 12300)


def chat_table() -> None:
    tm = builtin_model()
    ccfg = ClientConfig("http://x", model="m")
    print(f"{'prompt tokens':>14} {'cold build ms':>14} {'last turn ms':>13} "
          f"{'body bytes':>11} {'tokens exact':>12}")
    for total in (10_000, 100_000, 300_000):
        tr = session(total)
        turns = tr.turns
        # cold: the whole final prompt built at once (a lane starting deep into a session)
        conv = Conversation(tr, "L0.0", SynthConfig(f"cold{total}"), tm)
        t = time.perf_counter()
        p = conv.next_turn(turns[-1], len(turns) - 1)
        orjson.dumps(chat_body(ccfg, p.messages, p.max_tokens))
        cold_ms = (time.perf_counter() - t) * 1e3
        # steady state: history grows turn by turn; time the last (largest) turn, 5 repeats
        last = []
        for rep in range(5):
            conv = Conversation(tr, "L0.0", SynthConfig(f"warm{total}.{rep}"), tm)
            for i, turn in enumerate(turns):
                t = time.perf_counter()
                p = conv.next_turn(turn, i)
                body = orjson.dumps(chat_body(ccfg, p.messages, p.max_tokens))
                dt = (time.perf_counter() - t) * 1e3
                conv.answered(300)
            last.append(dt)
        exact = tm.tokenizer.count(tm.tokenizer.apply_chat_template(p.messages)) == p.intended_in
        print(f"{p.intended_in:>14,} {cold_ms:>14.2f} {statistics.median(last):>13.2f} "
              f"{len(body):>11,} {str(exact):>12}")


def cold_start_ms(tm, snd: TokenIdsSender, tr: Trace, ns: str) -> float:
    """A lane starting at the session's last turn: history built without sending (as lanes do
    up to their start turn, untimed here), then the last turn's body with every id at once."""
    conv = Conversation(tr, "L0.0", SynthConfig(ns, lazy_text=True), tm)
    turns = tr.turns
    for i, turn in enumerate(turns[:-1]):
        conv.answered(conv.next_turn(turn, i).max_tokens)
    t = time.perf_counter()
    p = conv.next_turn(turns[-1], len(turns) - 1)
    snd.body(snd.prompt_parts(conv, p), p.max_tokens)
    return (time.perf_counter() - t) * 1e3


def replay_exact(tm, snd: TokenIdsSender, tr: Trace, ns: str, check: bool
                 ) -> tuple[list[float], int, bool]:
    """One session as a lane sends it: (ms of each turn after the first, largest prompt, ids
    equal to a full render at the last turn)."""
    conv = Conversation(tr, "L0.0", SynthConfig(ns, lazy_text=True), tm)
    times, biggest, body = [], 0, b""
    for i, turn in enumerate(tr.turns):
        t = time.perf_counter()
        p = conv.next_turn(turn, i)
        parts = snd.prompt_parts(conv, p)
        if parts is None:
            raise SystemExit("this template does not build incrementally: " + tm.build)
        parts = snd.body(parts, p.max_tokens)
        times.append((time.perf_counter() - t) * 1e3)
        biggest = max(biggest, p.intended_in)
        conv.answered(p.max_tokens)
        if check and i == len(tr.turns) - 1:
            body = b"".join(parts)
    equal = True
    if check:
        tok = tm.tokenizer
        conv.materialize()
        full = tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                                  **tm.pieces.kwargs))
        equal = orjson.loads(body)["prompt"] == full
    return times[1:], biggest, equal


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def exact_table(tok_dir: str, n_real: int) -> None:
    tm = hf_model(tok_dir, {"enable_thinking": False})
    snd = TokenIdsSender(None, ClientConfig("http://x", model="m", thinking="off"))
    print(f"\ntoken-exact: {tok_dir} (template build: {tm.build})")
    if tm.pieces is None:
        return
    hdr = (f"{'sessions':>26} {'max tokens':>11} {'turns':>6} {'cold start ms':>14} "
           f"{'turn p50 ms':>12} {'p99':>7} {'max':>7} {'ids = full render':>18}")
    print(hdr)
    rows = [(f"synthetic {n // 1000}k x5", [session(n) for _ in range(5)])
            for n in (10_000, 100_000, 130_000)]
    if n_real and REAL_TRACES.exists():
        from agentx.trace.load import load_traces

        real = [t for t in sorted(load_traces(str(REAL_TRACES)).traces, key=lambda t: t.id)
                if t.turns and max(x.in_tokens for x in t.turns) <= 130_000]
        rows.append((f"real <= 130k ({min(n_real, len(real))})", real[:n_real]))
    for name, traces in rows:
        colds, later, biggest, equal = [], [], 0, True
        for k, tr in enumerate(traces):
            lt, b, eq = replay_exact(tm, snd, tr, f"{name}.{k}", check=k < 3)
            colds.append(cold_start_ms(tm, snd, tr, f"{name}.{k}.cold"))
            later += lt
            biggest, equal = max(biggest, b), equal and eq
        print(f"{name:>26} {biggest:>11,} {len(later):>6} {statistics.median(colds):>14.2f} "
              f"{_pct(later, 50):>12.3f} {_pct(later, 99):>7.3f} {max(later):>7.3f} "
              f"{str(equal):>18}")
    # what every turn cost before: render the whole template and tokenise it
    tr = session(130_000)
    conv = Conversation(tr, "L0.0", SynthConfig("full"), tm)
    for i, turn in enumerate(tr.turns):
        conv.answered(conv.next_turn(turn, i).max_tokens)
    tok = tm.tokenizer
    t = time.perf_counter()
    ids = tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                             enable_thinking=False))
    print(f"full render + tokenise of one {len(ids):,}-token prompt (the previous per-turn "
          f"cost): {(time.perf_counter() - t) * 1e3:.0f} ms")


def default_tokenizer() -> str:
    sys.path.insert(0, str(REPO / "tests"))
    from vllm_env.build_assets import build_assets  # numpy + tokenizers only, no vLLM

    return str(build_assets().tokenizer_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", help="HF tokenizer dir (default: the tiny test model's)")
    ap.add_argument("--sessions", type=int, default=40,
                    help="real sessions (prompts <= 130k tokens) in the token-exact table")
    ap.add_argument("--skip-chat", action="store_true", help="only the token-exact table")
    args = ap.parse_args()
    if not args.skip_chat:
        chat_table()
    exact_table(args.tokenizer or default_tokenizer(), args.sessions)


if __name__ == "__main__":
    main()
