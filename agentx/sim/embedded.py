"""The simulator in-process: its own event loop in a background thread, on 127.0.0.1:<free port>.

`bench.py` uses it when no --base-url is given; tests use it as a real HTTP server.
    with start_in_thread(SimConfig(profile="cpu-tiny", time_scale=100)) as sim:
        requests go to sim.base_url
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading

from .config import SimConfig


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (cheaper per chunk), else the default loop."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class EmbeddedSim:
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

    def start(self, timeout: float = 30.0) -> "EmbeddedSim":
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

    def __enter__(self) -> "EmbeddedSim":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_in_thread(cfg: SimConfig) -> EmbeddedSim:
    """Start a simulator on 127.0.0.1 and a free port (cfg.host/port are overridden)."""
    cfg = dataclasses.replace(cfg, host="127.0.0.1", port=0)
    return EmbeddedSim(cfg).start()
