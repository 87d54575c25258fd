#!/usr/bin/env python3
"""Prompt build cost: time to produce a request body for 10k / 100k / 300k-token prompts.

Prints, per size: the first build of a session's history (every block generated), the
steady-state cost of one more turn (history reused, new blocks only, body serialised), and
the same from cached blocks after a cache warm-up. Run: python bench/prompt_build.py
"""
from __future__ import annotations

import statistics
import time

import orjson

from agentx.client.http import ClientConfig, chat_body
from agentx.prompt.synth import Conversation, SynthConfig
from agentx.prompt.token_model import builtin_model
from agentx.trace.model import Trace, Turn


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


def main() -> None:
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

if __name__ == "__main__":
    main()
