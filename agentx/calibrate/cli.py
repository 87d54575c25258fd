"""`agentx calibrate`: flags -> CalibrateConfig -> calibrate -> golden file (exit 1 when a
cell measured nothing)."""
from __future__ import annotations

import argparse

from ..options import add_arguments, build, flag_namer, values_from_args
from .config import CalibrateConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure a draft's acceptance length per thinking "
                       "mode and K, write the golden AL file", description=__doc__)
    add_arguments(p, CalibrateConfig)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from .flow import calibrate

    cfg = build(CalibrateConfig, values_from_args(args, CalibrateConfig),
                field_name=flag_namer(CalibrateConfig))
    result = calibrate(cfg, lambda m: print(f"agentx calibrate: {m}", flush=True))
    failed = [c for c in result["cells"] if c["error"]]
    print(f"golden file: {result['golden_file'] or '(not written: nothing measured)'}; "
          f"runs: {result['output_dir']}/calibration.json")
    return 1 if failed else 0
