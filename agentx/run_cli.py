"""`agentx run` (and `python bench.py`): flags -> RunConfig -> run -> console summary.

Every flag comes from a RunConfig field (`--sim-*` from SimConfig's), so this module only
wires the command: the option list lives in agentx/config.py and agentx/sim/config.py."""
from __future__ import annotations

import argparse
import sys

from .config import RunConfig
from .options import add_arguments, build, flag_namer, values_from_args
from .sim.config import SimConfig

SIM_PREFIX = "sim-"
# the run's own flags cover these (or the embedded server sets them)
SIM_EXCLUDED = ("host", "port", "api_key")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="replay a trace against a server (default: embedded simulator)")
    add_run_arguments(p)
    p.set_defaults(func=main)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p, RunConfig)
    add_arguments(p, SimConfig, prefix=SIM_PREFIX, group="embedded simulator (no --base-url)",
                  exclude=SIM_EXCLUDED)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    data = values_from_args(args, RunConfig)
    data["sim"] = values_from_args(args, SimConfig, prefix=SIM_PREFIX, exclude=SIM_EXCLUDED)
    return build(RunConfig, data, field_name=flag_namer(RunConfig, {"sim": SIM_PREFIX}))


def main(args: argparse.Namespace) -> int:
    from .report.console import print_summary
    from .run import run

    cfg = config_from_args(args)
    summary = run(cfg)
    print_summary(summary)
    print(f"results: {summary['output_dir']}/summary.json, requests.jsonl")
    v = summary.get("validation") or {}
    for w in v.get("warnings") or []:
        print(f"agentx: warning: {w}", file=sys.stderr)
    code = exit_code(summary, cfg.validation)
    if code == EXIT_ABORTED:
        print(f"agentx: {summary['stop_reason']}", file=sys.stderr)
    return code


EXIT_FAILED, EXIT_ABORTED, EXIT_INTERRUPTED = 3, 4, 130  # 2: bad input (errors.InputError)


def exit_code(summary: dict, validation: str) -> int:
    """The run's exit status (table in docs/reliability.md): an error-rate abort and a signal
    are reported whatever --validate says; a failed or insufficient verdict only under
    --validate strict."""
    stop = summary.get("stop_reason") or ""
    if stop.startswith("aborted"):
        return EXIT_ABORTED
    if stop == "signal":
        return EXIT_INTERRUPTED
    verdict = (summary.get("validation") or {}).get("verdict")
    return EXIT_FAILED if validation == "strict" and verdict in ("fail", "insufficient") else 0
