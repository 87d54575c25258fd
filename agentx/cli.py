"""`agentx` command line: one subcommand per concern, each registered by its own module."""
from __future__ import annotations

import argparse
import sys

from .errors import InputError, RunLost

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def build_parser() -> argparse.ArgumentParser:
    from .ab.cli import add_parser as add_ab
    from .calibrate.cli import add_parser as add_calibrate
    from .recipe.cli import add_parsers as add_recipe
    from .report.cli import add_parser as add_report
    from .run_cli import add_parser as add_run
    from .sim.cli import add_parser as add_sim
    from .trace.cli import add_parser as add_trace

    p = argparse.ArgumentParser(prog="agentx", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    add_run(sub)
    add_trace(sub)
    add_sim(sub)
    add_recipe(sub)
    add_report(sub)
    add_calibrate(sub)
    add_ab(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (InputError, RunLost) as err:
        print(str(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C before a run handles it (start-up), or in a command
        print("agentx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
