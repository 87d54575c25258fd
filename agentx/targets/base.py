"""A target: the server a command measures and how it was obtained, as one object.

Four kinds (targets.choice.Kind; docs/real-vllm.md, "How agentx gets a server"): `url`,
`vllm`, `sim`, `embedded`. Each is a `Server`: a context manager whose `start()` returns the
running `Target` (URL, model, kind, offload tier) and whose `stop()` leaves no process
behind. `run`, `sweep`, `ab`, `calibrate` and `serve` get their servers only through
targets.open.open_server.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client.http import first_model, server_version
from ..urls import redact_url
from .choice import Kind


@dataclass
class Target:
    """A running server. `model` is what requests name (None: the first at /v1/models);
    `offload_tokens` the KV offload tier's size when the recipe says (else the server's
    /metrics may); `options` what a run records of a simulator it started itself."""

    kind: Kind
    url: str
    model: str | None = None
    offload_tokens: int | None = None
    connector: str | None = None  # KV-offload connector name, when launched from a recipe
    profile: str | None = None  # simulator profile (sim, embedded)
    named: str | None = None  # what the user named: a URL or a recipe
    log_dir: Path | None = None  # where a launched server's logs are kept
    options: dict | None = field(default=None, repr=False)
    builtin_tokens: bool = False  # tokenizes as agentx's built-in model: no /tokenize probe
    local_cores: int = 0  # cores it takes on this machine (kept from --workers auto)

    @property
    def embedded(self) -> bool:
        return self.kind == "embedded"

    def public(self) -> dict:
        """As ab.json records a side: no credentials."""
        return {"spec": redact_url(self.named) if self.kind == "url" else self.named,
                "kind": self.kind, "base_url": redact_url(self.url), "model": self.model,
                "offload_tokens": self.offload_tokens}

    def identity(self, model: str, version: dict) -> dict:
        """The run's `target` record (summary.json, run.json; read by report.target_text):
        `kind` how the server was obtained, `simulator` whether it is agentx's simulator.
        `version` is client.http.server_version's: a served simulator (a sweep's or an A/B
        side's stand-in, `agentx serve-sim`) says so there, and is named as one. (Before
        2026-12-03 `kind` was `simulator` | `server`: report.target.is_simulator reads both.)"""
        sim = self.embedded or bool(version.get("simulator_profile"))
        return {"kind": self.kind, "simulator": sim,
                "profile": self.profile if self.embedded else version.get("simulator_profile"),
                "url": None if self.embedded else redact_url(self.url), "model": model,
                "server_version": version.get("version"),
                # the GPUs a simulator simulates (its TP); a real server does not say
                "gpus": version.get("simulator_gpus")}


def read_version(url: str, timeout_s: float = 10.0) -> dict:
    """GET /version outside an event loop (client.http.server_version, the one reader)."""
    return asyncio.run(_probe(server_version, url, timeout_s))


def read_model(url: str, timeout_s: float = 30.0) -> str:
    """The first model at GET /v1/models, outside an event loop (client.http.first_model)."""
    return asyncio.run(_probe(first_model, url, timeout_s))[0]


async def _probe(read: Callable[..., Awaitable[Any]], url: str, timeout_s: float) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await read(session, url, timeout_s)


class Server(ABC):
    """A target's lifecycle: `with server as target:` starts it (waiting for /health), and
    stops it, with every process it started, however the block ends."""

    target: Target | None = None

    @abstractmethod
    def start(self) -> Target:
        """Start (or find) the server; the running target."""

    def stop(self) -> None:  # noqa: B027 - a URL target has nothing to stop
        """Stop what start() started; idempotent."""

    def exit_code(self) -> int | None:
        """The server's exit code once it died on its own (None: running, or not ours)."""
        return None

    def __enter__(self) -> Target:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class UrlServer(Server):
    """A server already running at `url`: nothing to start or stop."""

    def __init__(self, url: str, model: str | None = None,
                 offload_tokens: int | None = None) -> None:
        from ..urls import normalise_base_url

        self.target = Target("url", normalise_base_url(url), model, offload_tokens, named=url)

    def start(self) -> Target:
        assert self.target is not None
        return self.target
