"""Request bodies in, validated prompts and `SimRequest`s out, with vLLM's 400/404 bodies.

Field names, error wording and limits follow vLLM's OpenAI server (pydantic validation of
ChatCompletionRequest / CompletionRequest, the context-length check of its serving layer),
so a client's error handling can be tested against the simulator.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from . import protocol as P
from .config import SimConfig
from .kvcache import block_hashes
from .prompt import PromptEncoder
from .request import SimRequest
from .rxstamp import ReceiveStamps


class BadRequest(Exception):
    def __init__(self, body: bytes, status: int = 400) -> None:
        self.body, self.status = body, status


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


class RequestParser:
    """Validates bodies for one served model; `rng` draws each request's EOS position (shared
    with the response writer so a seeded simulator replays the same sequence of draws)."""

    def __init__(self, cfg: SimConfig, block_size: int, max_model_len: int, rng: random.Random,
                 rx: ReceiveStamps) -> None:
        self.cfg, self.bs, self.max_model_len, self.rng, self.rx = cfg, block_size, max_model_len, rng, rx
        self.model = cfg.model_name
        self.k = cfg.spec_k
        self.enc = PromptEncoder()

    async def body(self, request: web.Request) -> tuple[dict, int | None]:
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

    def check_model(self, body: dict) -> None:
        m = body.get("model")
        if m and m != self.model:  # like vLLM, a missing or empty model means the served one
            raise BadRequest(P.unknown_model(str(m), self.model), 404)

    def chat_ids(self, body: dict, add_gen: Any = True) -> tuple[np.ndarray, dict]:
        """Token ids of `messages` through the chat template, and the chat_template_kwargs."""
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

    def tokenize_ids(self, body: dict) -> np.ndarray:
        """POST /tokenize: `messages` (chat template) or a `prompt` string."""
        if "messages" in body:
            return self.chat_ids(body, body.get("add_generation_prompt", True))[0]
        if "prompt" in body:
            p = body["prompt"]
            if not isinstance(p, str):
                raise BadRequest(P.bad_field("prompt", "string_type", "Input should be a valid string", p))
            return self.enc.text(p)
        raise BadRequest(P.bad_field("prompt", "missing", "Field required", body))

    def completion_prompts(self, body: dict) -> list[np.ndarray]:
        """/v1/completions `prompt`: a string, token ids, or a list of either (one choice each)."""
        p = body.get("prompt")
        if isinstance(p, str):
            return [self.enc.text(p)]
        if _token_ids(p):
            return [np.asarray(p, dtype=np.uint32)]
        if isinstance(p, list) and p:
            out = []
            for i, q in enumerate(p):
                if isinstance(q, str):
                    out.append(self.enc.text(q))
                elif _token_ids(q):
                    out.append(np.asarray(q, dtype=np.uint32))
                else:
                    raise BadRequest(P.bad_field(f"prompt.{i}", "union_type",
                                                 "Input should be a string or a list of token ids", q))
            return out
        raise BadRequest(P.bad_field("prompt", "union_type",
                                     "Input should be a string, a list of token ids, or a list of those", p))

    @staticmethod
    def int_field(body: dict, name: str, lo: int) -> int | None:
        v = body.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(P.bad_field(name, "int_type", "Input should be a valid integer", v))
        if v < lo:
            raise BadRequest(P.bad_field(name, "greater_than_equal",
                                         f"Input should be greater than or equal to {lo}", v))
        return v

    def new_request(self, body: dict, ids: np.ndarray, rid: str, session: str | None,
                    arrival_ns: int, arrival_wall: int) -> SimRequest:
        max_tokens = self.int_field(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = self.int_field(body, "max_tokens", 1)
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
        return SimRequest(rid=rid, prompt_len=n_prompt, max_tokens=max_tokens,
                          block_hashes=block_hashes(ids, self.bs, salt), ignore_eos=ignore_eos,
                          eos_at=None if ignore_eos else self._eos_at(max_tokens), session=session,
                          arrival_ns=arrival_ns, arrival_wall_ns=arrival_wall)

    def _eos_at(self, max_tokens: int) -> int | None:
        """Geometric number of tokens until a sampled EOS (the EOS token itself counted),
        None when it falls at or beyond max_tokens."""
        p = self.cfg.eos_prob
        if p <= 0:
            return None
        u = self.rng.random()
        n = int(np.log1p(-u) / np.log1p(-p)) + 1 if p < 1 else 1
        return n if n < max_tokens else None
