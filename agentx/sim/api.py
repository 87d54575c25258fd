"""HTTP front end of the simulator: vLLM's OpenAI-compatible routes on aiohttp.

`SimServer` owns the engine (sim/build.py assembles it from the SimConfig), the fault plan
and the truth log; `build_app()` makes the aiohttp application (served by `server.serve()`,
standalone or embedded). Bodies are validated by sim/parse.py, responses written by
sim/respond.py. Endpoints: /health /ping /version /v1/models /tokenize /detokenize /metrics
/reset_prefix_cache /v1/chat/completions /v1/completions.
"""
from __future__ import annotations

import asyncio
import random
import time
import uuid

import orjson
from aiohttp import web

from . import protocol as P
from .build import build_engine
from .config import SimConfig
from .faults import MESSAGES, STATUS_KINDS, FaultPlan
from .frontend import ServedFrontEnd
from .parse import BadRequest, RequestParser
from .receive_stamps import ReceiveStamps
from .respond import JSON, ResponseWriter
from .truthlog import TruthLog


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON)


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.built = build_engine(cfg)
        self.res, self.engine, self.stats = self.built.res, self.built.engine, self.built.stats
        self.model = cfg.model_name
        self.max_model_len = self.built.max_model_len
        self.faults = FaultPlan(cfg.fail_rate, tuple(cfg.fail_kinds), cfg.seed)
        self.truth = TruthLog(cfg.truth_log) if cfg.truth_log else None
        self.rx = ReceiveStamps()  # when each request's bytes were read (serve() installs it)
        rng = random.Random(cfg.seed)
        self.parse = RequestParser(cfg, self.res.block_size, self.max_model_len, rng, self.rx)
        self.respond = ResponseWriter(cfg, rng, self.truth)
        self.front = ServedFrontEnd(self.built.frontend, cfg.time_scale)

    def describe(self) -> str:
        return self.built.describe()

    # ------------------------------------------------------------------ app
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.parse.max_body, middlewares=[self._auth])
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
        self.parse.close()
        if self.truth is not None:
            self.truth.close()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if not request.body_exists:
            self.rx.take(request.transport)  # all read already; bodies claim theirs in parse.body
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
        # vLLM's answer is {"version": ...}; the extra key tells agentx's reports that this
        # "vLLM 0.32.0" is the simulator, with which profile and on how many GPUs (its TP:
        # the per-GPU figures divide by it)
        return _json(orjson.dumps({"version": P.VLLM_VERSION,
                                   "agentx_simulator": {"profile": self.cfg.profile,
                                                        "gpus": self.res.tp}}))

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
        return web.Response(body=self.stats.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.reset_prefix_cache()
        return web.Response(status=200)

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            _, ids, _, _ = await self.parse.read(request, "tokenize")
        except BadRequest as e:
            return _json(e.body, e.status)
        return _json(orjson.dumps({"count": int(len(ids)), "max_model_len": self.max_model_len,
                                   "tokens": ids.tolist(), "token_strs": None}))

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            _, text, _, _ = await self.parse.read(request, "detokenize")
        except BadRequest as e:
            return _json(e.body, e.status)
        return _json(orjson.dumps({"prompt": text}))

    # ------------------------------------------------------------ generation endpoints
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _front_end(self, reqs: list, since_ns: int) -> None:
        """Hold the requests in the modelled API server (HTTP, template, tokenisation; a queue
        shared by all requests, sim/frontend.py) until it has done their work, counted from when
        their bytes arrived, so our own parsing is part of it."""
        if self.cfg.fixed_ttft_ms is not None:
            return
        tokens = sum(r.prompt_len for r in reqs)
        work = self.built.frontend.work(tokens)
        if work > 0:
            await self.front.hold(work, max(0.0, (time.perf_counter_ns() - since_ns) / 1e9),
                                  self.built.frontend.reads(tokens))

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival_ns, arrival_wall = time.perf_counter_ns(), time.time_ns()
        hdr_rid = request.headers.get("X-Request-ID")  # case-insensitive lookup
        parse = self.parse
        try:
            body, prompts, tk, received_ns = await parse.read(request, "chat" if chat else "completions")
            thinking = chat and bool(tk.get("enable_thinking", self.cfg.default_thinking))
            base = hdr_rid or uuid.uuid4().hex[:16]
            rid = ("chatcmpl-" if chat else "cmpl-") + base
            session = request.headers.get("X-Session-ID") or body.get("session_id")
            reqs = [parse.new_request(body, ids, base if i == 0 else f"{base}-{i}", session, arrival_ns, arrival_wall)
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
            self.respond.log_truth(reqs[0], chat, stream, [], None, fault, 0)
            return _json(P.error_body(code, MESSAGES[code]), code)
        if fault == "slow-headers":
            await asyncio.sleep(self.cfg.slow_headers_s)
        await self._front_end(reqs, received_ns or arrival_ns)
        for r in reqs:
            self.engine.submit(r)
        try:
            if stream:
                return await self.respond.stream(request, reqs, rid, chat, thinking, so, fault)
            return await self.respond.complete(request, reqs, rid, chat, thinking, fault)
        finally:
            for r in reqs:
                self.engine.abort(r)  # no-op when finished; frees KV when the client vanished
