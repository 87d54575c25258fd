"""What a KV connector adds to each engine step: measured on the H200 (tests/data/h200-runs-5/steps
and h200-runs-7/steps, bench/stepprobe), fitted by bench/connector_steps.py, applied by the
simulator's step timing."""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from agentx.sim.config import SimConfig
from agentx.sim.profile import load_profile, resolve
from agentx.sim.timing import StepTiming

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def connector_steps_output() -> str:
    """bench/connector_steps.py's printout on the shipped per-step data (run once for the module)."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "connector_steps.py")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_profile_constants_are_what_the_fit_writes_from_the_measurements(connector_steps_output):
    """The shipped profile's offload_step_cost is bench/connector_steps.py's output on the
    real per-step data, not a figure typed in."""
    fitted = re.search(r"per connector \(pooled over [^)]*\): (\{.*\})", connector_steps_output).group(1)
    shipped = load_profile("h200-qwen3-8b-bf16").calibration.offload_step_cost
    for kind in ("simple-cpu", "mooncake"):
        c = shipped[kind]
        for field in ("factor", "stall_fraction", "stall_ms"):
            m = re.search(rf"'{kind}': \{{[^}}]*'{field}': ([\d.]+)", fitted)
            assert float(m.group(1)) == pytest.approx(getattr(c, field)), (kind, field)
    # what the measurements say: at 32 lanes SimpleCPUOffload slows a step by a few per cent and
    # stalls ~2 % of them (around its stores, loads and preemptions); Mooncake slows every step
    # by a fifth and stalls more, for longer
    sc, mc = shipped["simple-cpu"], shipped["mooncake"]
    assert 1.0 < sc.factor < 1.1 and 0.01 < sc.stall_fraction < 0.05
    assert mc.factor > 1.1 and mc.stall_fraction > 0.01 and mc.stall_ms > sc.stall_ms


def test_simple_cpu_offloads_extra_time_is_in_its_decode_only_steps(connector_steps_output):
    """On every probed SimpleCPUOffload run at 32 lanes (offbp3 against its own day's baseline,
    the nine of h200-runs-8 and -9 shown against it), steps that compute prompt tokens take what
    the same batches take without a connector, and the decode-only steps carry the connector's
    extra time: so a factor on every step, the profile's model, overprices the prefill steps."""
    rows = re.findall(r"^(\S+)\s+simple-cpu\s+\| prefill\s+(\d+) steps ([\d.]+) / ([\d.]+) \| "
                      r"decode-only\s+(\d+) steps ([\d.]+) / ([\d.]+)$", connector_steps_output, re.M)
    runs = {r[0]: [float(x) for x in r[1:]] for r in rows}
    probed = {"offbp3", "off54", "off68", "off68b", "off75", "off54b", "off54c", "off68c", "off75b", "offbp4"}
    assert probed <= set(runs)
    for name in probed:
        n_pre, _, pre_time, n_dec, _, dec_time = runs[name]
        assert n_pre > 300 and n_dec > 2500, name
        assert 0.95 < pre_time < 1.0, (name, pre_time)  # prefill steps: the baseline's time
        assert dec_time > 1.15, (name, dec_time)  # decode-only steps: 16-35 % more in all


def _steps(kind: str, n: int = 2000) -> list[float]:
    r = resolve(SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=196_608))
    t = StepTiming(r, 0, offload=kind)
    out = []
    for _ in range(n):
        b = t.new_batch()
        for _ in range(4):
            b.add_decode(None, 8_000, 1)
        out.append(t.step_seconds(b) * 1e3)
    return out


@pytest.mark.parametrize("kind", ["mooncake", "simple-cpu"])
def test_the_simulator_prices_each_connectors_steps_as_measured(kind):
    base = _steps("none")
    cost = load_profile("h200-qwen3-8b-bf16").calibration.offload_step_cost[kind]
    steps = _steps(kind)
    assert statistics.median(steps) == pytest.approx(cost.factor * statistics.median(base), rel=1e-6)
    stalled = [m for m, b in zip(steps, base) if m > cost.factor * b + 1e-9]
    assert len(stalled) == pytest.approx(cost.stall_fraction * len(steps), abs=1)
    assert statistics.mean(stalled) - cost.factor * base[0] == pytest.approx(cost.stall_ms, rel=1e-6)
