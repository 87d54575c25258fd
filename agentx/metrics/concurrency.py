"""Achieved request concurrency: how many requests were in flight, next to the session lanes.

A session lane replays one agent session at a time and sends its next request only after the
previous answer and the trace's think time, so `--conc 8` is not 8 requests in flight (the
simulated H200 at 8 lanes averages about 1.5). Peers' `concurrency` means requests in flight,
so every report shows both (definitions: docs/metrics.md#achieved-request-concurrency).
"""
from __future__ import annotations

from collections.abc import Sequence

LANE = ("a session lane replays one agent session at a time: its next request goes out after "
        "the previous answer and the think time, so lanes are not requests in flight")


def in_flight(records: Sequence[dict], start_ns: int, end_ns: int) -> dict:
    """Requests in flight between `start_ns` and `end_ns` by the records' own send and end
    instants (warm-up ones too: they occupy the server alike), weighted by time: the mean,
    the p90 (the count that was exceeded only 10% of the time) and the max. None without a
    span."""
    if not end_ns > start_ns:
        return {"mean": None, "p90": None, "max": None}
    ev: list[tuple[int, int]] = []
    for r in records:
        a, b = max(r.get("start_ns") or 0, start_ns), min(r.get("end_ns") or 0, end_ns)
        if r.get("start_ns") and b > a:
            ev += [(a, 1), (b, -1)]
    ev.sort()
    held: dict[int, int] = {}  # in-flight count -> ns spent at it
    cur, t = 0, start_ns
    for at, d in ev:
        held[cur] = held.get(cur, 0) + at - t
        cur, t = cur + d, at
    held[cur] = held.get(cur, 0) + end_ns - t
    span = end_ns - start_ns
    acc, p90 = 0, 0
    for n in sorted(held):
        acc += held[n]
        if acc >= 0.9 * span:
            p90 = n
            break
    return {"mean": sum(n * ns for n, ns in held.items()) / span, "p90": p90,
            "max": max((n for n, ns in held.items() if ns > 0), default=0)}


def concurrency_block(lanes: int | None, open_loop: bool, records: Sequence[dict],
                      start_ns: int, end_ns: int, server_metrics: dict | None) -> dict:
    """summary.json `concurrency`: the lanes (None in open loop), the client's requests in
    flight over the measurement window, and the server's mean running and waiting requests
    (its vllm:num_requests_running and _waiting gauges over the whole run, where scraped):
    in flight = running + waiting + what is on the wire."""
    inf = in_flight(records, start_ns, end_ns)
    sm = server_metrics or {}
    return {"lanes": None if open_loop else lanes, "in_flight_mean": inf["mean"],
            "in_flight_p90": inf["p90"], "in_flight_max": inf["max"],
            "server_running_mean": (sm.get("running") or {}).get("mean"),
            "server_waiting_mean": (sm.get("waiting") or {}).get("mean")}


def concurrency_line(c: dict, load: str) -> str:
    """One console line: the load as configured, then what it achieved."""
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    srv = ("" if c.get("server_running_mean") is None
           else f"; server running mean {f(c['server_running_mean'])}, waiting mean "
           f"{f(c.get('server_waiting_mean'))} (its /metrics, whole run)")
    return (f"concurrency: {load}; requests in flight mean {f(c.get('in_flight_mean'))}, p90 "
            f"{c.get('in_flight_p90') if c.get('in_flight_p90') is not None else '-'} "
            f"(client, window){srv}")
