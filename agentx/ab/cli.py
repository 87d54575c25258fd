"""`agentx ab`: flags -> ABConfig -> both sides run -> table, ab.json, CDF plot.

Every flag comes from a field of ABConfig (agentx/ab/spec.py), whose shared run options are
RunConfig's, and `--sim-*` from SimConfig's (applied to recipe sides on the simulator)."""
from __future__ import annotations

import argparse

from ..options import add_arguments, build, flag_namer, values_from_args
from ..run_cli import SIM_EXCLUDED, SIM_PREFIX
from ..sim.config import SimConfig
from .spec import SIDE_FIELDS, ABConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ab", help="compare two servers (URL or recipe) on the same traffic, "
                       "with bootstrap confidence intervals and a verdict per metric")
    add_arguments(p, ABConfig, exclude=SIDE_FIELDS)
    add_arguments(p, SimConfig, prefix=SIM_PREFIX, group="simulator (recipe sides on the "
                  "simulator)", exclude=SIM_EXCLUDED)
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> ABConfig:
    data = values_from_args(args, ABConfig, exclude=SIDE_FIELDS)
    data["sim"] = values_from_args(args, SimConfig, prefix=SIM_PREFIX, exclude=SIM_EXCLUDED)
    return build(ABConfig, data, field_name=flag_namer(ABConfig, {"sim": SIM_PREFIX}))


def main(args: argparse.Namespace) -> int:
    from .report import print_ab
    from .run import AB_JSON, run_ab

    doc = run_ab(config_from_args(args))
    print_ab(doc)
    print(f"results: {doc['output_dir']}/{AB_JSON}, {doc['plot']}")
    return 0
