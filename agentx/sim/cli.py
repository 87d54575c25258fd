"""`agentx serve-sim`: run the vLLM-compatible simulator standalone (flags from SimConfig)."""
from __future__ import annotations

import argparse

from ..options import add_arguments, build, flag_namer, values_from_args
from .config import SimConfig

SOURCE = "serve-sim"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve-sim", help="run the embedded vLLM-compatible simulator as a server",
                              description=__doc__)
    add_arguments(p, SimConfig)
    p.set_defaults(func=_main)
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build and validate the config; bad values raise InputError (one line, exit 2)."""
    return build(SimConfig, values_from_args(ns, SimConfig, source=SOURCE), source=SOURCE,
                 field_name=flag_namer(SimConfig))


def _main(ns: argparse.Namespace) -> int:
    from .profile import resolve
    from .server import run

    cfg = config_from_args(ns)
    resolve(cfg)  # load the profile now so bad input fails before the loop starts
    return run(cfg)
