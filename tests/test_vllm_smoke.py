"""Smoke tests of the real-vLLM environment (tests/vllm_env): the server we build behaves as
the benchmark assumes — the tokenizer/template rendered client-side equals the server's, usage
and cached_tokens are reported, and both speculative-decoding servers draft tokens.

Run: `.venv/bin/python -m pytest tests/test_vllm_smoke.py -q -m vllm` (builds .venv-vllm on
first use, ~2 min; then one server at a time, each up in under a minute).
"""
from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentx.tokens.tokenizer import HFTokenizer
from agentx.tokens.words import WORDS
from helpers import sse_events

pytestmark = pytest.mark.vllm

MAX_TOKENS = 16


# ---------------------------------------------------------------- plain HTTP helpers

def _get(base_url: str, path: str) -> bytes:
    with urllib.request.urlopen(base_url + path, timeout=60) as resp:
        return resp.read()


def _post(base_url: str, path: str, body: dict) -> urllib.request.addinfourl:
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=120)


def _post_json(base_url: str, path: str, body: dict) -> dict:
    with _post(base_url, path, body) as resp:
        return json.loads(resp.read())


def _stream_chat(base_url: str, body: dict) -> list[dict]:
    """POST a streamed chat completion; return the parsed `data:` events before [DONE]."""
    with _post(base_url, "/v1/chat/completions", {**body, "stream": True}) as resp:
        return sse_events(resp.read())


def _counter(base_url: str, sample_name: str) -> float:
    """Sum of one counter sample (e.g. `vllm:spec_decode_num_drafts_total`) over labels."""
    text = _get(base_url, "/metrics").decode()
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == sample_name)


def _prose(n_words: int, offset: int = 0) -> str:
    words = sorted(set(WORDS))
    return " ".join(words[(offset + i * 7) % len(words)] for i in range(n_words))


def _conversation(tag: str) -> list[dict]:
    """Multi-turn chat with code, newlines, unicode, a list-of-parts message and a prior turn."""
    return [
        {"role": "system", "content": f"run {tag}\nYou are a coding agent. " + _prose(40)},
        {"role": "user", "content": "def load(path):\n    with open(path) as f:\n"
                                    "        return json.load(f)  # naïve — ok?\n"
                                    + _prose(30, 3)},
        {"role": "assistant", "content": _prose(25, 5)},
        {"role": "user", "content": [{"type": "text", "text": "part one " + _prose(10, 9)},
                                     {"type": "text", "text": "\npart two\n\n"}]},
    ]


def _chat_body(messages: list[dict], max_tokens: int = MAX_TOKENS, **extra) -> dict:
    return {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **extra}


# ---------------------------------------------------------------- plain server

def test_models_lists_tiny(vllm_server):
    models = json.loads(_get(vllm_server.base_url, "/v1/models"))
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert vllm_server.kv_pool_tokens and vllm_server.kv_pool_tokens > 0


@pytest.mark.parametrize("thinking", [True, False])
def test_tokenize_matches_client_template(vllm_server, vllm_assets, thinking):
    """Client-side rendering + local tokenizer == server /tokenize, token for token."""
    tok = HFTokenizer(str(vllm_assets.tokenizer_dir))
    messages = _conversation(f"tok-{thinking}")
    kwargs = {"enable_thinking": thinking}
    server = _post_json(vllm_server.base_url, "/tokenize",
                        {"model": "tiny", "messages": messages, "add_generation_prompt": True,
                         "chat_template_kwargs": kwargs})
    local = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs))
    assert server["count"] == len(local)
    assert server["tokens"] == local


def test_thinking_switch_changes_generation_prompt(vllm_server, vllm_assets):
    """enable_thinking=false appends the empty think block, and only that, to the prompt."""
    tok = HFTokenizer(str(vllm_assets.tokenizer_dir))
    messages = _conversation("switch")
    counts = {flag: _post_json(vllm_server.base_url, "/tokenize",
                               {"model": "tiny", "messages": messages,
                                "chat_template_kwargs": {"enable_thinking": flag}})["count"]
              for flag in (True, False)}
    assert counts[False] - counts[True] == tok.count("<think>\n\n</think>\n\n")


def test_every_vocabulary_word_is_one_token(vllm_server):
    """Token-exact synthesis relies on ' word' being a single token for every WORDS entry."""
    words = sorted(set(WORDS))
    text = "".join(" " + w for w in words)
    server = _post_json(vllm_server.base_url, "/tokenize", {"model": "tiny", "prompt": text})
    assert server["count"] == len(words)


def test_stream_usage_metrics_and_prefix_cache(vllm_server):
    """ignore_eos + max_tokens gives exactly that many tokens; a repeat hits the prefix cache."""
    messages = _conversation(f"cache-{uuid.uuid4().hex}")  # unique: cold on the first send
    finals = []
    for _ in range(2):
        events = _stream_chat(vllm_server.base_url, _chat_body(messages))
        assert all("usage" in e and e["usage"] for e in events)  # continuous usage stats
        final = events[-1]
        assert final["choices"] == []  # the usage-only closing chunk
        assert final["usage"]["completion_tokens"] == MAX_TOKENS
        assert final["metrics"]["time_to_first_token_ms"] > 0  # --enable-per-request-metrics
        finals.append(final)
    prompt_tokens = finals[0]["usage"]["prompt_tokens"]
    assert finals[1]["usage"]["prompt_tokens"] == prompt_tokens
    assert finals[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = finals[1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= prompt_tokens


# ---------------------------------------------------------------- speculative decoding

def _drafts_increase(server) -> tuple[float, float]:
    before = _counter(server.base_url, "vllm:spec_decode_num_drafts_total")
    events = _stream_chat(server.base_url, _chat_body(_conversation("spec"), max_tokens=32))
    assert events[-1]["usage"]["completion_tokens"] == 32
    after = _counter(server.base_url, "vllm:spec_decode_num_drafts_total")
    return before, after


def test_ngram_server_drafts(vllm_server_ngram):
    before, after = _drafts_increase(vllm_server_ngram)
    assert after > before


def test_eagle3_server_drafts(vllm_server_eagle3):
    before, after = _drafts_increase(vllm_server_eagle3)
    assert after > before
