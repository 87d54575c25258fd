"""Is the load generator itself distorting what it measured? (the rule: docs/reliability.md)

A late event-loop wake-up delays every timestamp taken meanwhile, so the loop lag
(`client.loop_lag_ms`, agentx/engine/self_measure.py) is judged by its effect on the shortest
interval a run reports, the chunk ITL p50, and by its cause:

- the typical lag, its p75 (a quarter of the loop's wake-ups were later), above max(2 ms, 10%
  of the chunk ITL p50) moves the medians. That fails the run (`client-bound`) when the client
  caused it (its process used >= half a core: its own work delays its timestamps) or when the
  lag is large against the TTFT p50 too (> 10%); otherwise other processes on a shared machine
  caused it (the run-queue wait says how much) and it is a warning. Why p75 (figures in
  docs/reliability.md): when something holds the interpreter in slices (another thread, a C
  extension) the probe wakes on time whenever the loop holds it, so the p50 can stay under
  2 ms while reported TTFTs are 6-11 ms off at the median; the mean catches that but also a
  single long stall in an otherwise healthy run;
- a large p99 alone (> max(5 ms, 10% of the chunk ITL p50)) touches only the tails: a warning.

An explicit `--loop-lag-threshold MS` keeps the strict rule: fail when the p99 exceeds MS.
"""
from __future__ import annotations

BUSY_CPU = 0.5  # the client process used at least half a core over the run
TYPICAL_FLOOR_MS, P99_FLOOR_MS, SHARE = 2.0, 5.0, 0.10


def client_bound(client: dict, itl_p50: float | None, ttft_p50: float | None,
                 threshold_ms: float | None = None) -> tuple[list[str], list[str]]:
    """(failures, warnings) from the summary's `client` block and the measured medians."""
    lag = client.get("loop_lag_ms") or {}
    typical, p99 = lag.get("p75"), lag.get("p99")
    if typical is None or p99 is None:
        return [], []
    wait = client.get("runqueue_wait_ms_per_s") or 0.0
    cpu = client.get("cpu_util") or 0.0
    others = (f"; the loop waited {wait:.0f} ms/s for its core: other processes share the "
              "client's cores" if wait >= 5 else "")
    hint = f" (use --workers or fewer lanes{others})"
    if threshold_ms is not None:
        if p99 > threshold_ms:
            return [f"client-bound: event-loop lag p99 {p99:.2f} ms > {threshold_ms:.2f} ms; "
                    f"timings include client delay{hint}"], []
        return [], []
    itl = itl_p50 or 0.0
    typical_at, p99_at = max(TYPICAL_FLOOR_MS, SHARE * itl), max(P99_FLOOR_MS, SHARE * itl)
    if typical > typical_at:
        what = (f"event-loop lag p75 {typical:.2f} ms > {typical_at:.2f} ms (10% of the chunk "
                f"ITL p50, at least {TYPICAL_FLOOR_MS:g} ms)")
        if cpu >= BUSY_CPU or (ttft_p50 and typical > SHARE * ttft_p50):
            return [f"client-bound: {what}; typical timings include client delay{hint}"], []
        return [], [f"machine load: {what} while the client used {cpu:.0%} of a core; typical "
                    f"timings include delay from other processes{others}"]
    if p99 > p99_at:
        return [], [f"client load: event-loop lag p99 {p99:.2f} ms > {p99_at:.2f} ms; the "
                    f"slowest 1% of timestamps may include client delay{hint}"]
    return [], []
