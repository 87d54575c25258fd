#!/usr/bin/env python3
"""`python bench.py ...` is `agentx run ...`: replay a trace, print and write the summary."""
from agentx import sigint_hold

sigint_hold.hold()  # a Ctrl-C while agentx imports exits 130 with one line (agentx.cli.main)

import sys  # noqa: E402

from agentx.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
