"""GPU power and energy through NVIDIA's management library (NVML), when it is importable.

`nvidia-ml-py` (import name `pynvml`, the optional extra `agentx-bench[gpu]`) wraps
libnvidia-ml, the library behind nvidia-smi. A sampler thread reads each chosen GPU at the
scraper's cadence (`--scrape-interval`): at the run's start, every interval, and after the
drain. The calls, and nothing else (docs/metrics.md, "GPU power and energy"):

| call | unit | field |
|---|---|---|
| nvmlInit / nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex | | |
| nvmlDeviceGetPowerUsage(h) | mW | `power_w` |
| nvmlDeviceGetTotalEnergyConsumption(h) (Volta+; else None) | mJ since load | `energy_j` |
| nvmlDeviceGetUtilizationRates(h).gpu | % of the last period a kernel ran | `util_pct` |
| nvmlDeviceGetMemoryInfo(h).used | bytes | `mem_used_mib` |
| nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM) | MHz | `sm_clock_mhz` |

A thread, not the scraper's child process: each call is a short C call through ctypes (which
releases the GIL), so the benchmark loop does not wait on it. Each sample is one line of
metrics.jsonl, `{"kind": "gpu", ...}` beside the scrapes (whose lines have no `kind`), written
with one write(2) to a file both writers open for appending.

Energy over the measurement window: the energy counter's difference where every sample has it
(interpolated linearly at the window's edges), else the trapezoid integral of power. Without
pynvml, or when NVML does not start, one line says so and the summary's energy figures are null.
"""
from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from ..records import write_line

KIND = "gpu"  # metrics.jsonl rows of this sampler; scrape rows carry no `kind`
INSTALL = "pip install nvidia-ml-py (the extra agentx-bench[gpu])"
_said: set[str] = set()  # reasons already printed: one line per process, not per run


def say_once(reason: str) -> str:
    """One stderr line per reason and process (an A/B's or a sweep's runs repeat it)."""
    if reason not in _said:
        _said.add(reason)
        print(f"agentx: GPU energy: {reason}; the energy figures are null", file=sys.stderr)
    return reason


def server_on_this_host(url: str) -> bool:
    """NVML sees this machine's GPUs: a server elsewhere is not measured by them."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GpuSampler:
    """`GpuSampler.open(...)` (a str: why not, said once), `start()`, `stop()`, `rows`."""

    def __init__(self, nvml: Any, handles: dict[int, Any], interval_s: float,
                 out_path: str | Path | None = None) -> None:
        self.nvml, self.handles, self.interval_s = nvml, handles, interval_s
        self.rows: list[dict] = []
        self.errors = 0
        self._energy_ok = dict.fromkeys(handles, True)  # False once the counter is unsupported
        self._out = open(out_path, "ab", buffering=0) if out_path is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: int | None = None

    @classmethod
    def open(cls, interval_s: float, indices: Sequence[int] | None = None,
             out_path: str | Path | None = None) -> GpuSampler | str:
        """NVML started on the chosen GPUs (default: all), or why not (said in one line).

        Without the optional extra and without --gpu-indices nobody asked for energy: the
        reason goes to the summary's note only, not to stderr on every run of every user."""
        try:
            import pynvml  # the optional extra: agentx-bench[gpu]
        except ImportError:
            reason = f"pynvml is not importable: {INSTALL}"
            return reason if indices is None else say_once(reason)
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            chosen = list(range(count)) if indices is None else list(indices)
            missing = [i for i in chosen if not 0 <= i < count]
            if missing:
                pynvml.nvmlShutdown()
                return say_once(f"--gpu-indices: no GPU {missing[0]} (NVML sees {count})")
            handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in chosen}
        except Exception as exc:  # NVMLError: no driver, no GPU, no permission
            return say_once(f"NVML did not start ({type(exc).__name__}: {exc})")
        if not handles:
            pynvml.nvmlShutdown()
            return say_once("NVML sees no GPU")
        return cls(pynvml, handles, interval_s, out_path)

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_t = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self.sample()
            next_t = max(next_t + self.interval_s, time.monotonic())

    def stop(self) -> None:
        """The last sample (after the drain), then NVML is shut down and the file closed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down a library that failed mid-run: nothing to lose
            pass
        if self._out is not None:
            self._out.close()
            self._out = None

    def sample(self) -> dict:
        """One row: every chosen GPU read once, stamped with the records' clock."""
        t_ns = time.perf_counter_ns()
        if self._t0 is None:
            self._t0 = t_ns
        row = {"kind": KIND, "t": round((t_ns - self._t0) / 1e9, 3), "wall": time.time(),
               "t_ns": t_ns, "gpus": [self._read(i, h) for i, h in self.handles.items()]}
        self.rows.append(row)
        if self._out is not None:
            write_line(self._out, orjson.dumps(row) + b"\n")
        return row

    def _read(self, index: int, h: Any) -> dict:
        nv = self.nvml
        out: dict = {"index": index}
        for key, call in (("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3),
                          ("util_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
                          ("mem_used_mib", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
                          ("sm_clock_mhz",
                           lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))):
            try:
                out[key] = call()
            except Exception:  # one reading failed: that field is null in this row
                out[key] = None
                self.errors += 1
        out["energy_j"] = None
        if self._energy_ok[index]:
            try:
                out["energy_j"] = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3
            except Exception:  # pre-Volta: not supported; power integral instead
                self._energy_ok[index] = False
        return out


def gpu_rows(rows: Sequence[dict]) -> list[dict]:
    """The GPU sampler's rows of metrics.jsonl."""
    return [r for r in rows if r.get("kind") == KIND]


def scrape_rows(rows: Sequence[dict]) -> list[dict]:
    """The /metrics scrapes of metrics.jsonl (every row without a `kind`)."""
    return [r for r in rows if "kind" not in r]


def _at(ts: list[float], vs: list[float], t: float) -> float | None:
    """v at t, linear between the samples around it (None outside them)."""
    if not ts or t < ts[0] or t > ts[-1]:
        return None
    for i in range(1, len(ts)):
        if t <= ts[i]:
            span = ts[i] - ts[i - 1]
            f = (t - ts[i - 1]) / span if span else 1.0
            return vs[i - 1] + f * (vs[i] - vs[i - 1])
    return vs[-1]


def integral(ts: list[float], vs: list[float], a: float, b: float) -> float | None:
    """∫ v dt over [a, b] (trapezoids, v linear between samples); None when the samples do
    not cover [a, b]."""
    va, vb = _at(ts, vs, a), _at(ts, vs, b)
    if va is None or vb is None or b < a:
        return None
    pts = [(a, va)] + [(t, v) for t, v in zip(ts, vs) if a < t < b] + [(b, vb)]
    return sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:]))


def gpu_energy(rows: Sequence[dict], start_ns: int, end_ns: int) -> dict[int, tuple]:
    """{gpu index: (joules over [start_ns, end_ns] or None, method)}: the energy counter's
    difference when every sample has it and it never went back, else ∫ power dt."""
    out: dict[int, tuple] = {}
    a, b = start_ns / 1e9, end_ns / 1e9
    indices = sorted({g["index"] for r in rows for g in r["gpus"]})
    for i in indices:
        pts = [(r["t_ns"] / 1e9, g) for r in rows for g in r["gpus"] if g["index"] == i]
        ts = [t for t, _ in pts]
        energy = [g.get("energy_j") for _, g in pts]
        if energy and None not in energy and all(y >= x for x, y in zip(energy, energy[1:])):
            ea, eb = _at(ts, energy, a), _at(ts, energy, b)
            out[i] = (None if ea is None or eb is None else eb - ea, "energy counter")
            continue
        have = [(t, g["power_w"]) for t, g in pts if g.get("power_w") is not None]
        out[i] = (integral([t for t, _ in have], [p for _, p in have], a, b), "power integral")
    return out


def energy_block(rows: Sequence[dict], start_ns: int, end_ns: int, output_tokens: int,
                 requests: int, note: str | None = None) -> dict:
    """summary.json's `energy`: joules over the measurement window, per output token and per
    request, output tokens per joule. Null figures (not zero) when nothing was sampled or the
    samples do not cover the window; `note` says why."""
    per = gpu_energy(rows, start_ns, end_ns) if rows and end_ns > start_ns else {}
    joules = [j for j, _ in per.values()]
    total = sum(joules) if per and None not in joules else None
    if rows and total is None and note is None:
        note = "the GPU samples do not cover the measurement window"
    secs = (end_ns - start_ns) / 1e9
    return {
        "source": "nvml" if rows else None,
        "gpus": sorted(per),
        "samples": len(rows),
        "method": {str(i): m for i, (_, m) in per.items()},
        "per_gpu_j": {str(i): j for i, (j, _) in per.items()},
        "energy_j": total,
        "mean_power_w": total / secs if total is not None and secs > 0 else None,
        "j_per_output_token": total / output_tokens if total is not None and output_tokens
        else None,
        "j_per_request": total / requests if total is not None and requests else None,
        "output_tokens_per_j": output_tokens / total if total else None,
        "note": note,
    }
