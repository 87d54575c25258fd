"""Streaming OpenAI-compatible requests: one request in, one filled RequestRecord out.

Builds request bodies, sends them through the wire client (`wire.HTTPClient`) and derives
each record's metrics. Timing rules (docs/metrics.md): start = monotonic ns right before a
connection is taken for the request (a new connection's set-up counts, as in vLLM's bench
client); every read is timestamped when it arrives, before de-chunking, SSE splitting or JSON
parsing; token accounting is `sse.StreamDecoder`'s.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import aiohttp
import orjson

from ..records import RequestRecord
from .config import ClientConfig
from .sse import StreamDecoder
from .wire import HTTPClient, HTTPError, RequestBody

__all__ = ["ClientConfig", "HTTPClient", "make_session", "stream_request", "chat_body",
           "completion_body", "first_model", "get_json", "post_json", "finish_record"]

perf_ns = time.perf_counter_ns


def make_session(cfg: ClientConfig, lanes: int = 1) -> HTTPClient:
    """The client of one process (`lanes` is kept for callers; connections are per lane)."""
    return HTTPClient(cfg)


def _aio(session: Any) -> aiohttp.ClientSession:
    return session.aio if isinstance(session, HTTPClient) else session


async def get_json(session: HTTPClient | aiohttp.ClientSession, url: str, **kw: Any) -> Any:
    async with _aio(session).get(url, **kw) as r:
        r.raise_for_status()
        return orjson.loads(await r.read())


async def post_json(session: HTTPClient | aiohttp.ClientSession, url: str, body: dict) -> Any:
    async with _aio(session).post(url, data=orjson.dumps(body)) as r:
        r.raise_for_status()
        return orjson.loads(await r.read())


async def first_model(session: HTTPClient | aiohttp.ClientSession,
                      base_url: str) -> tuple[str, int | None]:
    """The first model the server lists, and its max_model_len when it says."""
    data = await get_json(session, base_url.rstrip("/") + "/v1/models")
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    m = models[0]
    return m["id"], m.get("max_model_len")


def chat_body(cfg: ClientConfig, messages: list[dict], max_tokens: int) -> dict:
    body: dict[str, Any] = {
        "model": cfg.model, "messages": messages, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": max_tokens, "ignore_eos": cfg.ignore_eos, "temperature": 0.0,
    }
    if cfg.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": cfg.thinking == "on"}
    if cfg.cache_salt:
        body["cache_salt"] = cfg.cache_salt
    if cfg.extra_body:
        body.update(cfg.extra_body)
    return body


def completion_body(cfg: ClientConfig, prompt_ids: list[int], max_tokens: int) -> dict:
    body: dict[str, Any] = {
        "model": cfg.model, "prompt": prompt_ids, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": max_tokens, "ignore_eos": cfg.ignore_eos, "temperature": 0.0,
    }
    if cfg.cache_salt:
        body["cache_salt"] = cfg.cache_salt
    if cfg.extra_body:
        body.update(cfg.extra_body)
    return body


async def stream_request(session: HTTPClient, url: str, body: bytes | Sequence[bytes],
                         rec: RequestRecord, headers: dict[str, str],
                         keep_text: bool = False) -> str | None:
    """Send one streaming request and fill `rec`. Never raises for server/network faults:
    they become rec.error; returns the generated text when keep_text (live history).
    `body` is released once the response has begun (see RequestBody)."""
    dec = StreamDecoder(rec, keep_text)
    req = RequestBody(body)
    del body
    rec.start_wall_ns = time.time_ns()
    try:
        resp = await session.stream(url, req, headers, dec, rec)
        rec.end_ns = perf_ns()
        rec.status = resp.status
        if resp.status != 200:
            rec.error = f"http_{resp.status}"
            rec.error_detail = b"".join(resp.err_body)[:300].decode("utf-8", "replace")
            return None
        if not dec.seen_done and rec.error is None:
            rec.error = "incomplete"
            rec.error_detail = "stream ended without [DONE]"
    except HTTPError as exc:
        rec.error = exc.kind
        rec.error_detail = str(exc)[:300]
    finally:
        if not rec.end_ns:
            rec.end_ns = perf_ns()
        if not rec.start_ns:
            rec.start_ns = rec.end_ns
        dec.finish()
        finish_record(rec)
    return dec.text if keep_text else None


def finish_record(rec: RequestRecord) -> None:
    """Derive the per-request metrics (definitions in docs/metrics.md)."""
    rec.osl_counted = sum(rec.chunk_tokens)
    if rec.osl is None and rec.osl_counted:
        rec.osl = rec.osl_counted
    rec.e2e_ms = (rec.end_ns - rec.start_ns) / 1e6
    if rec.first_token_ns:
        rec.ttft_ms = (rec.first_token_ns - rec.start_ns) / 1e6
    if rec.first_content_ns:
        rec.ttfc_ms = (rec.first_content_ns - rec.start_ns) / 1e6
    if rec.intended_send_ns:
        rec.dispatch_lag_ms = max(0, rec.start_ns - rec.intended_send_ns) / 1e6
    rec.ok = rec.error is None and rec.status == 200
    if rec.ok and rec.osl and rec.osl > 1 and rec.ttft_ms is not None:
        # vLLM's TPOT: (E2E - TTFT) / (output tokens - 1)
        rec.tpot_ms = (rec.e2e_ms - rec.ttft_ms) / (rec.osl - 1)
