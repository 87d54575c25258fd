"""`python -m agentx.sim [options]`: the same as `agentx serve-sim [options]`.

It runs the `agentx` program (`python -m agentx serve-sim ...`) rather than importing
agentx.cli: the simulator package imports nothing above it, and this file is an entry point
handing over to another, not a user of the command line's code."""
from __future__ import annotations

import runpy
import sys

if __name__ == "__main__":
    sys.argv[1:1] = ["serve-sim"]
    runpy.run_module("agentx", run_name="__main__", alter_sys=True)
