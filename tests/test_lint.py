"""The repository passes its own lint configuration (pyproject.toml [tool.ruff]), so the
README's one test command also checks style and import order."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: pip install -e '.[test]'"
    p = subprocess.run([ruff, "check", "--output-format", "concise", "agentx", "tests", "bench",
                        "bench.py", "setup.py", "sim_calibration"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
