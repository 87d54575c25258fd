"""pytest fixtures for tests marked `vllm`: assets, the vLLM venv and one server at a time.

The machine has 2 cores and each server takes ~2 GB RSS, so a single session-wide pool keeps at
most one server alive: asking for another kind (plain, ngram, eagle3, or custom settings)
stops the running one first. Servers start lazily and stop at session end. Tests that share a
kind should sit together so the pool does not restart servers in between.

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
    try:
        yield pool
    finally:
        pool.stop()


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


def pytest_terminal_summary(terminalreporter) -> None:
    """Print each server's start-up time and KV pool, so CI logs carry the measurements."""
    if STARTS:
        terminalreporter.write_sep("-", "vLLM servers started")
        for kind, seconds, pool in STARTS:
            terminalreporter.write_line(f"{kind}: up in {seconds:.1f} s, KV pool {pool} tokens "
                                        f"(logs in {LOG_DIR})")
