"""Child processes that die with their parent, and do not die of the parent's Ctrl-C.

A SIGKILLed `agentx` runs no cleanup, so each child watches its parent itself, two ways:
- Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`, man 2 prctl): the kernel signals the
  child when its parent exits. Caveat from the man page: it fires when the *thread* that created
  the child exits, and it is cleared by exec of a set-user-ID binary;
- a watchdog thread polling `os.getppid()`: an orphan is re-parented (to init or a subreaper),
  so its parent pid changes. Works on every POSIX system, within `interval` seconds.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux / no prctl: the watchdog still works
        return False


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def watch_parent(parent_pid: int, on_orphan: Callable[[], None], interval: float = 0.25,
                 exit_after: float | None = None) -> threading.Thread:
    """Daemon thread: when the parent is gone call `on_orphan()` once; with `exit_after`, end
    the process (`os._exit(1)`) that many seconds later if it is still running."""

    def loop() -> None:
        while parent_alive(parent_pid):
            time.sleep(interval)
        on_orphan()
        if exit_after is not None:
            time.sleep(exit_after)
            os._exit(1)

    t = threading.Thread(target=loop, name="agentx-parent-watch", daemon=True)
    t.start()
    return t


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started inside begin with SIGINT blocked: a signal mask survives fork and
    exec, so a terminal's Ctrl-C (it reaches the whole process group; the parent handles it
    and stops its children itself) cannot kill a child while it imports. A child that handles
    SIGINT itself calls ignore_sigint() first, then installs its handler; one that never does
    keeps it blocked, which is ignoring it. This process keeps its own handler: a Ctrl-C
    meanwhile waits until the block ends (or goes to another of its threads), never lost, as
    it was when the parent ignored SIGINT while it spawned. Only the calling thread's mask
    changes, which is the one its children inherit. (multiprocessing's resource tracker starts
    its process the same way.)"""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_sigint() -> None:
    """In a child started by children_ignore_sigint(): ignore SIGINT and unblock it, which
    drops a Ctrl-C that came while the child started (the parent has it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def spawn_python(code: str) -> subprocess.Popen:
    """`python -c code` with pipes on stdin (its settings in, then its lifeline) and stdout
    (its answers), SIGINT blocked from its first instruction on (children_ignore_sigint)."""
    with children_ignore_sigint():
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
