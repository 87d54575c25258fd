"""Streaming OpenAI-compatible requests: one request in, one filled RequestRecord out.

Builds request bodies, sends them through the wire client (`wire.HTTPClient`), classifies the
outcome and hands the raw facts to `assemble`, which computes the metrics
(`metrics.definitions`). Timing rules (docs/metrics.md): start = monotonic ns right before a
connection is taken for the request (a new connection's set-up counts, as in vLLM's bench
client); every read is timestamped when it arrives, before de-chunking, SSE splitting or JSON
parsing; token accounting is `sse.StreamDecoder`'s.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from ..records import RequestRecord
from .assemble import assemble
from .config import ClientConfig
from .facts import StreamFacts
from .sse import StreamDecoder
from .wire import HTTPClient, HTTPError, RequestBody

__all__ = ["ClientConfig", "HTTPClient", "chat_body", "completion_body", "first_model",
           "get_json", "make_session", "post_json", "probe_error", "stream_request"]

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


async def first_model(session: HTTPClient | aiohttp.ClientSession, base_url: str,
                      timeout_s: float | None = None) -> tuple[str, int | None]:
    """The first model the server lists, and its max_model_len when it says. `timeout_s`
    bounds the whole probe (connect, headers, body): the session's per-read timeout is meant
    for long streams, and a server that accepts the connection but never answers would
    otherwise hold start-up for that long."""
    kw = {"timeout": aiohttp.ClientTimeout(total=timeout_s)} if timeout_s else {}
    data = await get_json(session, base_url.rstrip("/") + "/v1/models", **kw)
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    m = models[0]
    return m["id"], m.get("max_model_len")


async def server_version(session: HTTPClient | aiohttp.ClientSession, base_url: str,
                         timeout_s: float | None = None) -> dict:
    """GET /version: {"version": "0.32.0"} from vLLM (None values when it does not say: a
    label for results, never a reason to fail), and `simulator_profile` when the server is
    agentx's simulator (it adds {"agentx_simulator": {"profile": ..., "gpus": TP}}), with
    `simulator_gpus`, the GPUs it simulates."""
    kw = {"timeout": aiohttp.ClientTimeout(total=timeout_s)} if timeout_s else {}
    try:
        doc = await get_json(session, base_url.rstrip("/") + "/version", **kw)
    except Exception:  # noqa: BLE001 - any failure means "not said"
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    sim = doc.get("agentx_simulator")
    v = doc.get("version")
    gpus = sim.get("gpus") if isinstance(sim, dict) else None
    return {"version": str(v)[:100] if v is not None else None,
            "simulator_profile": str(sim.get("profile"))[:100] if isinstance(sim, dict)
            else None,
            "simulator_gpus": gpus if type(gpus) is int and gpus > 0 else None}


def probe_error(exc: BaseException, what: str, timeout_s: float | None) -> str:
    """One line saying which start-up probe failed and how, for an InputError."""
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return (f"no answer to {what} within {timeout_s:g} s (the server accepts connections "
                "but does not respond; raise --connect-timeout if it is only slow)")
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) \
            else exc.os_error.strerror or str(exc.os_error)
        return f"cannot connect for {what}: {why} (is the server running at this address?)"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{what} answered HTTP {exc.status} {exc.message}"
    return f"{what} failed: {type(exc).__name__}: {exc}"


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
    they become rec.error; a cancellation is recorded as `cancelled` and re-raised. Returns
    the generated text when keep_text (live history). `body` is released once the response
    has begun (see RequestBody)."""
    facts = StreamFacts(start_wall_ns=time.time_ns())
    dec = StreamDecoder(facts, keep_text, rec.osl_intended)
    req = RequestBody(body)
    del body
    try:
        await session.stream(url, req, headers, dec)
        facts.end_ns = perf_ns()
        if facts.status != 200:
            facts.error = f"http_{facts.status}"
            facts.error_detail = facts.error_body.decode("utf-8", "replace")
        elif not dec.seen_done and facts.error is None:
            facts.error = "incomplete"
            facts.error_detail = "stream ended without [DONE]"
    except HTTPError as exc:
        facts.error = exc.kind
        facts.error_detail = str(exc)[:300]
    except asyncio.CancelledError:
        facts.error = "cancelled"
        raise
    finally:
        if not facts.end_ns:
            facts.end_ns = perf_ns()
        if not facts.start_ns:
            facts.start_ns = facts.end_ns
        dec.finish()
        assemble(rec, facts)
    return dec.text if keep_text and facts.status == 200 else None
