"""No CPU tier: vLLM's GPU prefix cache only."""
from __future__ import annotations

from typing import Literal

from ..options import opt
from .base import Connector, StorePolicy


class NoOffload(Connector):
    kind: Literal["none"] = opt("none", "no CPU KV tier")
    store = StorePolicy(eager=False)
    enabled = False
