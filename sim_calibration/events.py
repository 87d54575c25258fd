"""A probed run's client records and vLLM's engine events on one clock: what the API server and the
engine core do around each request, measured instead of fitted (bench/frontend_events.py prints it).

bench/stepprobe writes, inside a vLLM 0.24 server, one row per engine call (`t`, `dt`, the batch,
`new_ids`: the requests it scheduled for the first time) and, with events, the engine core's `add`
(it received a request from the API server) and `free` (it processed the request's last output),
in seconds from its first call. agentx's records hold each request's send, token and end times on
the client's monotonic clock. The two clocks differ by a constant: a request's last token reaches
the client a little after its `free`, never before, so the smallest (client end - free) of a run is
that constant plus the shortest output path (~1 ms). Times here are on the engine's clock with that
floor, so the output path's minimum is counted in the front end (send -> add), where the simulator,
which hands tokens over at the end of its step, needs it too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentx.rundir import read_jsonl

from .steps import load_steps

_AT_END_S = 5e-4  # an `add` this close to the end of an engine call waited for that call


@dataclass
class Probed:
    name: str
    device: str  # the GPU, from the data folder's name (h100-runs*, h200-runs*)
    lanes: int
    records: list[dict]  # the run's ok records
    events: list[dict]
    steps: list[dict]

    def call_ends(self) -> np.ndarray:
        """When each engine call ended (s, the engine's clock)."""
        return np.array([s["t"] + s["dt"] for s in self.steps])


def probed_runs(data: Path) -> list[Probed]:
    """Every run under `data` with engine events (h*-runs*/steps/NAME-events.jsonl.gz) and its
    records beside them (h*-runs*/NAME-requests.jsonl), in name order."""
    out = []
    for f in sorted(data.glob("h*-runs*/steps/*-events.jsonl.gz")):
        name = f.name.removesuffix("-events.jsonl.gz")
        req, summ = f.parent.parent / f"{name}-requests.jsonl", f.parent.parent / f"{name}-summary.json"
        if not req.exists() or not summ.exists():
            continue
        recs = [r for r in read_jsonl(req, strict=True)[0] if r.get("ok")]
        lanes = json.loads(summ.read_bytes())["config"]["conc"]
        device = "H100" if f.parent.parent.name.startswith("h100") else "H200"
        out.append(Probed(name, device, lanes, recs, load_steps(f.parent, f"{name}-events", Path()),
                          load_steps(f.parent, name, Path())))
    return out


def run_events(data: Path, name: str) -> list[dict] | None:
    """The engine events of run `name` (h*-runs*/steps/NAME-events.jsonl.gz under `data`); None
    for a run probed without them, or not probed."""
    for f in sorted(data.glob(f"h*-runs*/steps/{name}-events.jsonl.gz")):
        return load_steps(f.parent, f"{name}-events", Path())
    return None


def request_key(engine_id: str) -> str:
    """The client's request id inside vLLM's: cmpl-<run>-<lane>-<n>-<i>-<suffix> -> <run>-<lane>-<n>."""
    return "-".join(engine_id.split("-")[1:4])


def clock_offset(run: Probed) -> tuple[float, np.ndarray]:
    """(client clock - engine clock, s) and each request's (client end - free) above that floor (ms):
    the spread says how well the clocks line up (a constant output path would give all zeros)."""
    free = {request_key(e["req"]): e["t"] for e in run.events if e["ev"] == "free"}
    d = np.array([r["end_ns"] / 1e9 - free[r["request_id"]] for r in run.records if r["request_id"] in free])
    off = float(d.min())
    return off, (d - off) * 1e3


@dataclass
class Arrival:
    isl: int
    gap_ms: float  # client send -> the engine core's add, on one clock
    at_step_end: bool  # the add waited for the end of the engine call that was running
    warmup: bool


def arrivals(run: Probed, offset: float) -> list[Arrival]:
    """Each request's way from the client to the engine core (its first add)."""
    add: dict[str, float] = {}
    for e in run.events:
        if e["ev"] == "add":
            add.setdefault(request_key(e["req"]), e["t"])
    ends = run.call_ends()
    out = []
    for r in run.records:
        t = add.get(r["request_id"])
        if t is None:
            continue
        j = int(np.searchsorted(ends, t))
        at_end = any(abs(ends[i] - t) < _AT_END_S for i in (j - 1, j) if 0 <= i < len(ends))
        out.append(Arrival(r["isl"], (t + offset - r["start_ns"] / 1e9) * 1e3, at_end, bool(r.get("warmup"))))
    return out


def fit_frontend(arrs: list[Arrival]) -> tuple[float, float, float, int]:
    """(a ms, b us per prompt token, rms ms, n): least squares of send -> add on the prompt length
    over the measured requests whose add met an idle engine core (not at a step end): the API
    server's own work, with no wait for an engine call in it."""
    use = [a for a in arrs if not a.at_step_end and not a.warmup]
    if len(use) < 3:
        return float("nan"), float("nan"), float("nan"), len(use)
    x = np.c_[np.ones(len(use)), [a.isl / 1e3 for a in use]]
    y = np.array([a.gap_ms for a in use])
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b), float(np.sqrt(np.mean((x @ [a, b] - y) ** 2))), len(use)


def first_token_lags(run: Probed, offset: float) -> tuple[list[float], list[float]]:
    """(first, second): for each measured request whose whole uncached prompt ran in the call that
    admitted it (call i), how long after the end of call i+1 (which returns batch i's output) its
    first token reached the client, and how long after the end of call i+2 its second one did (ms).
    The difference is what the API server adds to a stream's first output."""
    first_call: dict[str, int] = {}
    for i, s in enumerate(run.steps):
        for q in s.get("new_ids", ()):
            first_call.setdefault(request_key(q), i)
    ends = run.call_ends()
    first, second = [], []
    for r in run.records:
        i = first_call.get(r["request_id"])
        if i is None or r.get("warmup") or i + 2 >= len(ends) or len(r["chunk_offsets_ns"]) < 2:
            continue
        s = run.steps[i]
        if s.get("new") != 1 or r["isl"] - (r.get("cached_tokens") or 0) > s.get("tokens", 0) - s.get("decode", 0):
            continue
        start = r["start_ns"] / 1e9 - offset
        first.append((start + r["chunk_offsets_ns"][0] / 1e9 - ends[i + 1]) * 1e3)
        second.append((start + r["chunk_offsets_ns"][1] / 1e9 - ends[i + 2]) * 1e3)
    return first, second


def burst_need(run: Probed, a_ms: float, b_us: float) -> float | None:
    """How many front-end servers doing a_ms + b_us x prompt of work each request it would take to
    hand the engine core its cold burst (the first request of every lane, sent at once) as fast as
    it received them: that work for all but the first, over the span from the first add to the last
    (None if the run has fewer adds than lanes)."""
    adds = [e for e in run.events if e["ev"] == "add"][:run.lanes]
    if len(adds) < run.lanes or run.lanes < 2:
        return None
    span = adds[-1]["t"] - adds[0]["t"]
    work = sum(a_ms / 1e3 + b_us / 1e6 * e["prompt"] for e in adds[1:])
    return work / max(span, 1e-9)


def burst(run: Probed) -> tuple[list[dict], list[str]]:
    """The run's cold burst (the first request of every lane, sent at once): its records in send
    order, and their ids in the order the engine core received them (its `add`s); ([], []) if
    the run has fewer adds than lanes."""
    adds = [request_key(e["req"]) for e in run.events if e["ev"] == "add"][:run.lanes]
    by_id = {r["request_id"]: r for r in run.records}
    if len(adds) < run.lanes or not all(a in by_id for a in adds):
        return [], []
    return sorted((by_id[a] for a in adds), key=lambda r: r["start_ns"]), adds


def frontend_order(fe, sent: list[dict]) -> list[str]:
    """The order in which the front end `fe` (sim/frontend.py, fresh) hands `sent` (records in
    send order) to the engine."""
    t0, out = sent[0]["start_ns"], []
    for r in sent:
        out += fe.add((r["start_ns"] - t0) / 1e9, r["request_id"], fe.work(r["isl"]), fe.reads(r["isl"]))
    while fe.jobs or fe.held:
        out += fe.advance(fe.next_finish() or fe.now)
    return [rid for _, rid in out]


def displacement(order: list[str], real: list[str]) -> int:
    """Summed distance of each request from its real place."""
    pos = {rid: i for i, rid in enumerate(real)}
    return sum(abs(i - pos[rid]) for i, rid in enumerate(order))
