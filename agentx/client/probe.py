"""A run's first phase: what the server is, before any traffic. `probe_server` picks the
credentials every request carries, then asks the server its model and context length
(GET /v1/models), its version (GET /version) and fits the token model (a Hugging Face
tokenizer, the built-in model for the simulator, else the server's /tokenize), and returns
them as one `ServerFacts`."""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError
from ..prompt.token_model import TokenModel, builtin_model, hf_model
from ..urls import redact_url, scrub
from .config import ClientConfig, basic_auth, without_credentials
from .http import first_model, make_session, probe_error, server_version


@dataclass
class ServerFacts:
    """What the probe learnt: the client's config as every request uses it (URL without
    credentials when a key is sent, the model to name, the key), the server's context length
    and /version answer, and the token model with how it was obtained (`token_info`: run.json
    records it; worker processes rebuild the model from it)."""

    client: ClientConfig
    max_model_len: int | None
    version: dict
    token_model: TokenModel
    token_info: dict


def credentials(client: ClientConfig, key_given: bool,
                secret_key: Callable[[], str | None]) -> ClientConfig:
    """One Authorization on every request: --api-key (Bearer), else the URL's user:password
    (Basic), else $OPENAI_API_KEY; docs/reliability.md#credentials. `key_given`: --api-key
    was given; `secret_key()` reads it, else $OPENAI_API_KEY (only when it is sent)."""
    url = client.base_url
    key = secret_key() if key_given or not basic_auth(url) else None
    if key_given and basic_auth(url):
        print("agentx: warning: --api-key is sent (Bearer) on every request; the user:password "
              "in --base-url is not (a request carries one Authorization header)", file=sys.stderr)
        url = without_credentials(url)
    return replace(client, base_url=url, api_key=key)


async def probe_server(client: ClientConfig, tokenizer: str | None = None,
                       builtin_tokens: bool = False) -> ServerFacts:
    """The server's facts (InputError naming --base-url when it does not answer). `client`
    has its credentials chosen (credentials()); `client.model` empty: the first served."""
    url, timeout = client.base_url, client.connect_timeout_s
    async with make_session(client, 1) as session:
        try:
            model, max_model_len = await first_model(session, url, timeout)
        except Exception as exc:
            raise InputError(redact_url(url), scrub(probe_error(exc, "GET /v1/models", timeout),
                                                    url), field="--base-url") from None
        client = replace(client, model=client.model or model)
        version = await server_version(session, url, timeout)
        tm, info = await token_model(session, client, tokenizer, builtin_tokens)
    return ServerFacts(client, max_model_len, version, tm, info)


async def token_model(session: Any, client: ClientConfig, tokenizer: str | None,
                      builtin_tokens: bool) -> tuple[TokenModel, dict]:
    """The token model prompts are built with, and how it was obtained."""
    kw = {"enable_thinking": client.thinking == "on"} if client.thinking else None
    if tokenizer:
        if not Path(tokenizer).is_dir():
            raise InputError(tokenizer, "not a directory with a Hugging Face tokenizer",
                             field="--tokenizer")
        tm = hf_model(tokenizer, kw)
        return tm, {"mode": "hf", "tokenizer": tokenizer, "overhead": tm.overhead,
                    "generation_prompt": tm.generation_prompt, "build": tm.build}
    if builtin_tokens:  # the server tokenizes as agentx's built-in model (the simulator)
        return builtin_model(), {"mode": "builtin"}
    from .tokenize import server_token_model

    try:
        # a dozen small /tokenize calls: bounded, so a server that hangs there cannot stall
        # start-up (the fallback below is reported in summary.run.tokens)
        return await asyncio.wait_for(server_token_model(session, client.base_url,
                                                         client.model, kw),
                                      3 * client.connect_timeout_s)
    except Exception as exc:  # server without /tokenize: word = token assumption, reported
        return builtin_model(), {"mode": "assumed", "reason": f"/tokenize unavailable: {exc}"[:200]}
