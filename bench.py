#!/usr/bin/env python3
"""`python bench.py ...` is `agentx run ...`: replay a trace, print and write the summary."""
import sys

from agentx.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
