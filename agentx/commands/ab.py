"""`agentx ab`: flags -> ABConfig -> both sides run -> table, ab.json, CDF plot.

Every flag comes from a field of ABConfig (agentx/ab/config.py), whose shared run options are
RunConfig's, and `--sim-*` from SimConfig's (applied to recipe sides on the simulator)."""
from __future__ import annotations

import argparse
import sys

from ..ab.config import SIDE_FIELDS, ABConfig
from ..options import add_arguments, build, flag_namer, values_from_args
from ..sim.config import SimConfig
from .run import SIM_EXCLUDED, SIM_PREFIX


def configure(p: argparse.ArgumentParser) -> None:
    add_arguments(p, ABConfig, exclude=SIDE_FIELDS)
    add_arguments(p, SimConfig, prefix=SIM_PREFIX, group="simulator (recipe sides on the "
                  "simulator)", exclude=SIM_EXCLUDED)
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> ABConfig:
    data = values_from_args(args, ABConfig, exclude=SIDE_FIELDS)
    data["sim"] = values_from_args(args, SimConfig, prefix=SIM_PREFIX, exclude=SIM_EXCLUDED)
    return build(ABConfig, data, field_name=flag_namer(ABConfig, {"sim": SIM_PREFIX}))


def main(args: argparse.Namespace) -> int:
    return run(config_from_args(args))


def run(cfg: ABConfig) -> int:
    from ..ab.report import print_ab
    from ..ab.run import run_ab
    from ..rundir import ABDir

    doc = run_ab(cfg)
    print_ab(doc)
    print(f"results: {doc['output_dir']}/{ABDir.JSON}, {doc['plot']}")
    if cfg.validation == "strict" and all(m["verdict"] == "insufficient"
                                          for m in doc["metrics"].values()):
        # nothing decided: exit as `agentx run` does on an insufficient verdict (warn: 0)
        print("agentx ab: no metric has a verdict (every one insufficient): run longer "
              "(--duration), with more lanes or --repeats (docs/ab.md)", file=sys.stderr)
        return 3
    return 0
