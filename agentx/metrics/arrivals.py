"""Open-loop arrivals in the summary: offered vs achieved session and request rates, and the
waits at the --max-active cap (definitions: docs/metrics.md#open-loop-arrivals).

All rates are over the arrival span, from the run's start to the stop (no new session or
request after it), warm-up included: arrivals do not depend on the measurement window.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..distribution import dist


def arrival_summary(mode: str, rate: float | None, burstiness: float, max_active: int | None,
                    time_scale: float, sessions: Sequence[Sequence], records: Sequence[dict],
                    t_start_ns: int, stop_ns: int) -> dict:
    """summary.json `arrivals` from each arrived session's (scheduled offset s, arrival ns,
    admission ns or 0, planned requests, cap wait ns) and the records.

    offered: sessions that arrived per second, and the requests they bring (each session's
    turns from its first sent to its end, subagents' included) per second; achieved: sessions
    admitted (started) per second, and requests completed per second. A session's requests
    spread over its think times, so the request rates meet only in runs much longer than a
    session. cap_wait_s: per session that found the cap full, how long it waited for a place;
    one never admitted counts from its arrival to the stop."""
    span = (stop_ns - t_start_ns) / 1e9 if stop_ns > t_start_ns else 0.0
    admitted = [s for s in sessions if s[2]]
    waits = [s[4] if s[2] else max(0, stop_ns - s[1]) for s in sessions if s[4] or not s[2]]
    done = sum(1 for r in records if r["ok"] and t_start_ns <= r["end_ns"] <= stop_ns)

    def per_s(n: float) -> float | None:
        return n / span if span else None

    w = dist([x / 1e9 for x in waits])
    return {
        "mode": mode, "session_rate": rate, "burstiness": burstiness if mode == "poisson" else None,
        "max_active": max_active, "time_scale": time_scale if mode == "trace" else None,
        "span_s": span or None,
        "sessions_arrived": len(sessions), "sessions_started": len(admitted),
        "sessions_never_started": len(sessions) - len(admitted),
        "offered_session_rate": per_s(len(sessions)),
        "achieved_session_rate": per_s(len(admitted)),
        "offered_request_rate": per_s(sum(s[3] for s in sessions)),
        "achieved_request_rate": per_s(done),
        "cap_wait_s": {"count": len(waits), "p50": w.get("p50"), "p99": w.get("p99"),
                       "max": w.get("max")},
        "schedule_s": [round(s[0], 3) for s in sessions],
    }


def arrivals_line(a: dict) -> str:
    """One console line: offered vs achieved, and the cap's waits."""
    def f(v: float | None, nd: int = 3) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    how = (f"poisson {a['session_rate']:g}/s, burstiness {a['burstiness']:g}"
           if a["mode"] == "poisson" else f"trace times x {a['time_scale']:g}")
    cap = f", cap {a['max_active']}" if a["max_active"] else ""
    w = a["cap_wait_s"]
    waits = (f"{w['count']} session(s) waited for the cap: p50 {f(w['p50'], 1)} s, p99 "
             f"{f(w['p99'], 1)} s, max {f(w['max'], 1)} s" if w["count"]
             else "no session waited for the cap")
    return (f"arrivals ({how}{cap}): sessions offered {f(a['offered_session_rate'])}/s, "
            f"achieved {f(a['achieved_session_rate'])}/s ({a['sessions_arrived']} arrived, "
            f"{a['sessions_started']} started); requests offered "
            f"{f(a['offered_request_rate'])}/s, achieved {f(a['achieved_request_rate'])}/s "
            f"over {f(a['span_s'], 1)} s; {waits}")
