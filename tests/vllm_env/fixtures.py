"""pytest fixtures for tests marked `vllm`: assets, the vLLM venv and one server at a time.

The machine has 2 cores and each server takes ~2 GB RSS and ~30 s to start, so a single
session-wide pool keeps at most one server alive: asking for another kind (plain, ngram,
eagle3, or custom settings) stops the running one first. So that each kind starts once per
session, the `vllm` tests run last, grouped by the server they use (`server_group`: the
fixture they take, or a `vllm_group("name")` marker for custom settings), and the pool stops
its server when a group ends. Tests that start their own server (a recipe launched by a
command) form the first group, with no pool server alive.

When the vLLM venv cannot be built (e.g. no package index), tests fail under CI (`CI` set)
and are skipped locally with the reason.

Enable in tests/conftest.py with `pytest_plugins = ["vllm_env.fixtures"]` (tests/ on sys.path).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from .build_assets import Assets, build_assets
from .server import DEFAULT_KV_BYTES, DEFAULT_MAX_MODEL_LEN, LOG_DIR, VLLMServer
from .venv import VenvBuildError, ensure_vllm_venv

SPEC_K = 3
# (kind, start-up seconds, KV pool tokens) of every server started this session, for the summary.
STARTS: list[tuple[str, float, int | None]] = []
# Pool server kind behind each fixture; `vllm_spec_server` is parametrized with its kind.
FIXTURE_KINDS = {"vllm_server": "plain", "vllm_server_ngram": "ngram",
                 "vllm_server_eagle3": "eagle3"}
SPEC_PARAM = "vllm_spec_server"
# Run order of the groups; "" = no pool server (the test starts its own or none); a
# `vllm_group` name not listed here runs after these.
GROUP_ORDER = ("", "plain", "ngram", "eagle3")
_POOL: list["ServerPool"] = []  # the session's pool once created, for the group-end hook


def speculative_configs(assets: Assets) -> dict[str, dict[str, Any] | None]:
    """The server kinds the fixtures provide, by name."""
    return {
        "plain": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": SPEC_K,
                  "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        "eagle3": {"method": "eagle3", "model": str(assets.eagle3_dir),
                   "num_speculative_tokens": SPEC_K},
    }


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class ServerPool:
    """Hands out a running server of the requested kind; never more than one alive."""

    def __init__(self, assets: Assets, python: Path) -> None:
        self.assets, self.python = assets, python
        self.current: VLLMServer | None = None
        self._key: tuple | None = None

    def get(self, kind: str = "plain", *, kv_cache_memory_bytes: int = DEFAULT_KV_BYTES,
            max_model_len: int = DEFAULT_MAX_MODEL_LEN, extra_args: tuple[str, ...] = ()
            ) -> VLLMServer:
        spec = speculative_configs(self.assets)[kind]
        key = (kind, kv_cache_memory_bytes, max_model_len, tuple(extra_args))
        if self.current is not None and self._key == key and self.current.running:
            return self.current
        self.stop()
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.current = VLLMServer.start(
            self.assets, python=self.python, speculative_config=spec,
            kv_cache_memory_bytes=kv_cache_memory_bytes, max_model_len=max_model_len,
            extra_args=extra_args, log_path=LOG_DIR / f"{kind}.log")
        self._key = key
        STARTS.append((kind, self.current.startup_seconds or 0.0, self.current.kv_pool_tokens))
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current, self._key = None, None


def server_group(item: pytest.Item) -> str | None:
    """The pool server a test uses ("" for none), or None when it is not a `vllm` test."""
    if item.get_closest_marker("vllm") is None:
        return None
    marker = item.get_closest_marker("vllm_group")
    if marker is not None:
        return str(marker.args[0])
    callspec = getattr(item, "callspec", None)
    if callspec is not None and SPEC_PARAM in callspec.params:
        return str(callspec.params[SPEC_PARAM])
    names = getattr(item, "fixturenames", ())
    return next((kind for name, kind in FIXTURE_KINDS.items() if name in names), "")


def _group_rank(group: str) -> tuple[int, str]:
    return (GROUP_ORDER.index(group), "") if group in GROUP_ORDER else (len(GROUP_ORDER), group)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Other tests first, in their order; then the `vllm` tests, grouped by server kind."""
    groups = {id(item): server_group(item) for item in items}
    rest = [item for item in items if groups[id(item)] is None]
    vllm = [item for item in items if groups[id(item)] is not None]
    vllm.sort(key=lambda item: _group_rank(groups[id(item)]))  # stable: file order kept inside
    items[:] = rest + vllm


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A group's last test stops the pool server, so the next group (or the rest of the
    session) never runs beside an idle vLLM."""
    group = server_group(item)
    if group and _POOL and (nextitem is None or server_group(nextitem) != group):
        _POOL[0].stop()


@pytest.fixture(scope="session")
def vllm_assets() -> Assets:
    """Tokenizer, tiny Qwen3 model and EAGLE3 draft (built in seconds, cached in .cache/)."""
    return build_assets()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of the vLLM venv; builds it on first use (~2 min with network)."""
    try:
        return ensure_vllm_venv()
    except VenvBuildError as err:
        msg = f"cannot build the vLLM CPU venv: {err}"
        if _in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def vllm_servers(vllm_assets: Assets, vllm_python: Path) -> Iterator[ServerPool]:
    """The session's server pool: `vllm_servers.get(kind, kv_cache_memory_bytes=..., ...)`."""
    pool = ServerPool(vllm_assets, vllm_python)
    _POOL.append(pool)
    try:
        yield pool
    finally:
        pool.stop()
        _POOL.remove(pool)


@pytest.fixture
def vllm_server(vllm_servers: ServerPool) -> VLLMServer:
    """Plain server (no speculation), default KV pool and max model length."""
    return vllm_servers.get("plain")


@pytest.fixture
def vllm_server_ngram(vllm_servers: ServerPool) -> VLLMServer:
    """Server with ngram speculative decoding, K=3."""
    return vllm_servers.get("ngram")


@pytest.fixture
def vllm_server_eagle3(vllm_servers: ServerPool) -> VLLMServer:
    """Server with the tiny random EAGLE3 draft, K=3."""
    return vllm_servers.get("eagle3")


@pytest.fixture
def vllm_spec_server(vllm_servers: ServerPool, request: pytest.FixtureRequest) -> VLLMServer:
    """A speculative server of the kind given by indirect parametrization ("ngram", "eagle3")."""
    return vllm_servers.get(request.param)


def pytest_terminal_summary(terminalreporter) -> None:
    """Print each server's start-up time and KV pool, so CI logs carry the measurements."""
    if STARTS:
        terminalreporter.write_sep("-", "vLLM servers started")
        for kind, seconds, pool in STARTS:
            terminalreporter.write_line(f"{kind}: up in {seconds:.1f} s, KV pool {pool} tokens "
                                        f"(logs in {LOG_DIR})")
