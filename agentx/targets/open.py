"""`open_server(choice)`: the one call that opens any server (tests/test_targets.py lists the
call sites of the server classes and finds this one); the caller starts it with `with`."""
from __future__ import annotations

from .base import Server, UrlServer
from .choice import ServerChoice


def open_server(choice: ServerChoice) -> Server:
    """The server `choice` names, not started yet: `with open_server(c) as target:` starts
    it (waiting for /health) and stops it, with every process it started, at the end."""
    if choice.kind == "url":
        return UrlServer(choice.url, choice.model, choice.offload_tokens)
    if choice.kind == "embedded":
        from .embedded import EmbeddedSim

        return EmbeddedSim(choice.options, api_key=choice.api_key, pin=choice.pin,
                           start_timeout_s=choice.start_timeout_s)
    from .recipe import RecipeServer

    return RecipeServer(choice)
