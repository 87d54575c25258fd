"""The streaming client against real vLLM bytes served over real HTTP.

The captured vLLM 0.32 streams are replayed by a local aiohttp server, cut into reads at
awkward byte boundaries, so the SSE splitter, usage-based token counting and the record's
derived fields are checked on exactly what vLLM sends.
"""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from agentx.client.http import ClientConfig, make_session, stream_request
from agentx.records import RequestRecord
from helpers import SSESplitter, serve_chat, sse_events


async def _serve(raw: bytes, cut: int, gap_s: float, status: int = 200):
    async def handler(request: web.Request) -> web.StreamResponse:
        if status != 200:
            return web.Response(status=status, body=raw, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(raw), cut):
            await resp.write(raw[i:i + cut])
            await asyncio.sleep(gap_s)
        return resp

    return await serve_chat(handler)


async def _run(raw: bytes, cut: int = 97, gap_s: float = 0.001, status: int = 200):
    runner, base = await _serve(raw, cut, gap_s, status)
    try:
        async with make_session(ClientConfig(base), 1) as s:
            rec = RequestRecord("r1", "s1", 0, 0, False)
            await stream_request(s, base + "/v1/chat/completions", b"{}", rec, {})
            return rec
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("name", ["chat_stream_1.sse", "chat_stream_2.sse"])
@pytest.mark.parametrize("cut", [1, 7, 97, 100000])
async def test_vllm_stream_parsed_exactly(samples_dir, name, cut):
    raw = (samples_dir / name).read_bytes()
    events = sse_events(raw)
    final = events[-1]
    rec = await _run(raw, cut=cut, gap_s=0 if cut < 10 else 0.001)
    assert rec.ok and rec.error is None
    assert rec.osl == final["usage"]["completion_tokens"]
    assert rec.isl == final["usage"]["prompt_tokens"]
    assert rec.cached_tokens == final["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert rec.server_ttft_ms == final["metrics"]["time_to_first_token_ms"]
    # tokens per chunk come from usage deltas: they add up to the output length and the
    # multi-token chunks of ngram speculation are seen as such
    token_chunks = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    expected_k = []
    prev = 0
    for e in token_chunks:
        expected_k.append(e["usage"]["completion_tokens"] - prev)
        prev = e["usage"]["completion_tokens"]
    if cut >= 97:  # one chunk per read at most: every chunk is seen with its own timestamp
        assert rec.chunk_tokens == expected_k
    assert sum(rec.chunk_tokens) == rec.osl
    assert max(expected_k) > 1
    assert rec.finish_reason == "length"
    assert rec.ttft_ms is not None and rec.ttft_ms <= rec.e2e_ms
    assert rec.tpot_ms == pytest.approx((rec.e2e_ms - rec.ttft_ms) / (rec.osl - 1))


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["CRLF", "CR"])
@pytest.mark.parametrize("cut", [1, 7, 97])
async def test_vllm_stream_with_crlf_or_cr_line_ends(samples_dir, eol, cut):
    """The same vLLM bytes with every LF turned into CRLF or a lone CR (SSE allows all three):
    the same record, whatever read a CRLF is split across."""
    raw = (samples_dir / "chat_stream_1.sse").read_bytes()
    want = await _run(raw, cut=97)
    rec = await _run(raw.replace(b"\n", eol), cut=cut, gap_s=0 if cut < 10 else 0.001)
    assert rec.ok, rec.error_detail
    assert (rec.osl, rec.isl, rec.cached_tokens, rec.finish_reason) == \
        (want.osl, want.isl, want.cached_tokens, want.finish_reason)
    assert sum(rec.chunk_tokens) == sum(want.chunk_tokens)
    if cut >= 97:
        assert rec.chunk_tokens == want.chunk_tokens


async def test_error_body_becomes_error_class(samples_dir):
    raw = (samples_dir / "error_bad_request.json").read_bytes()
    rec = await _run(raw, status=400)
    assert not rec.ok and rec.error == "http_400" and "validation error" in rec.error_detail


async def test_stream_cut_before_done_is_incomplete(samples_dir):
    raw = (samples_dir / "chat_stream_1.sse").read_bytes()
    rec = await _run(raw[: raw.index(b"data: [DONE]")])
    assert not rec.ok and rec.error == "incomplete"


async def test_connection_refused_is_recorded_not_raised():
    async with make_session(ClientConfig("http://127.0.0.1:9"), 1) as s:
        rec = RequestRecord("r1", "s1", 0, 0, False)
        await stream_request(s, "http://127.0.0.1:9/v1/chat/completions", b"{}", rec, {})
    assert rec.error == "connect" and not rec.ok


def test_sse_splitter_handles_crlf_comments_and_partial_events():
    sp = SSESplitter()
    assert sp.feed(b": keep-alive\r\n\r\ndata: {\"a\"") == []
    assert sp.feed(b": 1}\r\n\r\ndata: [DONE]\r\n\r\n") == [b'{"a": 1}', b"[DONE]"]
    assert sp.pending == b""
