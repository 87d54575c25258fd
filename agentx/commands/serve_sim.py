"""`agentx serve-sim` (and `python -m agentx.sim`): run the vLLM-compatible simulator
standalone; every flag comes from SimConfig (agentx/sim/config.py)."""
from __future__ import annotations

import argparse

from ..options import add_arguments, from_args
from ..sim.config import SimConfig

SOURCE = "serve-sim"


def configure(p: argparse.ArgumentParser) -> None:
    add_arguments(p, SimConfig)
    p.set_defaults(func=main)


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build and validate the config; bad values raise InputError (one line, exit 2)."""
    return from_args(ns, SimConfig, source=SOURCE)


def main(ns: argparse.Namespace) -> int:
    return run(config_from_args(ns))


def run(cfg: SimConfig) -> int:
    from ..sim.profile import resolve
    from ..sim.server import run as serve

    resolve(cfg)  # load the profile now so bad input fails before the loop starts
    return serve(cfg)
