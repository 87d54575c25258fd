"""Data directories that live at the top of the repository and ship inside the wheel.

setup.py installs a top-level `NAME/` directory (traces/, recipes/) as the package
`agentx._NAME`, so one lookup serves a wheel, a source checkout and an editable install."""
from __future__ import annotations

import os
from pathlib import Path

import agentx


def data_dir(name: str, env_var: str) -> Path:
    """$env_var if set; else `agentx/_<name>` of an installed wheel; else `<repo>/<name>`."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    pkg = Path(agentx.__file__).resolve().parent
    shipped = pkg / f"_{name}"
    return shipped if shipped.is_dir() else pkg.parent / name
