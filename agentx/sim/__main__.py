"""`python -m agentx.sim [options]`: the same as `agentx serve-sim [options]` (an entry point
above the package, like the `agentx` script: the one import of agentx.sim that runs up)."""
from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["serve-sim", *sys.argv[1:]]))
