"""Child processes that die with their parent.

A SIGKILLed `agentx` runs no cleanup, so each child watches its parent itself, two ways:
- Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`, man 2 prctl): the kernel signals the
  child when its parent exits. Caveat from the man page: it fires when the *thread* that created
  the child exits, and it is cleared by exec of a set-user-ID binary;
- a watchdog thread polling `os.getppid()`: an orphan is re-parented (to init or a subreaper),
  so its parent pid changes. Works on every POSIX system, within `interval` seconds.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable

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
