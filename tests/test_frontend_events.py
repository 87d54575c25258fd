"""sim_calibration/events.py: client records and vLLM engine events on one clock, and the claims
docs/simulator-calibration-log.md ("The front end, measured") makes from the shipped probed runs."""
from __future__ import annotations

import io
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from agentx.sim.profile import load_profile
from sim_calibration.events import (
    Probed,
    arrivals,
    clock_offset,
    first_token_lags,
    fit_frontend,
    probed_runs,
)
from sim_calibration.realruns import DATA, PROFILE
from sim_calibration.steps import before_admissions, idle_admissions, load_steps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import frontend_events  # noqa: E402

RUNS = {r.name: r for r in probed_runs(DATA)}


def _synthetic(offset_s: float, a_ms: float, b_us: float) -> Probed:
    """Four requests sent to an idle engine and one that arrives while an engine call runs: the
    engine clock is the client's minus `offset_s`, the front end takes a_ms + b_us x prompt, and
    each last token reaches the client 1-3 ms after the engine's free (the floor is 1 ms)."""
    recs, events, steps = [], [], []
    for i, (send, isl, out_ms) in enumerate([(1.0, 1000, 1), (2.0, 20000, 3), (3.0, 5000, 2), (4.0, 40000, 1),
                                             (5.0, 8000, 2)]):
        add = send + (a_ms + b_us * isl / 1e3) / 1e3
        if i == 4:  # busy: a call runs from just before the add to 50 ms after it
            steps.append({"t": add - 0.001 - offset_s, "dt": 0.051})
            add = steps[-1]["t"] + offset_s + steps[-1]["dt"]
        free = add + 0.1
        rid = f"run-{i}-{i + 1}"
        recs.append({"request_id": rid, "isl": isl, "start_ns": int(send * 1e9), "ok": True,
                     "end_ns": int((free + out_ms / 1e3) * 1e9), "chunk_offsets_ns": [0, 1]})
        events += [{"t": add - offset_s, "ev": "add", "req": f"cmpl-{rid}-0-abc", "prompt": isl},
                   {"t": free - offset_s, "ev": "free", "req": f"cmpl-{rid}-0-abc"}]
    return Probed("syn", "H200", 8, recs, sorted(events, key=lambda e: e["t"]), steps)


def test_one_clock_and_the_front_end_recovered_from_synthetic_events():
    run = _synthetic(offset_s=1234.5, a_ms=7.0, b_us=0.4)
    off, spread = clock_offset(run)
    # the floor is the constant plus the shortest output path (1 ms)
    assert off == pytest.approx(1234.5 + 0.001, abs=1e-6)
    assert sorted(spread.round(3)) == [0, 0, 1, 1, 2]
    arrs = arrivals(run, off)
    assert [a.at_step_end for a in arrs] == [False] * 4 + [True]
    # the work plus the 1 ms floor (the shortest output path, counted in the front end); the
    # request that waited for a call is left out
    a, b, rms, n = fit_frontend(arrs)
    assert (n, a, b) == (4, pytest.approx(8.0), pytest.approx(0.4))
    assert rms == pytest.approx(0.0, abs=1e-6)
    assert arrs[4].gap_ms > 40  # it waited for the call's end


def test_thirty_two_lanes_add_almost_every_request_at_the_end_of_an_engine_call():
    """The engine core takes in new requests only between its calls: at 32 lanes it is never idle."""
    runs = [r for r in RUNS.values() if r.lanes == 32]
    assert len(runs) >= 15
    for r in runs:
        meas = [a for a in arrivals(r, clock_offset(r)[0]) if not a.warmup]
        assert sum(a.at_step_end for a in meas) >= 0.9 * len(meas), r.name


def test_measured_front_end_is_a_fraction_of_the_fitted_one():
    """At 8 lanes (the three H100 runs) the API server's work, send -> engine-core add with the clocks
    lined up to within 2 ms, is well under half of what the profile's fitted front end gives at the
    median prompt: that constant carries engine-side time the model does not price elsewhere."""
    cal = load_profile(PROFILE).calibration
    for name in ("h100-base8", "h100-base8b", "h100-spec8"):
        run = RUNS[name]
        off, spread = clock_offset(run)
        assert np.quantile(spread, 0.9) < 2.0
        arrs = arrivals(run, off)
        a, b, _, n = fit_frontend(arrs)
        isl = float(np.median([x.isl for x in arrs]))
        assert n >= 30
        assert a + b * isl / 1e3 < 0.5 * (cal.frontend_ms + cal.frontend_us_per_prompt_token * isl / 1e3), name


def test_first_output_of_a_stream_lags_the_later_ones():
    for name in ("h100-base8", "h100-base8b", "h100-spec8"):
        first, second = first_token_lags(RUNS[name], clock_offset(RUNS[name])[0])
        assert len(first) >= 40
        assert np.median(first) > np.median(second) + 3.0, name


def test_admission_into_an_idle_engine_costs_what_the_admission_after_a_decode_step_is_priced():
    """H200 `cap` (16 lanes, one request at a time most of the time): the engine calls admitting
    one short prompt into an idle engine take on average what the profile's admission constants
    (fitted on the calls before an admission that follows a decode step) give for them."""
    cal = load_profile(PROFILE).calibration
    idle = idle_admissions(load_steps(DATA, "cap"))
    assert len(idle) >= 25
    priced = cal.admit_host_ms + cal.admit_host_us_per_token * 0.15  # ~150-token admissions
    assert np.mean(idle) == pytest.approx(priced, rel=0.25)


def test_cli_prints_every_probed_run_and_the_pooled_front_end():
    out = io.StringIO()
    with redirect_stdout(out):
        assert frontend_events.main([]) == 0
    text = out.getvalue()
    assert all(f"| {name} |" in text for name in RUNS)
    assert "H200, all runs: front end" in text and "H100, all runs: front end" in text


def test_the_h100_host_prepares_an_8k_admission_as_the_h200_hosts_do():
    """The H100 runs stand in for the H200's host side: on the same configuration (the capped pool
    without a connector, 32 lanes) the decode-only calls before an 8k-chunk admission take on
    average what they take in the H200's cap32 group (within its run-to-run range)."""
    def mean_before_admission(name: str, folder: str) -> float:
        return float(np.mean([ms for _, ms in before_admissions(load_steps(DATA, name, Path(folder) / "steps"))]))

    h200 = [mean_before_admission(n, d) for n, d in (("cap32", "h200-runs-6"), ("cap32p", "h200-runs-7"),
                                                     ("cap32p2", "h200-runs-7"))]
    assert min(h200) <= mean_before_admission("h100-cap32", "h100-runs-2") <= max(h200)
