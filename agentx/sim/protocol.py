"""vLLM-shaped response bodies (chunks, completions, errors), field-for-field as vLLM 0.32 sends them.

Streamed chunks are rendered from per-request byte templates instead of `orjson.dumps` of a
dict per chunk: the step loop emits up to tens of thousands of chunks per second, and the
variable parts (generated words, token counts) never need JSON escaping.
See tests/data/vllm-samples/*.sse (captured from vLLM 0.32) for the reference shapes.
"""
from __future__ import annotations

from typing import Any

import orjson

VLLM_VERSION = "0.32.0"
SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-agentxsim"
DONE = b"data: [DONE]\n\n"


def error_body(status: int, message: str, *, type_: str | None = None, param: str | None = None) -> bytes:
    """vLLM's `{"error": {...}}` body (see error_bad_request.json / error_unknown_model.json)."""
    phrases = {400: "Bad Request", 404: "NotFoundError", 413: "Request Entity Too Large",
               429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
    return orjson.dumps({"error": {"message": message, "type": type_ or phrases.get(status, "Error"),
                                   "param": param, "code": status}})


def bad_field(field: str, kind: str, msg: str, value: Any) -> bytes:
    """400 body in pydantic's wording, naming the offending field like vLLM does."""
    rv = repr(value)
    if len(rv) > 80:
        rv = rv[:77] + "..."
    text = f"1 validation error:\n  {{'type': '{kind}', 'loc': 'body.{field}', 'msg': '{msg}', 'input': {rv}}}"
    return error_body(400, text, param=f"body.{field}")


def too_large(size: int | None, limit: int, max_model_len: int) -> bytes:
    """413: a body over the simulator's cap (sim/parse.py: BYTES_PER_TOKEN x max_model_len)."""
    what = f"Request body of {size:,} bytes is" if size is not None else "Request body is"
    return error_body(413, f"{what} over the limit of {limit:,} bytes (enough for a prompt of "
                      f"max_model_len, {max_model_len:,} tokens)", param="body")


def unknown_model(name: str, served: str) -> bytes:
    return error_body(404, f"The model `{name}` does not exist. Valid aliases: {served}.",
                      type_="NotFoundError", param="model")


def metrics_obj(ttft_ms: float, gen_ms: float, queue_ms: float, n_out: int) -> dict:
    """The `metrics` object vLLM adds with --enable-per-request-metrics.

    As in the samples: mean_itl_ms = generation_time / (tokens - 1) (per token, not per chunk),
    tokens_per_second = tokens / (TTFT + generation time)."""
    itl = gen_ms / (n_out - 1) if n_out > 1 else 0.0
    total = (ttft_ms + gen_ms) / 1000.0
    return {"time_to_first_token_ms": ttft_ms, "generation_time_ms": gen_ms, "queue_time_ms": queue_ms,
            "mean_itl_ms": itl, "tokens_per_second": n_out / total if total > 0 else 0.0}


class ChunkWriter:
    """Byte templates for one streamed request (chat or text completion)."""

    __slots__ = ("chat", "head", "usage_each", "prompt", "rid_json", "created", "model_json", "_pre")

    def __init__(self, *, chat: bool, rid: str, created: int, model: str, prompt_tokens: int,
                 continuous_usage: bool, index: int = 0) -> None:
        self.chat = chat
        self.prompt = prompt_tokens
        self.usage_each = continuous_usage
        self.rid_json = orjson.dumps(rid).decode()
        self.model_json = orjson.dumps(model).decode()
        self.created = created
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'data: {{"id":{self.rid_json},"object":"{obj}","created":{created},"model":{self.model_json},'
        self._pre = self.head + f'"choices":[{{"index":{index},'

    def _usage(self, n_out: int) -> str:
        p = self.prompt
        return (f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + n_out},"completion_tokens":{n_out},'
                f'"completion_tokens_details":null}}')

    def role(self) -> bytes:
        """First chat chunk: role only, empty content (vLLM sends it before any token)."""
        u = self._usage(0) if self.usage_each else ""
        return (self._pre + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                + u + ',"prompt_token_ids":null,"prompt_text":null}\n\n').encode()

    def tokens(self, text: str, n_out: int, finish: str | None, reasoning: str = "") -> bytes:
        """One chunk carrying some tokens; `n_out` is cumulative like vLLM's continuous usage.

        `reasoning` (chat only) goes to delta.reasoning, `text` to delta.content; a chunk that
        straddles the end of thinking carries both, as vLLM's reasoning parser emits it."""
        fin = "null" if finish is None else f'"{finish}","stop_reason":null'
        u = self._usage(n_out) if self.usage_each else ""
        if self.chat:
            if reasoning and text:
                delta = f'"reasoning":"{reasoning}","content":"{text}"'
            elif reasoning:
                delta = f'"reasoning":"{reasoning}"'
            else:
                delta = f'"content":"{text}"'
            body = f'"delta":{{{delta}}},"logprobs":null,"finish_reason":{fin},"token_ids":null}}]'
        else:
            if finish is None:
                fin = 'null,"stop_reason":null'
            body = (f'"text":"{text}","logprobs":null,"finish_reason":{fin},'
                    f'"prompt_token_ids":null,"token_ids":null}}]')
        return (self._pre + body + u + "}\n\n").encode()

    def final_usage(self, n_out: int, cached: int | None, created_cache: int,
                    metrics: dict | None) -> bytes:
        """Usage-only last chunk with prompt_tokens_details and per-request metrics."""
        p = self.prompt
        usage: dict[str, Any] = {"prompt_tokens": p, "total_tokens": p + n_out, "completion_tokens": n_out}
        usage["prompt_tokens_details"] = None if cached is None else (
            {"cached_tokens": cached, "created_cache_tokens": created_cache} if self.chat
            else {"cached_tokens": cached})
        tail: dict[str, Any] = {"usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT}
        if metrics is not None:
            tail["metrics"] = metrics
        return (self.head + '"choices":[],' + orjson.dumps(tail).decode()[1:] + "\n\n").encode()


def chat_response(*, rid: str, created: int, model: str, content: str, reasoning: str | None,
                  finish: str, prompt: int, n_out: int, cached: int | None, created_cache: int,
                  metrics: dict | None) -> bytes:
    """Non-streaming chat completion, shaped like chat_nonstream.json."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + n_out, "completion_tokens": n_out,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "created_cache_tokens": created_cache,
                                          "multimodal_tokens": None}
    if metrics is not None:
        metrics = dict(metrics, speculative_decoding=None)
    return orjson.dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None,
                                              "reasoning": reasoning},
                     "logprobs": None, "finish_reason": finish, "stop_reason": None, "token_ids": None,
                     "routed_experts": None}],
        "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage,
        "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": metrics})


def completion_response(*, rid: str, created: int, model: str, text: str, finish: str, prompt: int,
                        n_out: int, cached: int | None, metrics: dict | None) -> bytes:
    """Non-streaming /v1/completions body."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + n_out, "completion_tokens": n_out,
                             "prompt_tokens_details": None}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return orjson.dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                     "prompt_token_ids": None, "token_ids": None, "prompt_logprobs": None}],
        "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage,
        "kv_transfer_params": None, "metrics": metrics})
