"""The simulator beside the client, on 127.0.0.1:<free port>.

`serve_child` is the simulator's side of the embedded target (agentx.targets.embedded, which
starts and stops the child process: `agentx run` / `bench.py` without --base-url): a
simulator thread in the client's process would hold the client's GIL while it steps,
delaying the client's timestamps by milliseconds, and the run would rightly be flagged
`client-bound`. `start_in_thread` keeps it in this process, for tests that inspect the
SimServer object:
    with start_in_thread(SimConfig(profile="cpu-tiny", time_scale=100)) as sim:
        requests go to sim.base_url
"""
from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import sys
import threading

from ..aio import new_event_loop
from .config import SimConfig


class SimThread:
    """Handle of a running in-process simulator."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.port = 0
        self.sim = None  # the SimServer, for in-process inspection (tests)
        self._loop = new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="agentx-sim", daemon=True)
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def _main(self) -> None:
        from .server import serve

        asyncio.set_event_loop(self._loop)

        def ready(port, sim) -> None:
            self.port, self.sim = port, sim
            self._ready.set()

        async def main() -> None:
            self._stop = asyncio.Event()
            await serve(self.cfg, ready, self._stop)

        try:
            self._loop.run_until_complete(main())
        except BaseException as e:  # surfaced to the caller of start_in_thread
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    def start(self, timeout: float = 30.0) -> "SimThread":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("embedded simulator did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join its thread; safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive() and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # loop already closed
                pass
            self._thread.join(timeout)

    def __enter__(self) -> "SimThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_in_thread(cfg: SimConfig) -> SimThread:
    """Start a simulator on 127.0.0.1 and a free port (cfg.host/port are overridden)."""
    cfg = cfg.model_copy(update={"host": "127.0.0.1", "port": 0})
    return SimThread(cfg).start()


def serve_child() -> None:
    """The child: read the config, serve until stdin closes. SIGINT is the parent's to handle
    (a Ctrl-C drains the run's in-flight requests, which still need the server)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .server import serve

    src, out = sys.stdin.buffer, sys.stdout
    (n,) = struct.unpack("<Q", src.read(8))
    cfg = pickle.loads(src.read(n))
    closed = threading.Event()
    threading.Thread(target=lambda: (src.read(), closed.set()), daemon=True).start()

    def say(line: str) -> None:
        """A line to the parent; a parent gone (interrupted while this started) is a stop,
        not a BrokenPipeError traceback on its terminal."""
        try:
            out.write(line)
            out.flush()
        except (BrokenPipeError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing left to flush at exit
            closed.set()

    def ready(port: int, _sim) -> None:
        say(f"ready {port}\n")

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(cfg, ready, watch=closed.is_set))
    except Exception as e:  # noqa: BLE001 (the parent raises it)
        say(f"error {type(e).__name__}: {e}\n".replace("\n", " ").rstrip() + "\n")
        os._exit(1)  # not SystemExit: the stdin reader thread would crash the interpreter's exit
    finally:
        loop.close()
