"""`python -m agentx.sim [options]`: the serve-sim command without the rest of the agentx CLI."""
from __future__ import annotations

import argparse
import sys

from ..errors import InputError
from .cli import add_parser


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentx.sim")
    sub = p.add_subparsers(dest="command")
    add_parser(sub)
    args = p.parse_args(["serve-sim", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        print(str(err), file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
