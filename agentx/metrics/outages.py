"""Server outages seen by the client, each one event with its duration, from the records.

A restart of the server fails every request a lane sends while it is down, as `connect`
(the lanes back off meanwhile: engine/backoff.py). Counted one by one those failures read as
a failed run; what happened is one outage, from the first failure to the first request the
server answered after it. An outage still going when the run stopped lasts to its last
failure, `until_stop: true`.
"""
from __future__ import annotations

CONNECT = "connect"


def outages(records: list[dict]) -> list[dict]:
    """[{start_s, duration_s, connect_failures, until_stop}], start_s from the first request's
    start, in time order; [] when every request could connect."""
    rows = sorted((r for r in records if r.get("start_ns")), key=lambda r: r["start_ns"])
    if not rows:
        return []
    t0 = rows[0]["start_ns"]
    out: list[dict] = []
    start = last = n = 0
    for r in rows:
        if r.get("error") == CONNECT:
            if not n:
                start = r["start_ns"]
            n += 1
            last = max(last, r.get("end_ns") or r["start_ns"])
        elif n and r.get("status"):  # the server answered: it is back
            out.append(_event(t0, start, r["start_ns"], n, False))
            n = 0
    if n:
        out.append(_event(t0, start, last, n, True))
    return out


def _event(t0: int, start: int, end: int, n: int, until_stop: bool) -> dict:
    return {"start_s": round((start - t0) / 1e9, 3), "duration_s": round((end - start) / 1e9, 3),
            "connect_failures": n, "until_stop": until_stop}


def describe(events: list[dict]) -> str:
    """One line for the console: `server unreachable twice: 3.1 s at +5.2 s (14 connect
    failures), ...`."""
    times = {1: "once", 2: "twice"}.get(len(events), f"{len(events)} times")
    parts = [f"{e['duration_s']:.1f} s at +{e['start_s']:.1f} s ({e['connect_failures']} "
             f"connect failure{'s' if e['connect_failures'] != 1 else ''}"
             f"{', still down at the stop' if e['until_stop'] else ''})" for e in events[:5]]
    return f"server unreachable {times}: " + ", ".join(parts) + (", ..." if len(events) > 5
                                                                  else "")
