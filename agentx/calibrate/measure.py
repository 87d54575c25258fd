"""One calibration cell: N requests at concurrency 1 against one server in one thinking mode,
then AL = 1 + Δaccepted / Δdrafts from its /metrics, per-position acceptance and the 95%
interval. The trace's synthesized coding turns go through `agentx.run.run` itself (conc 1,
--max-requests N, no think time); a prompts file goes through prompts.py."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import RunConfig
from ..options import build
from ..records import read_records
from ..rundir import RunDir
from .config import CalibrateConfig
from .interval import Interval, bootstrap, request_counts


@dataclass
class Measurement:
    k: int
    thinking: str
    al: float | None = None
    per_position: list[float] | None = None
    drafts: float | None = None
    accepted: float | None = None
    interval: Interval | None = None
    completed: int = 0
    failed: int = 0
    run_dir: str = ""
    error: str | None = None

    def record(self) -> dict:
        return asdict(self)


@dataclass
class Workload:
    """What every cell sends: the trace (or prompts file) and the sampling settings."""

    trace: str
    context_scale: float
    prompts: str | None
    requests: int
    extra_body: dict
    seed: int

    def describe(self) -> str:
        if self.prompts:
            return f"prompts {Path(self.prompts).name}"
        return f"trace {self.trace} (synthesized coding turns, context_scale {self.context_scale:g})"


def measure(w: Workload, cfg: CalibrateConfig, url: str, model: str | None, k: int,
            thinking: str, out: Path) -> Measurement:
    m = Measurement(k, thinking, run_dir=str(out))
    if w.prompts:
        from .prompts import send_prompts

        spec, records = send_prompts(w, url, model, thinking, out)
    else:
        from ..run import run

        rc = build(RunConfig, {
            "base_url": url, "model": model, "trace": w.trace, "context_scale": w.context_scale,
            "conc": 1, "max_requests": w.requests, "duration_s": 0, "think_scale": 0.0,
            "thinking": thinking, "seed": w.seed, "extra_body": w.extra_body,
            "output_dir": str(out), "overwrite": True, "progress": False,
            "validation": "off"}, source="calibrate")
        summary = run(rc)
        spec = (summary.get("server_metrics") or {}).get("spec_decode") or {}
        records = read_records(out / RunDir.REQUESTS)
    m.completed = sum(1 for r in records if r.get("ok"))
    m.failed = len(records) - m.completed
    m.al, m.per_position = spec.get("acceptance_length"), spec.get("per_position")
    m.drafts, m.accepted = spec.get("num_drafts"), spec.get("num_accepted_tokens")
    if m.al is None:
        m.error = ("the server exposes no spec-decode counters (is speculative decoding on?)"
                   if m.drafts is None else "no speculative drafts during the requests")
        return m
    pairs, source = request_counts(records)
    m.interval = bootstrap(m.al, pairs, k, source, cfg.bootstrap, seed=cfg.seed)
    if m.interval is None:
        m.error = f"fewer than two requests with drafts ({len(pairs)}): no interval"
    return m
