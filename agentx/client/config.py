"""What the client needs to know about the target: URL, model, auth, request options."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClientConfig:
    base_url: str
    model: str = ""
    api_key: str | None = None
    timeout_s: float = 600.0  # longest silence allowed while a response streams
    thinking: str | None = None  # on | off | None (server default)
    extra_body: dict = field(default_factory=dict)
    cache_salt: str | None = None
    ignore_eos: bool = True
    max_connections: int = 0  # 0: unlimited (the engine bounds concurrency itself)
    connect_timeout_s: float = 30.0

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


# ------------------------------------------------------------------------------ wire
