"""The real runs the simulator is compared with (agentx/sim/realruns.py): where they are found, and
the send-time jitter of an ensemble of replays (bench/sim_vs_real.py --replays)."""
from __future__ import annotations

import copy

from agentx.sim.realruns import DATA, jittered, runs


def test_runs_found_from_any_working_directory(tmp_path, monkeypatch):
    """`python -m agentx.sim.fit` and bench/sim_vs_real.py find the runs wherever they start."""
    monkeypatch.chdir(tmp_path)
    assert {r.name for r in runs(DATA)} == {"base", "spec", "offA", "offB", "spec32", "offb"}


def test_jitter_is_seeded_bounded_and_leaves_replay_0_alone():
    recs = [{"request_id": str(i), "start_ns": 10**12 + i * 7_000_000, "isl": 100 + i} for i in range(500)]
    recs.append({"request_id": "failed", "start_ns": None})
    before = copy.deepcopy(recs)
    assert jittered(recs, 2.0, 0) == recs  # replay 0: the recorded send times
    one = jittered(recs, 2.0, 1)
    assert recs == before  # the records themselves are not touched
    assert one == jittered(recs, 2.0, 1)  # seeded by the replay index
    assert one != jittered(recs, 2.0, 2)
    shifts = [j["start_ns"] - r["start_ns"] for r, j in zip(recs[:-1], one[:-1])]
    assert max(abs(s) for s in shifts) <= 2_000_000  # within +-J ms
    assert max(shifts) > 1_800_000 and min(shifts) < -1_800_000  # and spread over all of it
    assert one[-1] == recs[-1]  # a record that was never sent stays unsent
    # only the send time moves
    assert [{**j, "start_ns": r["start_ns"]} for r, j in zip(recs, one)] == recs
    assert max(abs(j["start_ns"] - r["start_ns"]) for r, j in zip(recs[:-1], jittered(recs, 0.5, 3))) <= 500_000
