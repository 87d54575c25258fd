"""Real vLLM 0.24 engine steps on one H200 (tests/data/h200-runs-5/steps/ and h200-runs-7/steps/,
one gzipped JSON line per engine call, written inside the server by bench/stepprobe/sitecustomize.py):
the call's time `dt` (s) and the batch it scheduled (`tokens`, `reqs`, `decode` requests, `ctx`:
the context they had computed, ...; h200-runs-5/README.md; h200-runs-7 adds the prefill chunks
apart: `pre_reqs`, `pre_tokens`, `pre_ctx`, `pre_attn`). Read by bench/connector_steps.py (what a
connector adds to a step), sim_calibration.fit (the KV-read and prefill efficiencies, the
admissions' host cost) and bench/frontend_events.py (the admissions into an idle engine)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

STEPS = Path("h200-runs-5") / "steps"  # under the data folder (realruns.DATA)


def load_steps(data: Path, name: str, folder: Path = STEPS) -> list[dict]:
    """Run `name`'s engine calls, in order (zero fields are left out of the files)."""
    with gzip.open(data / folder / f"{name}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def paired(steps: list[dict], shift: int = 1) -> tuple[list[dict], list[float]]:
    """Each batch with the time (ms) of the call `shift` later. vLLM 0.24 runs a batch queue of 2
    (asynchronous scheduling): engine call i+1 is spent finishing the batch call i scheduled, so
    shift 1 pairs a batch with its own compute (the better fit: bench/connector_steps.py)."""
    batches = steps[:len(steps) - shift] if shift else steps
    return batches, [s["dt"] * 1e3 for s in steps[shift:]]


def decode_only(s: dict) -> bool:
    """A batch of decodes alone: every request in it decodes one token, no prefill chunk."""
    return bool(s.get("reqs")) and s.get("tokens") == s["reqs"] == s.get("decode")


def admitting_after_decode(steps: list[dict]) -> list[tuple[int, int]]:
    """(i, n) for each decode-only batch i whose next batch admits a new request (the probe's
    `new`), n that batch's prefill tokens. Where the batch in flight is a decode step, the next
    batch's host preparation shows in call i+1 (batch i's time under `paired`):
    sim_calibration.fit prices it on these steps (`fit_admit_host`), bench/connector_steps.py
    leaves what that prices out of a connector's stalls."""
    return [(i, nxt.get("tokens", 0) - nxt.get("decode", 0))
            for i, (s, nxt) in enumerate(zip(steps, steps[1:])) if decode_only(s) and nxt.get("new")]


def before_admissions(steps: list[dict]) -> list[tuple[int, float]]:
    """(n, ms) for each decode-only batch whose next batch admits a new request: n that batch's
    prefill tokens, ms the batch's time (`paired`), which shows the next batch's host preparation
    where that outlasts the decode step (sim_calibration.fit `fit_admit_host`)."""
    ms = paired(steps)[1]
    return [(n, ms[i]) for i, n in admitting_after_decode(steps)]


def idle_admissions(steps: list[dict], max_tokens: int = 1000) -> list[float]:
    """The time (ms) of each engine call that admitted one request of under `max_tokens` new
    tokens after the engine had idled (> 2 ms since the last call ended): with no step in flight
    to hide it behind, the call is the host's preparation of the batch and its launch."""
    out = []
    for prev, s in zip(steps, steps[1:]):
        if s.get("new") == 1 and s["t"] - (prev["t"] + prev["dt"]) > 0.002 \
                and s.get("tokens", 0) - s.get("decode", 0) < max_tokens:
            out.append(s["dt"] * 1e3)
    return out
