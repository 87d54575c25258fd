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


def _class_rows(text: str) -> dict[str, list[float]]:
    """run -> [prefill steps, median, summed ratio, decode-only steps, median, summed ratio]."""
    rows = re.findall(r"^(\S+)\s+(?:simple-cpu|none)\s+\| prefill\s+(\d+) steps ([\d.]+) / ([\d.]+) \| "
                      r"decode-only\s+(\d+) steps ([\d.]+) / ([\d.]+)$", text, re.M)
    return {r[0]: [float(x) for x in r[1:]] for r in rows}


PROBED = {"offbp3", "off54", "off68", "off68b", "off75", "off54b", "off54c", "off68c", "off75b", "offbp4"}


def test_profile_constants_are_what_the_fit_writes_from_the_measurements(connector_steps_output):
    """The shipped profile's offload_step_cost is bench/connector_steps.py's output on the
    real per-step data, not a figure typed in."""
    fitted = re.search(r"per connector \(pooled over [^)]*\): (\{.*\})", connector_steps_output).group(1)
    shipped = load_profile("h200-qwen3-8b-bf16").calibration.offload_step_cost
    for kind, fields in (("simple-cpu", ("factor", "stall_fraction", "stall_ms", "load_ms_per_kblock",
                                         "store_ms_per_kblock")),
                         ("mooncake", ("factor", "stall_fraction", "stall_ms"))):
        for field in fields:
            m = re.search(rf"'{kind}': \{{[^}}]*'{field}': ([\d.]+)", fitted)
            assert float(m.group(1)) == pytest.approx(getattr(shipped[kind], field)), (kind, field)
    # what the measurements say: SimpleCPUOffload costs the host's launch of a step's copies, tens
    # of ms per 1,000 blocks (a few us a block), and nothing else; Mooncake slows every step by a
    # fifth and stalls ~4 % of them by a quarter of a second
    sc, mc = shipped["simple-cpu"], shipped["mooncake"]
    assert (sc.factor, sc.stall_fraction, sc.stall_ms) == (1.0, 0.0, 0.0)
    assert 30 < sc.load_ms_per_kblock < 80 and 20 < sc.store_ms_per_kblock < 70
    assert mc.factor > 1.1 and mc.stall_fraction > 0.01 and mc.stall_ms > 100


def test_simple_cpu_offloads_extra_time_is_the_launch_of_its_copies(connector_steps_output):
    """On every probed SimpleCPUOffload run at 32 lanes (offbp3 against its own day's baseline,
    the nine of h200-runs-8 and -9 shown against it), steps that compute prompt tokens take what
    the same batches take without a connector, and the decode-only steps carry the connector's
    extra time (16-35 % summed), so a factor on every step overprices the prefill steps. Priced
    with the host's launch of each step's copies (fitted on offbp3 alone), the decode-only steps
    lose about half or more of that excess on all ten runs (47-84 % beyond the baseline runs' own
    ratio) and the prefill steps keep the baseline's time."""
    plain, launch = connector_steps_output.split("the host's launch of each step's copies")
    before, after = _class_rows(plain), _class_rows(launch)
    assert PROBED <= set(before) and PROBED <= set(after)
    base_dec = max(before[b][5] for b in ("cap32p", "cap32p2"))  # the baseline runs' own: 1.04-1.05
    for name in PROBED:
        n_pre, _, pre_time, n_dec, _, dec_time = before[name]
        assert n_pre > 300 and n_dec > 2500, name
        assert 0.95 < pre_time < 1.0, (name, pre_time)  # prefill steps: the baseline's time
        assert dec_time > 1.15, (name, dec_time)  # decode-only steps: 16-35 % more in all
        pre_l, dec_l = after[name][2], after[name][5]
        assert abs(pre_l - pre_time) < 0.01, name  # long steps hide the launch
        assert dec_l - base_dec < 0.6 * (dec_time - base_dec), (name, dec_l)  # 47-84 % of the excess


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


def test_the_simulator_prices_mooncakes_steps_as_measured():
    base = _steps("none")
    cost = load_profile("h200-qwen3-8b-bf16").calibration.offload_step_cost["mooncake"]
    steps = _steps("mooncake")
    assert statistics.median(steps) == pytest.approx(cost.factor * statistics.median(base), rel=1e-6)
    stalled = [m for m, b in zip(steps, base) if m > cost.factor * b + 1e-9]
    assert len(stalled) == pytest.approx(cost.stall_fraction * len(steps), abs=1)
    assert statistics.mean(stalled) - cost.factor * base[0] == pytest.approx(cost.stall_ms, rel=1e-6)


def test_the_simulator_prices_simple_cpu_offloads_copy_launch_as_measured():
    """A step is priced as without the connector unless it launches copies, and then takes the
    longer of its own time and their launch: a decode step launching 1,024 stored blocks takes
    the launch's 43 ms, a 12k-token prefill chunk hides it."""
    r = resolve(SimConfig(profile="h200-qwen3-8b-bf16", kv_pool_tokens=196_608))
    cost = load_profile("h200-qwen3-8b-bf16").calibration.offload_step_cost["simple-cpu"]
    plain, sc = StepTiming(r, 0, offload="none"), StepTiming(r, 0, offload="simple-cpu")

    def price(t: StepTiming, prefill: int, load: int, store: int) -> float:
        b = t.new_batch()
        for _ in range(4):
            b.add_decode(None, 8_000, 1)
        if prefill:
            b.add_prefill(None, 0, prefill)
        b.load_blocks, b.store_blocks = load, store
        return t.step_seconds(b) * 1e3

    assert price(sc, 0, 0, 0) == pytest.approx(price(plain, 0, 0, 0))  # no copies: no cost
    assert price(sc, 0, 0, 1024) == pytest.approx(cost.store_ms_per_kblock * 1.024)
    assert price(sc, 0, 500, 1024) == pytest.approx(cost.load_ms_per_kblock * 0.5 + cost.store_ms_per_kblock * 1.024)
    assert price(sc, 12_000, 0, 1024) == pytest.approx(price(plain, 12_000, 0, 1024))  # hidden
