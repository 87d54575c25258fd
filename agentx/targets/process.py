"""A server process's lifecycle: spawn it (and its side processes) in their own process
groups, wait for /health, stop the whole groups; the log stays in the target's directory.

The server (and any side process such as `mooncake_master`) starts in its own session, so
it is the leader of a new process group and everything it forks (vLLM's engine core, TP
workers) stays in that group. Stopping sends SIGTERM to the group, then SIGKILL after a grace
period, then kills any descendant that left the group. `ServerHandle` is a context manager,
so an exception or Ctrl-C in the caller (sweep, A/B, calibrate, `agentx serve`) still stops
the server. A SIGKILLed agentx runs no cleanup: a guard process (agentx.recipe.guard) watching
a pipe from agentx stops the groups then. (Not PR_SET_PDEATHSIG: it needs a preexec_fn, unsafe
in a process running threads, and would reach the group leader only.)
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LogSink = Callable[[str], None]
# between /health probes while a server starts: a refused connection costs ~0.1 ms, and each
# start waited half the interval past its first healthy moment on average (0.25 s at 0.5 s)
HEALTH_POLL_S = 0.1


class ServerStartError(RuntimeError):
    """The server exited or was not healthy in time: one line (what happened, where its log
    is); `tail` keeps the log's last lines for whoever shows more."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _spawn(argv: Sequence[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil: the group kill suffices
        return []


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # start_new_session: the pid is the group id


def stop_group(proc: subprocess.Popen, grace: float) -> int | None:
    """SIGTERM the process group of `proc`, SIGKILL it after `grace` s; reap `proc`."""
    children = _descendants(proc.pid)
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    _killpg(proc.pid, signal.SIGKILL)  # stragglers still in the group
    for child in children:  # and any that left it
        with contextlib.suppress(Exception):  # already gone
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    return proc.returncode


def start_guard(pgids: Sequence[int], grace: float) -> subprocess.Popen:
    """The guard that stops these process groups if this process dies (see guard.py); its
    own session, so a Ctrl-C at the terminal does not reach it."""
    return subprocess.Popen([sys.executable, "-m", "agentx.recipe.guard", str(grace),
                             *map(str, pgids)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def release_guard(guard: subprocess.Popen | None) -> None:
    """The groups are stopped: tell the guard, which then exits without touching them."""
    if guard is None or guard.poll() is not None:
        return
    with contextlib.suppress(OSError):  # BrokenPipeError: it is gone already
        guard.stdin.write(b"stopped\n")
        guard.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=5)


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    base_url: str
    log_path: Path
    workdir: Path
    model: str | None = None
    sidecars: list[subprocess.Popen] = field(default_factory=list)
    grace_s: float = 20.0
    guard: subprocess.Popen | None = None

    @property
    def pgid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """Stop the server group, then the side processes; idempotent."""
        rc = stop_group(self.proc, self.grace_s)
        for p in self.sidecars:
            stop_group(p, self.grace_s)
        release_guard(self.guard)
        return rc

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ServerHandle:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LogTail:
    """Hands new complete lines of a growing log file to a sink."""

    def __init__(self, path: Path, sink: LogSink | None, pos: int = 0) -> None:
        self.path, self.sink, self.pos, self.buf = path, sink, pos, b""

    def poll(self) -> None:
        if self.sink is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        self.pos += len(data)
        *lines, self.buf = (self.buf + data).split(b"\n")
        for line in lines:
            self.sink(line.decode(errors="replace"))


def healthy(url: str) -> bool:
    """GET /health answers 200 (a 2 s probe)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_healthy(handle: ServerHandle, health_timeout_s: float,
                 tail: LogTail | None = None) -> None:
    """Return once /health answers 200; ServerStartError (one line, the log tail beside it)
    when a process of the server exits first or `health_timeout_s` passes."""
    deadline = time.monotonic() + health_timeout_s
    while True:
        if tail:
            tail.poll()
        dead = [p for p in (handle.proc, *handle.sidecars) if p.poll() is not None]
        if dead:
            tail_text = handle.log_tail()
            last = next((x.strip() for x in reversed(tail_text.splitlines()) if x.strip()), "")
            raise ServerStartError(f"{Path(dead[0].args[0]).name} exited with code "
                                   f"{dead[0].returncode} before /health answered"
                                   + (f": {last[:200]}" if last else "")
                                   + f" (log {handle.log_path})", tail_text)
        if healthy(handle.base_url):
            if tail:
                tail.poll()
            return
        if time.monotonic() > deadline:
            raise ServerStartError(f"/health did not answer within {health_timeout_s:g} s "
                                   f"(log {handle.log_path})", handle.log_tail())
        time.sleep(HEALTH_POLL_S)


def start(argv: Sequence[str], env: dict[str, str], *, base_url: str, workdir: Path,
          health_timeout_s: float, on_log: LogSink | None = None,
          sidecars: Sequence[Sequence[str]] = (), files: dict[str, str] | None = None,
          grace_s: float = 20.0) -> ServerHandle:
    """Write `files`, start `sidecars` then the server (logs in `workdir`), return once
    /health answers 200. On failure, timeout, exception or Ctrl-C everything started is
    stopped first."""
    workdir.mkdir(parents=True, exist_ok=True)
    for path, content in (files or {}).items():
        Path(path).write_text(content)
    full_env = {**os.environ, **env}
    started: list[subprocess.Popen] = []
    try:
        for i, side in enumerate(sidecars):
            started.append(_spawn(side, full_env, workdir / f"{Path(side[0]).name}-{i}.log"))
        log_path = workdir / "server.log"
        proc = _spawn(argv, full_env, log_path)
    except FileNotFoundError as e:
        for p in started:
            stop_group(p, grace_s)
        raise ServerStartError(f"cannot start {e.filename}: not installed or not on PATH") \
            from None
    handle = ServerHandle(proc, base_url, log_path, workdir, sidecars=started, grace_s=grace_s,
                          guard=start_guard([p.pid for p in (*started, proc)], grace_s))
    try:
        wait_healthy(handle, health_timeout_s, LogTail(log_path, on_log))
    except BaseException:
        handle.stop()
        raise
    return handle
