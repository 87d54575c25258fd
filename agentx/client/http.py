"""Streaming OpenAI-compatible HTTP client: one request in, one filled RequestRecord out.

Timing rules (docs/metrics.md): start = monotonic ns right before the request is handed to
aiohttp; every read is timestamped as soon as the bytes are returned, before SSE splitting or
JSON parsing; a chunk's token count is the increase of `usage.completion_tokens` when the
server streams continuous usage (several tokens per chunk under speculative decoding), else 1
per chunk that carries text. `delta.reasoning` / `delta.reasoning_content` count as tokens.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..records import RequestRecord
from .sse import DONE, SSESplitter

perf_ns = time.perf_counter_ns


@dataclass
class ClientConfig:
    base_url: str
    model: str = ""
    api_key: str | None = None
    timeout_s: float = 600.0
    thinking: str | None = None  # on | off | None (server default)
    extra_body: dict = field(default_factory=dict)
    cache_salt: str | None = None
    ignore_eos: bool = True
    max_connections: int = 0  # 0: unlimited (the engine bounds concurrency itself)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def make_session(cfg: ClientConfig, lanes: int) -> aiohttp.ClientSession:
    """One session for the run, its pool sized to the load (a connection per lane + slack)."""
    limit = cfg.max_connections or max(16, lanes * 2 + 8)
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=None,
                                enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=cfg.timeout_s)
    return aiohttp.ClientSession(connector=conn, timeout=timeout, headers=cfg.headers(),
                                 json_serialize=lambda o: orjson.dumps(o).decode())


async def get_json(session: aiohttp.ClientSession, url: str, **kw: Any) -> Any:
    async with session.get(url, **kw) as r:
        r.raise_for_status()
        return orjson.loads(await r.read())


async def post_json(session: aiohttp.ClientSession, url: str, body: dict) -> Any:
    async with session.post(url, data=orjson.dumps(body)) as r:
        r.raise_for_status()
        return orjson.loads(await r.read())


async def first_model(session: aiohttp.ClientSession, base_url: str) -> tuple[str, int | None]:
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


def _classify(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                        ConnectionResetError)):
        return "reset"
    if isinstance(exc, aiohttp.ClientError):
        return "client_error"
    return type(exc).__name__


async def stream_request(session: aiohttp.ClientSession, url: str, body: bytes,
                         rec: RequestRecord, headers: dict[str, str],
                         keep_text: bool = False) -> str | None:
    """Send one streaming request and fill `rec`. Never raises for server/network faults:
    they become rec.error; returns the generated text when keep_text (live history)."""
    offsets = rec.chunk_offsets_ns
    tokens = rec.chunk_tokens
    splitter = SSESplitter()
    loads = orjson.loads
    text_parts: list[str] = [] if keep_text else None  # type: ignore[assignment]
    prev_usage = 0
    seen_done = False
    rec.start_wall_ns = time.time_ns()
    t0 = rec.start_ns = perf_ns()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            rec.status = resp.status
            if resp.status != 200:
                raw = await resp.read()
                rec.error = f"http_{resp.status}"
                rec.error_detail = raw[:300].decode("utf-8", "replace")
                return None
            read = resp.content.readany
            while True:
                data = await read()
                t = perf_ns()
                if not data:
                    break
                for payload in splitter.feed(data):
                    if payload == DONE:
                        seen_done = True
                        continue
                    try:
                        ev = loads(payload)
                    except orjson.JSONDecodeError:
                        rec.error = "malformed"
                        rec.error_detail = payload[:200].decode("utf-8", "replace")
                        continue
                    if "error" in ev and not ev.get("choices"):
                        rec.error = "stream_error"
                        rec.error_detail = str(ev["error"])[:300]
                        continue
                    usage = ev.get("usage")
                    k = 0
                    choices = ev.get("choices")
                    if choices:
                        ch = choices[0]
                        delta = ch.get("delta")
                        if delta is not None:
                            content = delta.get("content")
                            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                        else:  # /v1/completions
                            content, reasoning = ch.get("text"), None
                        if usage and usage.get("completion_tokens") is not None:
                            k = usage["completion_tokens"] - prev_usage
                            prev_usage = usage["completion_tokens"]
                        elif content or reasoning:
                            k = 1
                        if k > 0 or content or reasoning:
                            if not rec.first_token_ns:
                                rec.first_token_ns = t
                            if reasoning:
                                rec.reasoning_tokens += k
                            elif content and not rec.first_content_ns:
                                rec.first_content_ns = t
                            offsets.append(t - t0)
                            tokens.append(k)
                            if keep_text and content:
                                text_parts.append(content)
                        if ch.get("finish_reason"):
                            rec.finish_reason = ch["finish_reason"]
                    if usage:
                        _take_usage(rec, usage)
                        if not choices:
                            m = ev.get("metrics")
                            if m:
                                rec.server_ttft_ms = m.get("time_to_first_token_ms")
                                rec.server_queue_ms = m.get("queue_time_ms")
            rec.end_ns = perf_ns()
            if not seen_done and rec.error is None:
                rec.error = "incomplete"
                rec.error_detail = "stream ended without [DONE]"
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError) as exc:
        rec.error = _classify(exc)
        rec.error_detail = (str(exc) or type(exc).__name__)[:300]
    finally:
        if not rec.end_ns:
            rec.end_ns = perf_ns()
        _finish(rec)
    return "".join(text_parts) if keep_text else None


def _take_usage(rec: RequestRecord, usage: dict) -> None:
    if usage.get("prompt_tokens") is not None:
        rec.isl = usage["prompt_tokens"]
    if usage.get("completion_tokens") is not None:
        rec.osl = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if details and details.get("cached_tokens") is not None:
        rec.cached_tokens = details["cached_tokens"]


def _finish(rec: RequestRecord) -> None:
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
