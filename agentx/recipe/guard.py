"""`python -m agentx.recipe.guard GRACE PGID...`: stops server process groups if agentx dies.

A server launched by `agentx serve` / `agentx sweep` leads its own process group (so one
signal reaches vLLM's engine and TP workers), which also means nothing the kernel does on
agentx's death reaches it: a SIGKILLed agentx would leave the GPUs busy. This guard, started
beside the server in a session of its own, holds the read end of a pipe whose only write end is
agentx's. When agentx stops the server itself it writes `stopped` first; an EOF without it
means agentx is gone, and the guard stops the groups as agentx would have: SIGTERM, then
SIGKILL after GRACE seconds. It imports nothing from agentx, so it starts in milliseconds.
"""
from __future__ import annotations

import os
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's (the pgid was reused): not ours to kill
        return False
    return True


def stop_groups(pgids: list[int], grace: float) -> None:
    for pgid in pgids:
        if _alive(pgid):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(map(_alive, pgids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pgid in filter(_alive, pgids):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    grace, pgids = float(argv[0]), [int(x) for x in argv[1:]]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides
    if sys.stdin.buffer.read().startswith(b"stopped"):
        return 0
    stop_groups(pgids, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
