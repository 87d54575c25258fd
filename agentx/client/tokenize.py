"""A token model fitted to a server's own tokenizer through its /tokenize endpoint (the token
model's mode "calibrated"; not acceptance-length calibration, which is `agentx calibrate`).

Used when the target is not the embedded simulator and no local tokenizer is given: we
measure how many server tokens one of our words costs and what the chat template adds per
message, then size prompts with those numbers. The result is approximate (BPE merges vary
with context); the measured residual is reported as `calibration.residual` and the tolerance
is documented in docs/metrics.md.
"""
from __future__ import annotations

from typing import Any

import aiohttp

from ..prompt.blocks import BlockFactory
from ..prompt.token_model import TokenModel, measure_overheads
from ..tokens.words import WORDS
from .http import post_json


async def _count(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict],
                 gen: bool, kwargs: dict) -> int:
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": gen}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return int((await post_json(session, url, body))["count"])


async def server_token_model(session: aiohttp.ClientSession, base_url: str, model: str,
                           chat_template_kwargs: dict | None = None) -> tuple[TokenModel, dict]:
    url = base_url.rstrip("/") + "/tokenize"
    kw = chat_template_kwargs or {}
    probe = BlockFactory(WORDS)
    n = 2048
    text = probe.text("calibration", 0, n)
    c0 = await _count(session, url, model, [{"role": "user", "content": "x"}], False, kw)
    c1 = await _count(session, url, model, [{"role": "user", "content": "x" + text}], False, kw)
    ratio = max(0.2, (c1 - c0) / n)
    factory = BlockFactory(WORDS, tokens_per_word=ratio)
    # collect the counts measure_overheads asks for, then answer them from the table
    asked: list[tuple[list[dict], bool]] = []

    def record(msgs: list[dict], gen: bool) -> int:
        asked.append((msgs, gen))
        return 0

    measure_overheads(record, factory)
    counts = [await _count(session, url, model, m, g, kw) for m, g in asked]
    it = iter(counts)
    overhead, gen, base = measure_overheads(lambda m, g: next(it), factory)
    tm = TokenModel("calibrated", factory, overhead, gen, base, None)
    # residual: predicted vs measured on a fresh multi-message prompt
    msgs = [{"role": "system", "content": factory.text("cal-r", 1, 700)},
            {"role": "user", "content": factory.text("cal-r", 2, 1500)},
            {"role": "assistant", "content": factory.text("cal-r", 3, 300)},
            {"role": "user", "content": factory.text("cal-r", 4, 900)}]
    predicted = tm.prompt_tokens(msgs, [700, 1500, 300, 900])
    actual = await _count(session, url, model, msgs, True, kw)
    info = {"mode": "calibrated", "tokens_per_word": ratio, "overhead": overhead,
            "generation_prompt": gen, "residual": (actual - predicted) / actual}
    return tm, info
