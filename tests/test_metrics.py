"""The metric definitions (agentx.metrics.definitions), the one distribution helper
(agentx.distribution), and the path from raw stream facts to a record: timestamps are chosen
by the test, so every metric has an exact expected value."""
from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentx.client.assemble import assemble
from agentx.client.facts import StreamFacts
from agentx.client.http import ClientConfig, make_session, stream_request
from agentx.client.sse import StreamDecoder
from agentx.distribution import KEYS, dist, percentile
from agentx.metrics import definitions as d
from agentx.metrics.catalog import CATALOG
from agentx.metrics.summary import summarize
from agentx.records import RequestRecord

MS = 1_000_000  # ns


# -- definitions ---------------------------------------------------------------------------------
def test_ttft_tpot_e2e_interactivity_by_hand():
    start = 5 * MS
    assert d.ttft_ms(start, start + 120 * MS) == 120.0
    assert d.ttft_ms(start, 0) is None  # no chunk arrived
    # completed: E2E ends at the last chunk with choices, not when the client got done
    assert d.e2e_ms(start, start + 990 * MS, last_chunk_ns=start + 900 * MS, ok=True) == 900.0
    # failed / cancelled: until the client gave up
    assert d.e2e_ms(start, start + 990 * MS, last_chunk_ns=start + 900 * MS, ok=False) == 990.0
    assert d.e2e_ms(0, start) is None  # never sent
    # vLLM: (E2E - TTFT) / (output tokens - 1)
    assert d.tpot_ms(900.0, 120.0, 40) == pytest.approx(780.0 / 39)
    assert d.interactivity_tok_s(20.0) == 50.0
    assert d.interactivity_tok_s(None) is None and d.interactivity_tok_s(0.0) is None
    assert d.dispatch_lag_ms(start - 3 * MS, start) == 3.0
    assert d.dispatch_lag_ms(start + MS, start) == 0.0  # sent early never counts as negative


def test_tpot_undefined_for_one_token_or_none():
    assert d.tpot_ms(50.0, 50.0, 1) is None
    assert d.tpot_ms(50.0, 50.0, 0) is None
    assert d.tpot_ms(50.0, None, 10) is None
    assert d.token_itls_ms([7 * MS], [1]) == [] and d.chunk_itls_ms([7 * MS]) == []


def test_output_tokens_prefers_usage_then_counts_chunks():
    assert d.output_tokens(12, [1, 1]) == 12
    assert d.output_tokens(None, [1, 3, 2]) == 6
    assert d.output_tokens(None, []) is None


def test_chunk_itl_vs_token_itl_with_speculative_chunks():
    # first chunk 1 token, then chunks of 2 and 4 tokens (MTP / EAGLE accept several per step)
    offsets, tokens = [100 * MS, 110 * MS, 130 * MS], [1, 2, 4]
    assert d.chunk_itls_ms(offsets) == [10.0, 20.0]
    assert d.token_itls_ms(offsets, tokens) == [5.0] * 2 + [5.0] * 4
    # with one token in the first chunk, mean token ITL == TPOT of the same request
    tpot = d.tpot_ms(e2e=130.0, ttft=100.0, n_out=sum(tokens))
    assert np.mean(d.token_itls_ms(offsets, tokens)) == pytest.approx(tpot)
    # a chunk that carried no token (usage unchanged) still counts as one gap
    assert d.token_itls_ms([0, 4 * MS], [1, 0]) == [4.0]


def test_every_declared_metric_is_documented():
    doc = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    for m in CATALOG:
        assert re.search(rf"`{m.key}`", doc), m.key


# -- the one distribution helper -----------------------------------------------------------------
def test_dist_linear_interpolation_population_std_and_keys():
    out = dist([4.0, None, 1.0, 3.0, 2.0])  # None: a metric undefined for that request
    assert tuple(out) == KEYS
    assert out["count"] == 4 and out["mean"] == 2.5 and out["min"] == 1.0 and out["max"] == 4.0
    assert out["p50"] == 2.5 and out["p10"] == pytest.approx(1.3)
    assert out["p90"] == pytest.approx(3.7) and out["p99"] == pytest.approx(3.97)
    assert out["std"] == pytest.approx(math.sqrt(1.25))  # ddof=0
    rng = np.random.default_rng(1)
    a = rng.lognormal(size=1001)
    got = dist(a)
    for p in (10, 50, 75, 90, 95, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(a, p, method="linear"))
    assert percentile(a, 50) == got["p50"]


def test_dist_of_nothing_is_all_none():
    assert dist([]) == {"count": 0, **{k: None for k in KEYS[1:]}}
    assert dist([None]) == dist([]) and percentile([], 50) is None


# -- raw facts -> record -------------------------------------------------------------------------
def _sse(ev: dict | str) -> bytes:
    return b"data: " + (ev.encode() if isinstance(ev, str) else orjson.dumps(ev)) + b"\n\n"


def _chunk(delta: dict, ct: int, finish: str | None = None) -> dict:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": ct}}


def _decode(events: list[tuple[int, bytes]], start_ns: int = 10 * MS) -> StreamFacts:
    facts = StreamFacts(start_ns=start_ns, status=200)
    dec = StreamDecoder(facts)
    dec.t0 = start_ns
    for t, raw in events:
        dec.feed(raw, t)
    dec.finish()
    assert dec.seen_done
    return facts


def test_reasoning_stream_record_matches_definitions():
    """vLLM chat stream with a reasoning parser: role chunk, 2 reasoning chunks (1 + 3 tokens,
    speculative), 2 content chunks, the final usage chunk, [DONE]."""
    t0 = 10 * MS
    events = [
        (t0 + 200 * MS, _sse(_chunk({"role": "assistant", "content": ""}, 0))),
        (t0 + 200 * MS, _sse(_chunk({"reasoning": "Let"}, 1))),
        (t0 + 220 * MS, _sse(_chunk({"reasoning": " me think"}, 4))),
        (t0 + 250 * MS, _sse(_chunk({"content": "Sure"}, 5))),
        (t0 + 290 * MS, _sse(_chunk({"content": "."}, 7, "stop"))),
        (t0 + 291 * MS, _sse({"choices": [], "usage": {
            "prompt_tokens": 50, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 32}}}) + _sse("[DONE]")),
    ]
    facts = _decode(events, t0)
    facts.end_ns = t0 + 295 * MS  # the client was done a little after the last bytes
    rec = RequestRecord("r", "s", 0, 0, False, intended_send_ns=t0 - 2 * MS)
    assemble(rec, facts)
    assert rec.ok and rec.finish_reason == "stop"
    assert rec.ttft_ms == 200.0  # the role chunk (non-empty choices), as vLLM's client
    assert rec.ttfc_ms == 250.0  # first answer content
    assert rec.reasoning_tokens == 4  # reasoning tokens are tokens
    assert rec.chunk_tokens == [1, 3, 1, 2] and rec.osl == rec.osl_counted == 7
    assert rec.chunk_offsets_ns == [200 * MS, 220 * MS, 250 * MS, 290 * MS]
    assert rec.e2e_ms == 290.0  # last chunk with choices (the usage chunk has none)
    assert rec.tpot_ms == pytest.approx((290.0 - 200.0) / 6)
    assert rec.isl == 50 and rec.cached_tokens == 32 and rec.dispatch_lag_ms == 2.0
    row = orjson.loads(rec.to_json())
    s = summarize([row], window_s=1.0)
    assert s["itl_ms"]["count"] == 3 and s["itl_ms"]["max"] == 40.0
    assert s["itl_token_ms"]["count"] == 6  # 3 + 1 + 2 tokens after the first chunk
    assert s["itl_token_ms"]["mean"] == pytest.approx(rec.tpot_ms)
    assert s["interactivity_tok_s_user"]["p50"] == pytest.approx(1000.0 / rec.tpot_ms)
    assert s["tokens"]["reasoning"] == 4


def test_single_token_output_has_no_tpot(samples_dir):
    t0 = 1 * MS
    facts = _decode([(t0 + 30 * MS, _sse(_chunk({"role": "assistant", "content": ""}, 0))
                      + _sse(_chunk({"content": "x"}, 1, "length"))),
                     (t0 + 31 * MS, _sse("[DONE]"))], t0)
    facts.end_ns = t0 + 31 * MS
    rec = RequestRecord("r", "s", 0, 0, False)
    assemble(rec, facts)
    assert rec.ok and rec.osl == 1 and rec.ttft_ms == rec.e2e_ms == 30.0
    assert rec.tpot_ms is None
    s = summarize([orjson.loads(rec.to_json())], window_s=1.0)
    assert s["tpot_ms"]["count"] == 0 and s["interactivity_tok_s_user"]["count"] == 0
    assert s["ttft_ms"]["count"] == 1 and s["itl_ms"]["count"] == 0


def test_never_sent_cancellation_has_no_timing():
    rec = RequestRecord("r", "s", 0, 0, False, intended_send_ns=5)
    assemble(rec, StreamFacts(error="cancelled"))
    assert not rec.ok and rec.error == "cancelled"
    assert rec.e2e_ms is None and rec.ttft_ms is None and rec.dispatch_lag_ms is None


async def test_cancelled_mid_stream_keeps_its_chunks_and_e2e():
    """Over real HTTP: a stream that stalls after 3 tokens is cancelled; the record keeps
    what arrived and its E2E runs to the cancellation, by the same definition."""
    head = (_sse(_chunk({"role": "assistant", "content": ""}, 0))
            + b"".join(_sse(_chunk({"content": "w"}, i)) for i in (1, 2, 3)))
    sent = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(head)
        sent.set()
        await asyncio.sleep(30)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    rec = RequestRecord("r", "s", 0, 0, False)
    try:
        async with make_session(ClientConfig(base), 1) as s:
            task = asyncio.create_task(
                stream_request(s, base + "/v1/chat/completions", b"{}", rec, {}))
            await asyncio.wait_for(sent.wait(), 10)
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await server.close()
    assert rec.error == "cancelled" and not rec.ok and rec.status == 200
    assert rec.chunk_tokens == [1, 1, 1] and rec.osl == 3
    assert rec.tpot_ms is None  # only completed requests have a TPOT
    assert rec.e2e_ms == d.e2e_ms(rec.start_ns, rec.end_ns)
    assert rec.e2e_ms >= 50.0 > rec.ttft_ms
    s = summarize([orjson.loads(rec.to_json())], window_s=1.0)
    assert s["cancelled"] == 1 and s["completed"] == 0 and s["e2e_ms"]["count"] == 0
