"""Issue 31's walk: the run config travels a short way (bench/config_walk.py counts the calls
that receive it, or an object it was passed into, from the command's entry on). `agentx run`
at most 30 calls and 6 climbs back to a higher layer, `agentx ab` at most 45 calls; the
engine's processes get their slice of it (engine.drive.Workload), not the config."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import config_walk  # noqa: E402


@pytest.mark.parametrize("command,max_calls,max_climbs", [("run", 30, 6), ("ab", 45, None)])
def test_the_config_walk_is_short(command, max_calls, max_climbs):
    w = config_walk.walk(command)
    f = w.figures()
    listing = "\n".join(f"{a}:{line} -> {b}.{q}" for a, line, b, q in w.calls)
    # the walk does reach the run (a broken walk finding nothing would pass vacuously)
    assert ("agentx.run", "run") in {(b, q) for _, _, b, q in w.calls}, listing
    assert f["calls"] <= max_calls, listing
    if max_climbs is not None:
        assert f["climbs"] <= max_climbs, listing


def test_a_worker_gets_the_engines_slice_not_the_run_config():
    from agentx.engine.drive import DriveShare, Workload

    for cls in (DriveShare, Workload):
        types = " ".join(str(f.type) for f in dataclasses.fields(cls))
        assert "RunConfig" not in types, cls.__name__


def test_run_py_wires_the_phases():
    """run.py wires (probe, instruments, drive, summary), the work is in the phases' modules."""
    assert len((REPO / "agentx" / "run.py").read_text().splitlines()) < 200
