"""Request bodies in, validated prompts and `SimRequest`s out, with vLLM's 400/404 bodies.

Field names, error wording and limits follow vLLM's OpenAI server (pydantic validation of
ChatCompletionRequest / CompletionRequest, the context-length check of its serving layer),
so a client's error handling can be tested against the simulator.

One request must not stall the others (they share one event loop). A body is at most
`max_body_bytes()` (413 otherwise, before it is read). A small body (up to INLINE_BYTES and
INLINE_OBJECTS `{`) is parsed and tokenized on the loop: ~10 ms at most. A larger one is
parsed and tokenized on one worker thread, with its own encoder, in pieces that hold the
interpreter lock a few ms at a time: orjson when the body's shape makes that cheap, else the
standard library's pure-Python scanner; tokenizing stops once the prompt is longer than the
model takes. Token ids outside the vocabulary are a 400, as in vLLM.
"""
from __future__ import annotations

import asyncio
import json
import json.scanner
import random
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from ..tokens.tokenizer import VOCAB_SIZE, BuiltinTokenizer
from . import protocol as P
from .config import SimConfig
from .kvcache import block_hashes
from .prompt import PromptEncoder
from .receive_stamps import ReceiveStamps
from .request import SimRequest

# A prompt the simulator accepts has at most max_model_len tokens. As JSON that is ~6 bytes a
# token as text (5.9 measured on agentx's prompts, real English through this word-level
# tokenizer alike) and at most 7 as a token-id list ("131071,"); per-message keys, escapes
# (\n, \", \u00e9) and tool definitions add to it. 16 bytes a token is twice the worst of those,
# so no request that could be served is refused: 16 MiB at the default 1M tokens, and never
# less than that for a smaller model (a client may send other fields, tools, padding).
BYTES_PER_TOKEN = 16
MIN_BODY_BYTES = 16 << 20
INLINE_BYTES = 256 << 10  # parsed on the loop up to here: orjson ~1 ms, tokenizing <= ~10 ms
INLINE_OBJECTS = 2048  # ... and up to this many `{` (messages: ~3.5 us each to render)
SWITCH_INTERVAL_S = 0.0005  # while the worker parses (as agentx/engine/drive.py's client)
MAX_PROMPTS = 2048  # prompts in one /v1/completions batch (OpenAI's limit): one request each
_PIECE = 64 << 10  # characters tokenized per regex call on the worker thread (~2 ms)
_SPLIT = re.compile(r"[\s<]")  # every whitespace char or `<` starts a token: a safe cut
# the body fields the handlers read; a big body's other fields are dropped on the worker
_FIELDS = ("model", "stream", "stream_options", "session_id", "max_tokens",
           "max_completion_tokens", "cache_salt", "ignore_eos")


def max_body_bytes(max_model_len: int) -> int:
    return max(MIN_BODY_BYTES, BYTES_PER_TOKEN * max_model_len)


class BadRequest(Exception):
    def __init__(self, body: bytes, status: int = 400) -> None:
        self.body, self.status = body, status


class _TooLong(Exception):
    """Tokenizing stopped: the prompt already holds more tokens than the model takes."""


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _ids_array(v: list, field: str) -> np.ndarray:
    """A token-id list as uint32; an id outside [0, VOCAB_SIZE) is vLLM's 400."""
    try:
        a = np.asarray(v, dtype=np.int64)
    except OverflowError:
        a = None
    if a is None or a.min() < 0 or a.max() >= VOCAB_SIZE:
        bad = next(t for t in v if not 0 <= t < VOCAB_SIZE)
        raise BadRequest(P.error_body(400, f"Token id {bad} is out of vocabulary",
                                      type_="BadRequestError", param=field))
    return a.astype(np.uint32)


def _cheap_for_orjson(raw: bytes) -> bool:
    """orjson holds the interpreter lock for the whole parse: ~0.3 us per container, ~30 ns
    per number. True when that stays under ~50 ms (`[`, `{` and `,` inside strings count too,
    which errs towards the slower, lock-sharing parser)."""
    return 10 * (raw.count(b"[") + raw.count(b"{")) + raw.count(b",") <= 1_700_000


def _prompt_count(body: dict, kind: str) -> int:
    """How many prompts a request holds (a /v1/completions batch: one choice each)."""
    p = body.get("prompt")
    batch = kind == "completions" and isinstance(p, list) and p and isinstance(p[0], (str, list))
    return min(len(p), MAX_PROMPTS) if batch else 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _py_loads(raw: bytes) -> Any:
    """json.loads in Python bytecode (strings still scanned in C): slow, but it lets the event
    loop's thread take the interpreter lock every few ms, as orjson or the C scanner do not."""
    dec = json.JSONDecoder(parse_constant=_no_constant)
    dec.scan_once = json.scanner.py_make_scanner(dec)
    return dec.decode(raw.decode("utf-8"))


class _PieceTokenizer:
    """The worker thread's tokenizer: long texts in pieces cut before a token start (same ids
    as one call), and a token budget per request (`left`) that stops an overlong prompt."""

    def __init__(self, tok: BuiltinTokenizer) -> None:
        self.tok, self.left = tok, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        start, n = 0, len(text)
        while start < n:
            m = _SPLIT.search(text, start + _PIECE) if start + _PIECE < n else None
            end = m.start() if m else n
            out += self.tok.encode(text[start:end])
            if len(out) > self.left:
                raise _TooLong
            start = end
        self.left -= len(out)
        return out


class RequestParser:
    """Validates bodies for one served model; `rng` draws each request's EOS position (shared
    with the response writer so a seeded simulator replays the same sequence of draws)."""

    def __init__(self, cfg: SimConfig, block_size: int, max_model_len: int, rng: random.Random,
                 rx: ReceiveStamps) -> None:
        self.cfg, self.bs, self.max_model_len, self.rng, self.rx = cfg, block_size, max_model_len, rng, rx
        self.model = cfg.model_name
        self.k = cfg.spec_k
        self.enc = PromptEncoder()
        self.max_body = max_body_bytes(max_model_len)
        self._pool: ThreadPoolExecutor | None = None
        self._enc_big: PromptEncoder | None = None  # the worker thread's own (and cache)
        self._big, self._switch = 0, 0.005  # big bodies in flight; the switch interval before

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def read(self, request: web.Request, kind: str) -> tuple[dict, Any, dict, int | None]:
        """A request's body, what `kind` makes of it, its chat_template_kwargs, and when its
        first bytes were read (claimed once all are). `kind`: "chat" or "completions" (token
        ids of each prompt), "tokenize" (ids) or "detokenize" (text)."""
        raw, received_ns = await self._raw(request)
        if len(raw) <= INLINE_BYTES and raw.count(b"{") <= INLINE_OBJECTS:
            body = self._load(raw, orjson.loads)
            out, tk = self._interpret(body, kind, self.enc)
            return body, out, tk, received_ns
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="sim-parse")
        if not self._big:  # the loop's thread gets the lock back within 0.5 ms, not 5 ms
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL_S))
        self._big += 1
        try:
            body, out, tk = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._parse_big, raw, kind)
        finally:
            self._big -= 1
            if not self._big:
                sys.setswitchinterval(self._switch)
        return body, out, tk, received_ns

    async def _raw(self, request: web.Request) -> tuple[bytes, int | None]:
        size = request.content_length
        try:
            if size is not None and size > self.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=size)
            raw = await request.read()  # a chunked body stops at client_max_size == max_body
        except web.HTTPRequestEntityTooLarge:
            self.rx.take(request.transport)
            raise BadRequest(P.too_large(size, self.max_body, self.max_model_len), 413) from None
        return raw, self.rx.take(request.transport)

    def _parse_big(self, raw: bytes, kind: str) -> tuple[dict, Any, dict]:
        """_load and _interpret on the worker thread, its tokenizer stopping at max_model_len
        tokens a prompt. Only the fields the handlers read go back to the loop,
        and an error goes back as a fresh exception: the first one's frames hold the body,
        and freeing a hostile body's millions of objects is work the loop must not do."""
        if self._enc_big is None:
            self._enc_big = PromptEncoder()
            self._enc_big.tok = _PieceTokenizer(self._enc_big.tok)
        enc = self._enc_big
        error = None
        try:
            body = self._load(raw, orjson.loads if _cheap_for_orjson(raw) else _py_loads)
            enc.tok.left = self.max_model_len * _prompt_count(body, kind)
            out, tk = self._interpret(body, kind, enc)
            return {k: body[k] for k in _FIELDS if k in body}, out, tk
        except BadRequest as e:
            error = BadRequest(e.body, e.status)
        except _TooLong:
            error = BadRequest(P.error_body(
                400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"the prompt alone holds more than {self.max_model_len} tokens (tokenizing stopped "
                "there). Please reduce the length of the messages or prompt.",
                type_="BadRequestError", param="messages" if kind == "chat" else "prompt"))
        raise error

    @staticmethod
    def _load(raw: bytes, loads) -> dict:
        try:
            body = loads(raw)
        except (ValueError, RecursionError) as e:  # orjson's and json's JSONDecodeError too
            raise BadRequest(P.error_body(400, f"JSON decode error: {e}", param="body")) from None
        if not isinstance(body, dict):
            raise BadRequest(P.bad_field("", "dict_type", "Input should be a valid dictionary", body))
        return body

    def _interpret(self, body: dict, kind: str, enc: PromptEncoder) -> tuple[Any, dict]:
        if kind == "detokenize":
            return self.detokenize(body, enc), {}
        self.check_model(body)
        if kind == "chat":
            ids, tk = self.chat_ids(body, enc=enc)
            return [ids], tk
        if kind == "completions":
            return self.completion_prompts(body, enc), {}
        return self.tokenize_ids(body, enc), {}

    def check_model(self, body: dict) -> None:
        m = body.get("model")
        if m and m != self.model:  # like vLLM, a missing or empty model means the served one
            raise BadRequest(P.unknown_model(str(m), self.model), 404)

    def chat_ids(self, body: dict, add_gen: Any = True, enc: PromptEncoder | None = None
                 ) -> tuple[np.ndarray, dict]:
        """Token ids of `messages` through the chat template, and the chat_template_kwargs."""
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            raise BadRequest(P.bad_field("messages", "list_type", "Input should be a valid list", msgs))
        most = self.max_model_len // BuiltinTokenizer.MESSAGE_OVERHEAD
        if len(msgs) > most:  # each costs the template's tokens: this many can never fit
            raise BadRequest(P.error_body(
                400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"the request has {len(msgs)} messages, and each takes at least "
                f"{BuiltinTokenizer.MESSAGE_OVERHEAD} (at most {most} fit). Please reduce the "
                "number of messages.", type_="BadRequestError", param="messages"))
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(P.bad_field(f"messages.{i}", "dict_type",
                                             "Input should be a message object with a 'role'", m))
        tk = body.get("chat_template_kwargs")
        if tk is None:
            tk = {}
        if not isinstance(tk, dict):
            raise BadRequest(P.bad_field("chat_template_kwargs", "dict_type", "Input should be a valid dictionary", tk))
        return (enc or self.enc).chat(msgs, bool(add_gen), tk), tk

    def tokenize_ids(self, body: dict, enc: PromptEncoder | None = None) -> np.ndarray:
        """POST /tokenize: `messages` (chat template) or a `prompt` string."""
        if "messages" in body:
            return self.chat_ids(body, body.get("add_generation_prompt", True), enc)[0]
        if "prompt" in body:
            p = body["prompt"]
            if not isinstance(p, str):
                raise BadRequest(P.bad_field("prompt", "string_type", "Input should be a valid string", p))
            return (enc or self.enc).text(p)
        raise BadRequest(P.bad_field("prompt", "missing", "Field required", body))

    def detokenize(self, body: dict, enc: PromptEncoder | None = None) -> str:
        """POST /detokenize: the text of `tokens` (ids in the vocabulary, at most max_model_len)."""
        toks = body.get("tokens")
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            raise BadRequest(P.bad_field("tokens", "list_type", "Input should be a valid list of integers", toks))
        if len(toks) > self.max_model_len:
            raise BadRequest(P.bad_field("tokens", "too_long", f"List should have at most "
                                         f"{self.max_model_len} items", len(toks)))
        return (enc or self.enc).tok.decode(_ids_array(toks, "tokens").tolist() if toks else [])

    def completion_prompts(self, body: dict, enc: PromptEncoder | None = None) -> list[np.ndarray]:
        """/v1/completions `prompt`: a string, token ids, or a list of either (one choice each)."""
        enc = enc or self.enc
        p = body.get("prompt")
        if isinstance(p, str):
            return [enc.text(p)]
        if _token_ids(p):
            return [_ids_array(p, "prompt")]
        if isinstance(p, list) and p:
            if len(p) > MAX_PROMPTS:
                raise BadRequest(P.bad_field("prompt", "too_long", f"List should have at most "
                                             f"{MAX_PROMPTS} items", len(p)))
            out = []
            for i, q in enumerate(p):
                if isinstance(q, str):
                    out.append(enc.text(q))
                elif _token_ids(q):
                    out.append(_ids_array(q, f"prompt.{i}"))
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
