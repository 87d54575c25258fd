"""The embedded simulator as a target: agentx's simulator beside the client on a free
loopback port, what `agentx run` and `bench.py` measure when no --base-url is given. Its
process lifecycle is here (SimProcess: start, ready, stop), as every target's is in
agentx.targets; agentx.sim.embedded.serve_child is the child's side. Its options are
`EmbeddedSimOptions` (the `--sim-<option>` flags); the run's API key and golden pin are
applied on top."""
from __future__ import annotations

import pickle
import select
import struct
import subprocess

from ..child_process import spawn_python
from ..errors import InputError
from ..golden_al import GoldenPin
from ..sim.config import SimConfig
from .base import Server, Target

FLAG_PREFIX = "sim-"  # `--sim-profile`, `--sim-time-scale`, ...
NOT_OPTIONS = ("host", "port", "api_key")  # the target sets these, never a flag


class EmbeddedSimOptions(SimConfig):
    """The embedded simulator's options: SimConfig's fields but host, port and api_key (a
    loopback port, and the key the run sends)."""


def pinned(pin: GoldenPin | None, sim: SimConfig) -> dict:
    """SimConfig updates that pin the simulator to `pin` (K and synthetic AL), unless its own
    synthetic acceptance was set explicitly."""
    if pin is None or sim.synthetic_al is not None or sim.synthetic_rates is not None:
        return {}
    return {"spec_k": pin.k, "synthetic_al": pin.al}


class SimProcess:
    """Handle of a simulator running in a child process (sim.embedded.serve_child).

    A plain `python -c` child, not multiprocessing: nothing re-imports the caller's main
    module, so a script calling `agentx.run.run()` needs no `__main__` guard. The config goes
    over the child's stdin, which then stays open as its lifeline: closing it (stop(), or this
    process dying) stops the child; it answers `ready PORT` on stdout."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "SimProcess":
        # a Ctrl-C while it starts is the parent's to handle (it stops the child)
        self._proc = p = spawn_python("from agentx.sim.embedded import serve_child; serve_child()")
        try:
            blob = pickle.dumps(self.cfg)
            p.stdin.write(struct.pack("<Q", len(blob)) + blob)
            p.stdin.flush()
            ready, _, _ = select.select([p.stdout], [], [], timeout)
        except BaseException:  # interrupted: stop it while its stdout is still read
            self.stop()
            raise
        line = p.stdout.readline().decode(errors="replace").strip() if ready else ""
        kind, _, value = line.partition(" ")
        if kind != "ready":
            self.stop()
            if value.startswith("InputError: error: "):  # a bad profile or option: exit 2
                where, _, why = value.removeprefix("InputError: error: ").partition(": ")
                raise InputError(where, why)
            raise RuntimeError("embedded simulator failed to start: "
                               + (value or line or "no answer in time"))
        self.port = int(value)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it cleanly (its truth log is closed before this returns); idempotent."""
        p = self._proc
        if p is None or p.returncode is not None:
            return
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()

    def __enter__(self) -> "SimProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()




def start_in_process(cfg: SimConfig, timeout: float = 60.0) -> SimProcess:
    """Start a simulator process on 127.0.0.1 and a free port (cfg.host/port are overridden)."""
    cfg = cfg.model_copy(update={"host": "127.0.0.1", "port": 0})
    return SimProcess(cfg).start(timeout)


class EmbeddedSim(Server):
    """`with EmbeddedSim(options) as target:` a simulator process on 127.0.0.1:<free port>,
    stopped (its truth log closed) when the block ends. `api_key`: the key it requires;
    `pin`: the golden entry its synthetic AL is pinned to (RunConfig.golden_al)."""

    def __init__(self, options: SimConfig | dict | None = None, *, api_key: str | None = None,
                 pin: GoldenPin | None = None, start_timeout_s: float = 60.0) -> None:
        opts = EmbeddedSimOptions.model_validate(
            options.model_dump() if isinstance(options, SimConfig) else options or {})
        if pin is not None and opts.spec_k not in (0, pin.k):
            raise InputError("command line", f"the golden entry is for K={pin.k} but "
                             f"--sim-spec-k is {opts.spec_k}", field="--golden-al")
        self.options, self.api_key, self.pin = opts, api_key, pin
        self.start_timeout_s = start_timeout_s
        self.proc: SimProcess | None = None

    def start(self) -> Target:
        self.stop()
        cfg = SimConfig.model_validate({
            **self.options.model_dump(), "port": 0, "api_key": self.api_key,
            **pinned(self.pin, self.options)})
        self.proc = start_in_process(cfg, self.start_timeout_s)
        recorded = self.options.model_dump(mode="json")
        recorded.pop("api_key", None)
        self.target = Target("embedded", self.proc.base_url, profile=self.options.profile,
                             connector=getattr(self.options, "kv_offload", None), options=recorded,
                             builtin_tokens=True, local_cores=1)
        return self.target

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
