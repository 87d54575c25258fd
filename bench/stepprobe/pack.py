#!/usr/bin/env python3
"""Pack what bench/stepprobe wrote during one run (AGENTX_STEPLOG/steps-<pid>.jsonl) into the
files tests/data ships: NAME.jsonl.gz, one line per engine step in order, and, when the probe
logged events, NAME-events.jsonl.gz, one line per event.

Step lines: `t` (s from the first step), `dt`, the batch and scheduler state the probe recorded
(zero fields and empty lists left out), `conn_sched` (s in the connector's scheduler-side hooks,
summed). Event lines: `t` on the same clock, `ev` and its fields. sim_calibration/steps.py reads
both.

Run: python bench/stepprobe/pack.py STEPLOG_DIR OUT_DIR NAME
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

_DROP = ("t0", "fn", "conn", "hooks")


def pack(folder: Path, out: Path, name: str) -> tuple[int, int]:
    rows = [json.loads(line) for f in sorted(folder.glob("steps-*.jsonl")) for line in f.open()]
    rows.sort(key=lambda r: r["t0"])
    steps = [r for r in rows if "reqs" in r and "dt" in r]
    events = [r for r in rows if "ev" in r]
    if not steps:
        raise SystemExit(f"{folder}: no engine steps in the probe's files")
    t0 = steps[0]["t0"]

    def step(r: dict) -> dict:
        row = {"t": round(r["t0"] - t0, 4), "dt": r["dt"]}
        row.update({k: v for k, v in r.items() if k not in _DROP and k != "dt" and v})
        hooks = sum((r.get("hooks") or {}).values())
        if hooks:
            row["conn_sched"] = round(hooks, 6)
        return row

    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / f"{name}.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(step(r)) + "\n" for r in steps))
    if events:
        with gzip.open(out / f"{name}-events.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps({"t": round(e["t0"] - t0, 4),
                                        **{k: v for k, v in e.items() if k != "t0"}}) + "\n"
                            for e in events))
    return len(steps), len(events)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    n, e = pack(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print(f"{sys.argv[3]}: {n} steps, {e} events")
