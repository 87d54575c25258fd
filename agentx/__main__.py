"""`python -m agentx ...`: the same as the `agentx` command."""
from __future__ import annotations

from . import sigint_hold

sigint_hold.hold()  # a Ctrl-C while agentx imports exits 130 with one line (cli.main)

import sys  # noqa: E402

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
