"""Serving the simulator: `serve()` runs a SimServer on a socket until told to stop; `run()` is
the blocking standalone entry point of `agentx serve-sim` (SIGINT/SIGTERM stop it cleanly; a
port in use or a host that cannot be bound is one line naming the flag, exit 2)."""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import signal
import socket
import sys

from aiohttp import web

from ..aio import new_event_loop
from ..errors import InputError
from .api import SimServer
from .config import SimConfig

__all__ = ["SimServer", "serve", "run"]
SOURCE = "serve-sim"  # the command its bind errors name


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
    try:
        listener = await asyncio.get_running_loop().create_server(
            sim.rx.factory(runner.server), cfg.host, cfg.port, backlog=4096, reuse_address=True)
    except OSError as exc:
        await runner.cleanup()
        raise bind_error(cfg, exc) from None
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def bind_error(cfg: SimConfig, exc: OSError) -> InputError:
    """The flag to change when the listening socket cannot be made."""
    where = f"{cfg.host}:{cfg.port}"
    if isinstance(exc, socket.gaierror):
        return InputError(SOURCE, f"cannot resolve host {cfg.host!r} ({exc.strerror})",
                          field="--host")
    if exc.errno == errno.EADDRINUSE:
        return InputError(SOURCE, f"{where} is already in use (pick another --port, or 0 for a "
                          "free one)", field="--port")
    if exc.errno == errno.EACCES:
        return InputError(SOURCE, f"no permission to listen on {where} (ports below 1024 need "
                          "privileges)", field="--port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return InputError(SOURCE, f"{cfg.host!r} is not an address of this machine (e.g. "
                          "127.0.0.1, or 0.0.0.0 for all)", field="--host")
    return InputError(SOURCE, f"cannot listen on {where}: {exc.strerror or exc}", field="--host")


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
        if not cfg.api_key and not is_loopback(cfg.host):
            print(f"agentx sim: warning: listening on {cfg.host} without --api-key: anyone who "
                  "can reach this host can use the server", file=sys.stderr)
        print(f"agentx sim: listening on http://{cfg.host}:{port}", file=sys.stderr, flush=True)

    try:
        loop.run_until_complete(serve(cfg, ready, stop))
    finally:
        loop.close()
    return 0
