"""The embedded simulator as a target: agentx's simulator beside the client on a free
loopback port (its own child process, agentx.sim.embedded.SimProcess), what `agentx run` and
`bench.py` measure when no --base-url is given. Its options are `EmbeddedSimOptions` (the
`--sim-<option>` flags); the run's API key and golden pin are applied on top."""
from __future__ import annotations

from ..config import RunConfig
from ..errors import InputError
from ..golden_al import GoldenPin
from ..sim.config import SimConfig
from ..sim.embedded import SimProcess, start_in_process
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

    @classmethod
    def for_run(cls, cfg: RunConfig, options: SimConfig | dict | None = None) -> EmbeddedSim:
        """The simulator a run without --base-url measures: it takes the run's key and pin."""
        return cls(options, api_key=cfg.secret_key(), pin=cfg.golden_al)

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
