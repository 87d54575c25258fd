"""`agentx run` (and `python bench.py`): flags -> RunConfig (+ the embedded simulator's
options) -> run -> console summary.

Every flag comes from a RunConfig field, and `--sim-*` from the embedded simulator's options
(agentx.targets.embedded.EmbeddedSimOptions: SimConfig's fields less host, port and api_key),
the target started when no --base-url is given; this module only wires the command."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..config import RunConfig
from ..options import add_arguments, build, flag_namer, from_args, values_from_args
from ..sim.config import SimConfig

if TYPE_CHECKING:
    from ..targets.base import Server
    from ..targets.embedded import EmbeddedSimOptions

# = targets.embedded.FLAG_PREFIX and NOT_OPTIONS: the flags are read off SimConfig so that
# `agentx run --help` does not import the target and its HTTP client (~0.25 s);
# tests/test_commands.py checks the two agree
SIM_PREFIX = "sim-"
SIM_EXCLUDED = ("host", "port", "api_key")
SIM_GROUP = "embedded simulator (no --base-url)"
EXIT_FAILED, EXIT_ABORTED, EXIT_INTERRUPTED = 3, 4, 130  # 2: bad input (errors.InputError)


def configure(p: argparse.ArgumentParser) -> None:
    add_arguments(p, RunConfig)
    add_arguments(p, SimConfig, prefix=SIM_PREFIX, group=SIM_GROUP, exclude=SIM_EXCLUDED)
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return from_args(args, RunConfig)


def sim_from_args(args: argparse.Namespace) -> EmbeddedSimOptions:
    """The `--sim-*` flags (checked even with --base-url, where they are unused)."""
    from ..targets.embedded import EmbeddedSimOptions

    data = values_from_args(args, SimConfig, prefix=SIM_PREFIX, exclude=SIM_EXCLUDED)
    return build(EmbeddedSimOptions, data,
                 field_name=flag_namer(EmbeddedSimOptions, prefix=SIM_PREFIX))


def target_from_args(cfg: RunConfig, args: argparse.Namespace) -> Server:
    """The server at --base-url, else the embedded simulator (which takes the run's key and
    golden pin)."""
    from ..targets.choice import EmbeddedChoice, UrlChoice
    from ..targets.open import open_server

    sim = sim_from_args(args)
    if cfg.base_url:
        return open_server(UrlChoice(cfg.base_url))
    return open_server(EmbeddedChoice(sim, api_key=cfg.secret_key(), pin=cfg.golden_al))


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    return run(cfg, target_from_args(cfg, args))


def run(cfg: RunConfig, target: Server | None = None) -> int:
    from ..report.console import print_summary
    from ..run import run as run_once
    from ..rundir import RunDir

    summary = run_once(cfg, target)
    print_summary(summary)
    print(f"results: {summary['output_dir']}/{RunDir.SUMMARY}, {RunDir.REQUESTS}")
    if summary.get("outages"):
        from ..metrics.outages import describe

        print(f"agentx: {describe(summary['outages'])}", file=sys.stderr)
    v = summary.get("validation") or {}
    for w in v.get("warnings") or []:
        print(f"agentx: warning: {w}", file=sys.stderr)
    code = exit_code(summary, cfg.validation)
    if code == EXIT_ABORTED:
        print(f"agentx: {summary['stop_reason']}", file=sys.stderr)
    return code


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
