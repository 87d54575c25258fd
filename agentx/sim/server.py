"""Serving the simulator: `serve()` runs a SimServer on a socket until told to stop; `run()` is
the blocking standalone entry point of `agentx serve-sim` (SIGINT/SIGTERM stop it cleanly)."""
from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from ..aio import new_event_loop
from .api import SimServer
from .config import SimConfig

__all__ = ["SimServer", "serve", "run"]


async def serve(cfg: SimConfig, ready=None, stop_event: asyncio.Event | None = None,
                watch=None) -> None:
    """Run until `stop_event` is set, or `watch()` (polled every 0.1 s) returns true;
    `ready(port, sim)` is called once the socket listens."""
    sim = SimServer(cfg)
    app = sim.build_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    # our own listener instead of web.TCPSite: its protocol stamps when each request's bytes
    # were read (rxstamp), before aiohttp queues the request for a handler task
    listener = await asyncio.get_running_loop().create_server(
        sim.rx.factory(runner.server), cfg.host, cfg.port, backlog=4096, reuse_address=True)
    port = listener.sockets[0].getsockname()[1]  # port 0 -> the chosen one
    if ready is not None:
        ready(port, sim)
    stop_event = stop_event or asyncio.Event()
    poll = asyncio.create_task(_poll(watch, stop_event)) if watch is not None else None
    try:
        await stop_event.wait()
    finally:
        if poll is not None:
            poll.cancel()
        listener.close()
        await runner.cleanup()


async def _poll(watch, stop_event: asyncio.Event) -> None:
    while not watch():
        await asyncio.sleep(0.1)
    stop_event.set()


def run(cfg: SimConfig) -> int:
    """Blocking standalone server (`agentx serve-sim`); SIGINT/SIGTERM stop it cleanly."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass

    def ready(port: int, sim: SimServer) -> None:
        print(sim.describe(), file=sys.stderr)
        print(f"agentx sim: listening on http://{cfg.host}:{port}", file=sys.stderr, flush=True)

    try:
        loop.run_until_complete(serve(cfg, ready, stop))
    finally:
        loop.close()
    return 0
