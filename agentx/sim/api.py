"""HTTP front end of the simulator: vLLM's OpenAI-compatible API on aiohttp, driving `Engine`.

`SimServer` owns one engine, its stats, the fault plan and the truth log; `build_app()` makes
the aiohttp application (served by `server.serve()`, standalone or embedded).
Endpoints: /health /version /v1/models /tokenize /detokenize /metrics /reset_prefix_cache
/v1/chat/completions /v1/completions.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
import uuid
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from . import protocol as P
from .config import SimConfig
from .engine import Engine
from .faults import MESSAGES, STATUS_KINDS, FaultPlan
from .kvcache import block_hashes
from .offload import OffloadTier
from .profile import Resolved, resolve
from .prompt import PromptEncoder, output_words
from .request import SimRequest
from .rxstamp import ReceiveStamps
from .specdec import Acceptance, default_rates, rates_from_length
from .stats import EngineStats
from .timing import StepTiming
from .truthlog import TruthLog

JSON = "application/json"


class BadRequest(Exception):
    def __init__(self, body: bytes, status: int = 400) -> None:
        self.body, self.status = body, status


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON)


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.res: Resolved = resolve(cfg)
        r = self.res
        self.model = cfg.model_name
        self.max_model_len = min(cfg.max_model_len, r.kv_pool_tokens)
        self.enc = PromptEncoder()
        self.words = output_words()
        self.rng = random.Random(cfg.seed)
        self.k = cfg.spec_k
        spec = None
        if self.k:
            if cfg.synthetic_rates is not None:
                rates = list(cfg.synthetic_rates)
            elif cfg.synthetic_al is not None:
                rates = rates_from_length(cfg.synthetic_al, self.k)
            else:
                rates = default_rates(self.k)
            spec = Acceptance(self.k, rates, seed=cfg.seed + 1)
        self.spec = spec
        offload = None
        if cfg.kv_offload != "none":
            eager = (cfg.offload_store == "eager") if cfg.offload_store else cfg.kv_offload == "mooncake"
            offload = OffloadTier(r.offload_blocks, r.block_size, eager=eager)
        self.stats = EngineStats(model=self.model, engine=cfg.engine_id, max_model_len=self.max_model_len,
                                 max_batched=r.max_num_batched_tokens, spec_k=self.k, offload=cfg.kv_offload)
        self.stats.set_cache_config(self._cache_config_labels())
        if offload is not None:
            self.stats.set_offload_info(r.offload_blocks, lazy=not offload.eager)
        self.timing = StepTiming(r, self.k, offload=cfg.kv_offload)
        fixed = cfg.fixed_ttft_ms is not None
        self.engine = Engine(num_blocks=r.num_gpu_blocks, block_size=r.block_size, max_num_seqs=r.max_num_seqs,
                             max_batched_tokens=r.max_num_batched_tokens, timing=self.timing, stats=self.stats,
                             time_scale=cfg.time_scale, spec=spec, offload=offload,
                             fixed_ttft_s=cfg.fixed_ttft_ms / 1e3 if fixed else None,
                             fixed_itl_s=cfg.fixed_itl_ms / 1e3 if fixed else None, seed=cfg.seed)
        self.faults = FaultPlan(cfg.fail_rate, tuple(cfg.fail_kinds), cfg.seed)
        self.truth = TruthLog(cfg.truth_log) if cfg.truth_log else None
        self.rx = ReceiveStamps()  # when each request's bytes were read (serve() installs it)
        self._n = 0

    def _cache_config_labels(self) -> dict[str, str]:
        r, cfg = self.res, self.cfg
        backend = {"none": "native", "simple-cpu": "SimpleCPUOffloadConnector",
                   "mooncake": "MooncakeStoreConnector"}[cfg.kv_offload]
        return {"block_size": str(r.block_size), "cache_dtype": "fp8" if r.profile.model.kv_bytes == 1 else "auto",
                "enable_prefix_caching": "True", "engine": cfg.engine_id,
                "gpu_memory_utilization": str(r.gpu_memory_utilization),
                "kv_cache_memory_bytes": str(int(r.kv_pool_bytes_rank)),
                "kv_cache_size_tokens": str(r.kv_pool_tokens),
                "kv_cache_max_concurrency": f"{r.kv_pool_tokens / self.max_model_len:.1f}",
                "kv_offloading_backend": backend,
                "kv_offloading_size": "None" if cfg.kv_offload == "none" else f"{r.offload_bytes / 1e9:g}",
                "num_cpu_blocks": "None" if cfg.kv_offload == "none" else str(r.offload_blocks),
                "num_gpu_blocks": str(r.num_gpu_blocks), "num_gpu_blocks_override": "None",
                "prefix_caching_hash_algo": "builtin", "sliding_window": "None",
                "user_specified_block_size": str(cfg.block_size is not None)}

    def describe(self) -> str:
        r = self.res
        return (f"agentx sim: profile {r.profile.name} TP{r.tp}, GPU KV cache size: {r.kv_pool_tokens:,} tokens "
                f"({r.num_gpu_blocks} blocks of {r.block_size}), max_model_len {self.max_model_len:,}, "
                f"spec K={self.k}, offload {self.cfg.kv_offload}"
                + (f" ({r.offload_blocks} CPU blocks)" if self.cfg.kv_offload != "none" else "")
                + f", time_scale {self.cfg.time_scale:g}")

    # ------------------------------------------------------------------ app
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _startup(self, app: web.Application) -> None:
        self.engine.start()

    async def _shutdown(self, app: web.Application) -> None:
        await self.engine.stop()
        if self.truth is not None:
            self.truth.close()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if not request.body_exists:
            self.rx.take(request.transport)  # all read already; bodies claim theirs in _body
        key = self.cfg.api_key
        if key and request.path.startswith("/v1"):
            if request.headers.get("Authorization", "") != f"Bearer {key}":
                self.rx.take(request.transport)
                return _json(orjson.dumps({"error": "Unauthorized"}), 401)
        return await handler(request)

    # ------------------------------------------------------------ small endpoints
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json(orjson.dumps({"version": P.VLLM_VERSION}))

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        return _json(orjson.dumps({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": created, "owned_by": "vllm", "root": self.model,
            "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}]}]}))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.stats.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.pool.reset()
        if self.engine.offload is not None:
            self.engine.offload.blocks.clear()
        return web.Response(status=200)

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body, _ = await self._body(request)
            self._check_model(body)
            if "messages" in body:
                ids, _ = self._chat_ids(body, body.get("add_generation_prompt", True))
            elif "prompt" in body:
                p = body["prompt"]
                if not isinstance(p, str):
                    raise BadRequest(P.bad_field("prompt", "string_type", "Input should be a valid string", p))
                ids = self.enc.text(p)
            else:
                raise BadRequest(P.bad_field("prompt", "missing", "Field required", body))
        except BadRequest as e:
            return _json(e.body, e.status)
        return _json(orjson.dumps({"count": int(len(ids)), "max_model_len": self.max_model_len,
                                   "tokens": ids.tolist(), "token_strs": None}))

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body, _ = await self._body(request)
            toks = body.get("tokens")
            if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
                raise BadRequest(P.bad_field("tokens", "list_type", "Input should be a valid list of integers", toks))
        except BadRequest as e:
            return _json(e.body, e.status)
        return _json(orjson.dumps({"prompt": self.enc.tok.decode(toks)}))

    # ------------------------------------------------------------ request parsing
    async def _body(self, request: web.Request) -> tuple[dict, int | None]:
        """The JSON body, and when its first bytes were read (claimed now that all are)."""
        raw = await request.read()
        received_ns = self.rx.take(request.transport)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise BadRequest(P.error_body(400, f"JSON decode error: {e}", param="body")) from None
        if not isinstance(body, dict):
            raise BadRequest(P.bad_field("", "dict_type", "Input should be a valid dictionary", body))
        return body, received_ns

    def _check_model(self, body: dict) -> None:
        m = body.get("model")
        if m and m != self.model:  # like vLLM, a missing or empty model means the served one
            raise BadRequest(P.unknown_model(str(m), self.model), 404)

    def _chat_ids(self, body: dict, add_gen: Any = True) -> tuple[np.ndarray, dict]:
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            raise BadRequest(P.bad_field("messages", "list_type", "Input should be a valid list", msgs))
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(P.bad_field(f"messages.{i}", "dict_type",
                                             "Input should be a message object with a 'role'", m))
        tk = body.get("chat_template_kwargs")
        if tk is None:
            tk = {}
        if not isinstance(tk, dict):
            raise BadRequest(P.bad_field("chat_template_kwargs", "dict_type", "Input should be a valid dictionary", tk))
        return self.enc.chat(msgs, bool(add_gen), tk), tk

    def _int_field(self, body: dict, name: str, lo: int) -> int | None:
        v = body.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(P.bad_field(name, "int_type", "Input should be a valid integer", v))
        if v < lo:
            raise BadRequest(P.bad_field(name, "greater_than_equal", f"Input should be greater than or equal to {lo}", v))
        return v

    def _new_request(self, body: dict, ids: np.ndarray, rid: str, session: str | None,
                     arrival_ns: int, arrival_wall: int) -> SimRequest:
        max_tokens = self._int_field(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = self._int_field(body, "max_tokens", 1)
        n_prompt = int(len(ids))
        if n_prompt == 0:
            raise BadRequest(P.bad_field("prompt", "value_error", "Prompt must not be empty", ""))
        if max_tokens is None:  # vLLM's default: whatever the context still holds
            max_tokens = max(1, self.max_model_len - n_prompt - self.k)
        if n_prompt + max_tokens + self.k > self.max_model_len:
            raise BadRequest(P.error_body(
                400, f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.", type_="BadRequestError",
                param="max_tokens"))
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise BadRequest(P.bad_field("cache_salt", "string_type", "Input should be a valid string", salt))
        ignore_eos = bool(body.get("ignore_eos", False))
        eos_at = None
        if not ignore_eos and self.cfg.eos_prob > 0:
            # geometric number of tokens until the sampled EOS (the EOS token itself is counted)
            u = self.rng.random()
            n = int(np.log1p(-u) / np.log1p(-self.cfg.eos_prob)) + 1 if self.cfg.eos_prob < 1 else 1
            if n < max_tokens:
                eos_at = n
        return SimRequest(rid=rid, prompt_len=n_prompt, max_tokens=max_tokens,
                          block_hashes=block_hashes(ids, self.res.block_size, salt), ignore_eos=ignore_eos,
                          eos_at=eos_at, session=session, arrival_ns=arrival_ns, arrival_wall_ns=arrival_wall)

    # ------------------------------------------------------------ generation endpoints
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival_ns, arrival_wall = time.perf_counter_ns(), time.time_ns()
        hdr_rid = request.headers.get("X-Request-ID")  # case-insensitive lookup
        try:
            body, received_ns = await self._body(request)
            self._check_model(body)
            thinking = False
            if chat:
                ids, tk = self._chat_ids(body)
                prompts = [ids]
                thinking = bool(tk.get("enable_thinking", self.cfg.default_thinking))
            else:
                prompts = self._completion_prompts(body)
            base = hdr_rid or uuid.uuid4().hex[:16]
            rid = ("chatcmpl-" if chat else "cmpl-") + base
            session = request.headers.get("X-Session-ID") or body.get("session_id")
            reqs = [self._new_request(body, ids, base if i == 0 else f"{base}-{i}", session, arrival_ns, arrival_wall)
                    for i, ids in enumerate(prompts)]
            for r in reqs:
                r.received_ns = received_ns or 0
            stream = bool(body.get("stream", False))
            so = body.get("stream_options") or {}
            if not isinstance(so, dict):
                raise BadRequest(P.bad_field("stream_options", "dict_type", "Input should be a valid dictionary", so))
        except BadRequest as e:
            return _json(e.body, e.status)
        fault = self.faults.pick(request.headers.get("X-Sim-Fault"))
        if fault in STATUS_KINDS:
            code = STATUS_KINDS[fault]
            self._log_truth(reqs[0], chat, stream, [], None, fault, 0)
            return _json(P.error_body(code, MESSAGES[code]), code)
        if fault == "slow-headers":
            await asyncio.sleep(self.cfg.slow_headers_s)
        for r in reqs:
            self.engine.submit(r)
        try:
            if stream:
                return await self._stream(request, reqs, rid, chat, thinking, so, fault)
            return await self._complete(request, reqs, rid, chat, thinking, fault)
        finally:
            for r in reqs:
                self.engine.abort(r)  # no-op when finished; frees KV when the client vanished

    def _completion_prompts(self, body: dict) -> list[np.ndarray]:
        p = body.get("prompt")
        if isinstance(p, str):
            return [self.enc.text(p)]
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return [np.asarray(p, dtype=np.uint32)]
        if isinstance(p, list) and p:
            out = []
            for i, q in enumerate(p):
                if isinstance(q, str):
                    out.append(self.enc.text(q))
                elif isinstance(q, list) and q and all(isinstance(t, int) and not isinstance(t, bool) for t in q):
                    out.append(np.asarray(q, dtype=np.uint32))
                else:
                    raise BadRequest(P.bad_field(f"prompt.{i}", "union_type",
                                                 "Input should be a string or a list of token ids", q))
            return out
        raise BadRequest(P.bad_field("prompt", "union_type",
                                     "Input should be a string, a list of token ids, or a list of those", p))

    def _reasoning_len(self, req: SimRequest, chat: bool, thinking: bool) -> int:
        return int(req.max_tokens * self.cfg.reasoning_fraction) if (chat and thinking) else 0

    def _words(self, start: int, n: int) -> str:
        w = self.words
        m = len(w)
        if n == 1:  # the common chunk: no generator
            return w[start % m]
        return "".join(w[(start + i) % m] for i in range(n))

    def _metrics(self, req: SimRequest) -> dict | None:
        if not self.cfg.per_request_metrics or not req.first_token_ns:
            return None
        return P.metrics_obj((req.first_token_ns - req.arrival_ns) / 1e6, (req.last_token_ns - req.first_token_ns) / 1e6,
                             ((req.scheduled_ns or req.arrival_ns) - req.arrival_ns) / 1e6, req.num_out)

    def _cached(self, req: SimRequest) -> int | None:
        return req.cached_device + req.cached_host if self.cfg.prompt_tokens_details else None

    async def _stream(self, request: web.Request, reqs: list[SimRequest], rid: str, chat: bool, thinking: bool,
                      so: dict, fault: str | None) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        headers_ns = time.perf_counter_ns()
        created = int(time.time())
        include_usage = bool(so.get("include_usage", False))
        continuous = include_usage and bool(so.get("continuous_usage_stats", False))
        try:
            if len(reqs) == 1:
                await self._stream_one(resp, reqs[0], 0, rid, created, chat, thinking, continuous, fault, headers_ns)
            else:
                await asyncio.gather(*(self._stream_one(resp, r, i, rid, created, chat, thinking, continuous,
                                                        fault if i == 0 else None, headers_ns)
                                       for i, r in enumerate(reqs)))
            if include_usage:
                w = P.ChunkWriter(chat=chat, rid=rid, created=created, model=self.model,
                                  prompt_tokens=sum(r.prompt_len for r in reqs), continuous_usage=False)
                cached = None if self._cached(reqs[0]) is None else sum(self._cached(r) for r in reqs)
                final = w.final_usage(sum(r.num_out for r in reqs), cached, sum(r.created_cache for r in reqs),
                                      self._metrics(reqs[0]))
                await resp.write(final + P.DONE)
            else:
                await resp.write(P.DONE)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        return resp

    async def _stream_one(self, resp: web.StreamResponse, req: SimRequest, index: int, rid: str, created: int,
                          chat: bool, thinking: bool, continuous: bool, fault: str | None, headers_ns: int) -> None:
        w = P.ChunkWriter(chat=chat, rid=rid, created=created, model=self.model, prompt_tokens=req.prompt_len,
                          continuous_usage=continuous, index=index)
        n_reason = self._reasoning_len(req, chat, thinking)
        start_word = self.rng.randrange(len(self.words))
        chunks: list[list[int]] = []
        first = chat
        sent = 0
        mid = max(1, req.max_tokens // 2)
        fault_pending = fault in ("reset", "stall", "malformed")
        finish = None
        try:
            while finish is None:
                events = await req.next_events()
                parts, counts = [], []
                for n, fin in events:
                    if first:
                        parts.append(w.role())
                        counts.append(0)
                        first = False
                    r = max(0, min(n, n_reason - sent))
                    parts.append(w.tokens(self._words(start_word + sent + r, n - r), sent + n, fin,
                                          reasoning=self._words(start_word + sent, r) if r else ""))
                    counts.append(n)
                    sent += n
                    if fin is not None:
                        finish = fin
                t = time.perf_counter_ns()
                await resp.write(b"".join(parts))
                chunks.extend([t, c] for c in counts)
                if fault_pending and finish is None and sent >= mid:
                    fault_pending = False
                    if fault == "reset":
                        self._log_truth(req, chat, True, chunks, "abort", fault, headers_ns)
                        _reset(resp)
                        raise ConnectionResetError("simulated reset")
                    if fault == "stall":
                        await asyncio.sleep(self.cfg.stall_s)
                    elif fault == "malformed":
                        t = time.perf_counter_ns()
                        await resp.write(w.head.encode() + b'"choices":[{"index":0,"delta":{"content":\n\n')
                        chunks.append([t, 0])
        finally:
            if finish is None:
                self._log_truth(req, chat, True, chunks, "abort", fault, headers_ns)
        self._log_truth(req, chat, True, chunks, finish, fault, headers_ns)

    async def _complete(self, request: web.Request, reqs: list[SimRequest], rid: str, chat: bool, thinking: bool,
                        fault: str | None) -> web.StreamResponse:
        finishes = []
        for req in reqs:
            fin = None
            while fin is None:
                for _, f in await req.next_events():
                    fin = f or fin
            finishes.append(fin)
        created = int(time.time())
        if fault == "reset":
            _reset_request(request)
            self._log_truth(reqs[0], chat, False, [], "abort", fault, 0)
            return web.Response(status=500)
        if fault == "stall":
            await asyncio.sleep(self.cfg.stall_s)
        req = reqs[0]
        texts = []
        for r in reqs:
            start = self.rng.randrange(len(self.words))
            texts.append(self._words(start, r.num_out))
        if chat:
            n_reason = min(self._reasoning_len(req, chat, thinking), req.num_out)
            words = texts[0]
            # split on word boundaries: every word is one token with a leading space
            toks = words.split(" ")[1:]
            reasoning = "".join(" " + x for x in toks[:n_reason]) if n_reason else None
            content = "".join(" " + x for x in toks[n_reason:])
            body = P.chat_response(rid=rid, created=created, model=self.model, content=content, reasoning=reasoning,
                                   finish=finishes[0], prompt=req.prompt_len, n_out=req.num_out,
                                   cached=self._cached(req), created_cache=req.created_cache,
                                   metrics=self._metrics(req))
        else:
            cached = None if self._cached(req) is None else sum(self._cached(r) for r in reqs)
            body = P.completion_response(rid=rid, created=created, model=self.model, text=texts[0],
                                         finish=finishes[0], prompt=sum(r.prompt_len for r in reqs),
                                         n_out=sum(r.num_out for r in reqs), cached=cached,
                                         metrics=self._metrics(req))
            if len(reqs) > 1:
                d = orjson.loads(body)
                d["choices"] = [{**d["choices"][0], "index": i, "text": texts[i], "finish_reason": finishes[i]}
                                for i in range(len(reqs))]
                body = orjson.dumps(d)
        if fault == "malformed":
            body = body[: len(body) // 2]
        t = time.perf_counter_ns()
        resp = web.Response(body=body, content_type=JSON)
        for r in reqs:
            self._log_truth(r, chat, False, [[t, r.num_out]], r.finish, fault, 0)
        return resp

    def _log_truth(self, req: SimRequest, chat: bool, stream: bool, chunks: list, finish: str | None,
                   fault: str | None, headers_ns: int) -> None:
        if self.truth is None or req.logged:
            return
        first = next((t for t, n in chunks if n > 0), None)
        self.truth.write({
            "request_id": req.rid, "session_id": req.session, "endpoint": "chat" if chat else "completions",
            "stream": stream, "arrival_wall_ns": req.arrival_wall_ns, "arrival_ns": req.arrival_ns,
            "received_ns": req.received_ns or None,
            "headers_ns": headers_ns or None, "scheduled_ns": req.scheduled_ns or None, "first_chunk_ns": first,
            "chunks": chunks, "prompt_tokens": req.prompt_len, "cached_tokens_device": req.cached_device,
            "cached_tokens_host": req.cached_host, "completion_tokens": req.num_out, "max_tokens": req.max_tokens,
            "preemptions": req.preemptions, "finish": finish, "fault": fault})
        req.logged = True


def _reset(resp: web.StreamResponse) -> None:
    """Abort the TCP connection with an RST (SO_LINGER 0), mid-stream."""
    tr = resp._req.transport if getattr(resp, "_req", None) is not None else None  # noqa: SLF001
    _abort_transport(tr)


def _reset_request(request: web.Request) -> None:
    _abort_transport(request.transport)


def _abort_transport(tr) -> None:
    if tr is None:
        return
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    tr.abort()
