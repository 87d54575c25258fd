"""GPU power and energy: a fake `pynvml` at the library boundary (sys.modules, only the calls
agentx makes) with known power and energy traces, and real short runs against the embedded
simulator: the window's energy, per output token and per request, from the counter's
difference (GPU 0) and from the power integral where the counter is unsupported (GPU 1)."""
from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from agentx.records import read_jsonl
from agentx.scrape import gpu
from agentx.scrape.gpu import energy_block, gpu_rows, scrape_rows, server_on_this_host
from helpers import write_trace

SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20"]
QUICK = ["--conc", "2", "--max-requests", "16", "--duration", "0", "--max-think", "0",
         "--warmup", "0", "--no-progress", "--validate", "off", "--scrape-interval", "0.1",
         *SIM]
P0_W = 300.0  # GPU 0: constant power, energy counter supported
P1_W, SLOPE = 100.0, 50.0  # GPU 1: 100 W + 50 W/s since the fake was made, no counter


class NVMLError(Exception):
    pass


def fake_pynvml(count: int = 2, init_fails: bool = False) -> types.ModuleType:
    """NVML as agentx calls it (pynvml's names and units: mW, mJ, %, bytes, MHz), its
    readings functions of the same clock the records use."""
    m = types.ModuleType("pynvml")
    t0 = time.perf_counter()
    m.NVML_CLOCK_SM = 1
    m.NVMLError = NVMLError
    m.calls = []

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")
    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)

    def power_mw(h) -> int:
        dt = time.perf_counter() - t0
        return int(round(1000 * (P0_W if h[1] == 0 else P1_W + SLOPE * dt)))

    def energy_mj(h) -> int:
        if h[1] != 0:
            raise NVMLError("Not Supported")
        return int(round(5e6 + 1000 * P0_W * (time.perf_counter() - t0)))
    m.nvmlDeviceGetPowerUsage = power_mw
    m.nvmlDeviceGetTotalEnergyConsumption = energy_mj
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def clock(h, kind) -> int:
        assert kind == m.NVML_CLOCK_SM
        return 1980
    m.nvmlDeviceGetClockInfo = clock
    m.t0 = t0
    return m


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("gpu") / "tr", sessions=8, turns=6, think=0.0)


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    monkeypatch.setattr(gpu, "_said", set())  # each test sees its own one-line notice


def test_energy_of_a_run_from_the_counter_and_the_power_integral(cli, tmp_path, trace,
                                                                 monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    out = tmp_path / "run"
    # real time: a window of a second or so, several samples inside it
    r = cli("run", "--trace", trace, "-o", out, "--gpu-indices", "0,1", *QUICK,
            "--sim-time-scale", "1")
    assert r.returncode == 0, r.stderr
    assert "GPU energy" not in r.stderr and nv.calls == ["shutdown"]
    s = json.loads((out / "summary.json").read_text())
    e, win = s["energy"], s["window"]
    a, b = win["start_ns"] / 1e9 - nv.t0, win["end_ns"] / 1e9 - nv.t0
    inside = [r for r in gpu_rows(read_jsonl(out / "metrics.jsonl")[0])
              if win["start_ns"] < r["t_ns"] < win["end_ns"]]
    assert b - a > 0.3 and len(inside) >= 2, (b - a, len(inside))
    assert e["method"] == {"0": "energy counter", "1": "power integral"}
    # GPU 0: the counter's difference over the window = 300 W x the window's seconds
    assert e["per_gpu_j"]["0"] == pytest.approx(P0_W * (b - a), rel=2e-3)
    # GPU 1: power linear in time, so the trapezoids are exact: ∫ (100 + 50 t) dt over [a, b]
    assert e["per_gpu_j"]["1"] == pytest.approx(P1_W * (b - a) + SLOPE / 2 * (b * b - a * a),
                                                rel=2e-3)
    total = e["per_gpu_j"]["0"] + e["per_gpu_j"]["1"]
    out_tok, done = s["tokens"]["output"], s["completed"]
    assert out_tok > 0 and done > 0
    assert e["energy_j"] == pytest.approx(total)
    assert e["j_per_output_token"] == pytest.approx(total / out_tok)
    assert e["j_per_request"] == pytest.approx(total / done)
    assert e["output_tokens_per_j"] == pytest.approx(out_tok / total)
    assert e["mean_power_w"] == pytest.approx(total / (b - a))
    assert "energy (NVML, GPU 0,1" in r.stdout and "J/output token" in r.stdout

    # metrics.jsonl: GPU rows beside the scrapes, which the /metrics readers still get alone
    rows, bad = read_jsonl(out / "metrics.jsonl")
    g, scrapes = gpu_rows(rows), scrape_rows(rows)
    assert bad == 0 and len(g) >= 3 and len(scrapes) >= 2
    assert e["samples"] == len(g)
    first = g[0]["gpus"]
    assert [x["index"] for x in first] == [0, 1]
    assert first[0]["power_w"] == P0_W and first[1]["energy_j"] is None
    assert first[0]["util_pct"] == 87 and first[0]["mem_used_mib"] == 3072
    assert first[0]["sm_clock_mhz"] == 1980
    assert all("running" in x for x in scrapes)
    r2 = cli("report", out)
    assert r2.returncode == 0, r2.stderr
    for png in ("gpu_power.png", "server_timeseries.png", "latency_cdf.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png


@pytest.mark.parametrize("setup, said", [
    (None, "pynvml is not importable: pip install nvidia-ml-py (the extra agentx-bench[gpu])"),
    (lambda: fake_pynvml(init_fails=True), "NVML did not start (NVMLError: Driver Not Loaded)"),
    (lambda: fake_pynvml(count=1), "--gpu-indices: no GPU 1 (NVML sees 1)"),
])
def test_without_nvml_one_line_and_null_energy(cli, tmp_path, trace, monkeypatch, setup, said):
    monkeypatch.setitem(sys.modules, "pynvml", setup() if setup else None)  # None: ImportError
    for i in range(2):  # an A/B's or a sweep's runs: still one line
        r = cli("run", "--trace", trace, "-o", tmp_path / str(i), "--gpu-indices", "0,1",
                *QUICK)
        assert r.returncode == 0, r.stderr
        assert [ln for ln in r.stderr.splitlines() if "GPU energy" in ln] == \
            ([f"agentx: GPU energy: {said}; the energy figures are null"] if i == 0 else [])
        e = json.loads((tmp_path / str(i) / "summary.json").read_text())["energy"]
        assert e["source"] is None and e["note"] == said
        assert [e[k] for k in ("energy_j", "j_per_output_token", "j_per_request",
                               "output_tokens_per_j")] == [None] * 4
        rows, _ = read_jsonl(tmp_path / str(i) / "metrics.jsonl")
        assert not gpu_rows(rows) and scrape_rows(rows)


def test_without_the_extra_and_unasked_no_line(cli, tmp_path, trace, monkeypatch):
    """No pynvml and no --gpu-indices: the user did not ask for energy, so stderr stays quiet
    (a run's one-line messages are its contract) and the summary says why the figures are null."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # None: ImportError
    r = cli("run", "--trace", trace, "-o", tmp_path / "r", *QUICK)
    assert r.returncode == 0, r.stderr
    assert "GPU energy" not in r.stderr
    e = json.loads((tmp_path / "r" / "summary.json").read_text())["energy"]
    assert e["energy_j"] is None and e["note"].startswith("pynvml is not importable")


def test_window_not_covered_is_null_not_zero():
    rows = [{"kind": "gpu", "t_ns": int(t * 1e9), "gpus": [{"index": 0, "power_w": 200.0,
                                                            "energy_j": None}]}
            for t in (10.0, 11.0, 12.0)]
    ok = energy_block(rows, int(10.5e9), int(11.5e9), output_tokens=100, requests=4)
    assert ok["energy_j"] == pytest.approx(200.0) and ok["j_per_output_token"] == 2.0
    late = energy_block(rows, int(11e9), int(13e9), output_tokens=100, requests=4)
    assert late["energy_j"] is None and late["output_tokens_per_j"] is None
    assert "do not cover" in late["note"]


def test_only_a_server_on_this_machine_is_measured():
    assert server_on_this_host("http://127.0.0.1:8000") and server_on_this_host("http://[::1]:1")
    assert server_on_this_host("http://localhost:8000/v1")
    assert not server_on_this_host("http://10.20.30.40:8000")
    assert not server_on_this_host("https://api.example.com")
