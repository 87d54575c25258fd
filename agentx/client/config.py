"""What the client needs to know about the target: URL, model, auth, request options."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit


@dataclass
class ClientConfig:
    base_url: str  # may hold user:password@ (sent as Basic auth, never shown: urls.redact_url)
    model: str = ""
    api_key: str | None = None
    timeout_s: float = 600.0  # longest silence allowed while a response streams
    request_timeout_s: float = 3600.0  # longest a request may take in all (--request-timeout)
    thinking: str | None = None  # on | off | None (server default)
    extra_body: dict = field(default_factory=dict)
    cache_salt: str | None = None
    ignore_eos: bool = True
    max_connections: int = 0  # 0: unlimited (the engine bounds concurrency itself)
    connect_timeout_s: float = 30.0

    def headers(self) -> dict[str, str]:
        """Headers of every request, control plane (aiohttp) and /metrics included: the API
        key as a Bearer token. Credentials in the URL are not here: aiohttp sends them as
        Basic auth itself (and refuses a URL with credentials plus an Authorization header),
        the load requests add `url_auth()`. run.py keeps the two from meeting: with --api-key
        the URL it uses has no credentials."""
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def url_auth(self) -> dict[str, str]:
        """`Authorization: Basic ...` from the URL's `user:password@` (as aiohttp derives it
        for the control plane, so every request carries the same), unless an API key is
        sent instead; {} when neither."""
        if self.api_key:
            return {}
        return basic_auth(self.base_url)


def basic_auth(url: str) -> dict[str, str]:
    """{"Authorization": "Basic ..."} for a URL with `user[:password]@`, else {}: the
    percent-decoded user and password, latin-1 (utf-8 beyond it), as aiohttp.BasicAuth."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return {}
    cred = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    try:
        raw = cred.encode("latin-1")
    except UnicodeEncodeError:
        raw = cred.encode("utf-8")
    return {"Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}


def without_credentials(url: str) -> str:
    """The URL without its `user:password@`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


# ------------------------------------------------------------------------------ wire
