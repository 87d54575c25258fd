"""A Ctrl-C while a command is still importing is held, then raised once the command's
handling is in place: a terminal's SIGINT 0.3 s after `python bench.py` (imports of a loaded
machine) exits 130 with one line, never a traceback from inside an import. Holding, not
raising, also keeps a Rust extension's module init (orjson, pydantic_core) from turning the
KeyboardInterrupt into a panic."""
from __future__ import annotations

import signal

_held = False
_previous = None


def _hold(signum, frame) -> None:
    global _held
    _held = True


def hold() -> None:
    """From now until release(), SIGINT is remembered instead of raised. Main thread only (a
    no-op elsewhere, and when already holding). Imports nothing but signal: bench.py calls it
    first, and the window before it is the shorter for it."""
    global _previous
    current = signal.getsignal(signal.SIGINT)
    if current is not _hold:
        try:
            signal.signal(signal.SIGINT, _hold)
        except ValueError:  # not the main thread
            return
        _previous = current


def restore() -> bool:
    """The handler hold() replaced is back; whether a Ctrl-C came meanwhile (forgotten now)."""
    global _held
    if signal.getsignal(signal.SIGINT) is not _hold:
        return False
    signal.signal(signal.SIGINT, _previous if _previous is not None else signal.default_int_handler)
    came, _held = _held, False
    return came


def release() -> None:
    """restore(), and a Ctrl-C held meanwhile raises KeyboardInterrupt now."""
    if restore():
        raise KeyboardInterrupt
