"""`agentx calibrate`: flags -> CalibrateConfig -> calibrate -> golden file (exit 1 when a
cell measured nothing)."""
from __future__ import annotations

import argparse

from ..calibrate.config import CalibrateConfig
from ..options import add_arguments, from_args


def configure(p: argparse.ArgumentParser) -> None:
    add_arguments(p, CalibrateConfig)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return run(from_args(args, CalibrateConfig))


def run(cfg: CalibrateConfig) -> int:
    from ..calibrate.flow import calibrate
    from ..rundir import CalibrationDir

    result = calibrate(cfg, lambda m: print(f"agentx calibrate: {m}", flush=True))
    failed = [c for c in result["cells"] if c["error"]]
    print(f"golden file: {result['golden_file'] or '(not written: nothing measured)'}; "
          f"runs: {result['output_dir']}/{CalibrationDir.JSON}")
    return 1 if failed else 0
