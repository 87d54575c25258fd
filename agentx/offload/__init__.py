"""KV-offload connectors as a registry: one class per connector (agentx.offload.base says what
each owns). Adding a connector = one class in this package + its entry in CONNECTORS."""
from __future__ import annotations

from typing import Annotated, Iterable, Literal, Union

from pydantic import BeforeValidator, Discriminator, Tag

from . import dram
from .base import Connector, Launch, Signal, SimMetrics, StorePolicy, Tier
from .lmcache import LMCache
from .mooncake import Mooncake
from .none import NoOffload
from .simple_cpu import SimpleCPU

CONNECTORS: tuple[type[Connector], ...] = (NoOffload, SimpleCPU, Mooncake, LMCache)
BY_KIND: dict[str, type[Connector]] = {c.model_fields["kind"].default: c for c in CONNECTORS}
KINDS: tuple[str, ...] = tuple(BY_KIND)
Kind = Literal[KINDS]  # type: ignore[valid-type]  # the kinds, for SimConfig's --kv-offload


def connector(kind: str) -> type[Connector]:
    """The class of a connector kind; KeyError names the known kinds."""
    try:
        return BY_KIND[kind]
    except KeyError:
        raise KeyError(f"unknown KV-offload connector {kind!r} (known: {', '.join(KINDS)})") \
            from None


def by_vllm_name(name: str | None) -> type[Connector] | None:
    """The class whose vLLM kv_connector name is `name` (as cache_config_info may carry it)."""
    return next((c for c in CONNECTORS if c.vllm_name and c.vllm_name == name), None)


def by_families(families: Iterable[str]) -> type[Connector] | None:
    """The connector whose own load/store counters the server declares. A family's HELP and
    TYPE lines are exposed from start-up, before its first sample (prometheus_client), so a run
    against a URL learns the connector, and with it the store policy, at its first scrape."""
    names = {f.removesuffix("_total") for f in families}
    for c in CONNECTORS:
        if any(s.sample.removesuffix("_total") in names for s in (*c.loads, *c.stores)):
            return c
    return None


def _kind_of(value: object) -> str | None:
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


def _kind_only(value: object) -> object:
    """`kv_offload: mooncake` is `{kind: mooncake}`."""
    return {"kind": value} if isinstance(value, str) else value


# A recipe's kv_offload section: the connector named by `kind`, with its own options.
Offload = Annotated[
    Union[tuple(Annotated[c, Tag(k)] for k, c in BY_KIND.items())],  # type: ignore[misc]
    Discriminator(_kind_of, custom_error_type="offload_kind",
                  custom_error_message=f"kind must be one of: {', '.join(KINDS)}"),
    BeforeValidator(_kind_only)]

__all__ = ["CONNECTORS", "KINDS", "Kind", "Offload", "Connector", "Launch", "Signal", "dram",
           "NoOffload", "SimpleCPU", "Mooncake", "LMCache",
           "SimMetrics", "StorePolicy", "Tier", "connector", "by_vllm_name", "by_families"]
