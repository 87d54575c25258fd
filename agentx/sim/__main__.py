"""`python -m agentx.sim [options]`: the same as `agentx serve-sim [options]`."""
from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["serve-sim", *sys.argv[1:]]))
