"""The measurement window, whether it saw the steady state, and the server's own throughput.

A closed-loop run starts with every lane sending its first request (a cold prompt, flagged
warm-up as the lane's "prime") at about the same time; until every lane has finished it the
server is working off that start-up queue. The window's requests are measured from the end of
the warm-up (`--warmup`) to the last measured completion; the run reached its steady state when
every lane had finished its first request by the time the window began (definitions:
docs/metrics.md#measurement-window-and-steady-state).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    start_ns: int  # end of the warm-up (the latest over processes)
    end_ns: int  # last measured completion (the run's end when nothing was measured)
    steady_state: bool
    t_start_ns: int  # the run's start (lane 0's start instant)
    first_done_ns: int  # every lane had finished its first request (0: never)
    stop_ns: int = 0  # from here no new request started (the first process to stop)

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def block(self, warmup: str | float, ramp_up_s: float, lanes: int) -> dict:
        """summary.json `window`: seconds after the run's start, and the two instants on the
        records' monotonic clock (a request is warm-up iff sent before `start_ns`, or a prime)."""
        def rel(ns: int) -> float | None:
            return (ns - self.t_start_ns) / 1e9 if ns else None

        return {"steady_state": self.steady_state, "warmup": warmup, "ramp_up_s": ramp_up_s,
                "lanes": lanes, "start_s": rel(self.start_ns), "end_s": rel(self.end_ns),
                "all_lanes_first_done_s": rel(self.first_done_ns),
                "start_ns": self.start_ns, "end_ns": self.end_ns}


def measurement_window(t_starts: Sequence[int], warmup_ends: Sequence[int],
                       first_dones: Sequence[int], t_ends: Sequence[int],
                       measured_ends: Sequence[int], stops: Sequence[int] = ()) -> Window:
    """One window for the run from each process's instants (one process, or workers that
    started at a shared instant): it opens when the last process's warm-up ended, and the run
    is in steady state only if every process's lanes had all finished a first request by
    then (a process whose lanes never did reports 0)."""
    t0 = min(t_starts)
    start = max(t0, max(warmup_ends))
    end = max(measured_ends) if measured_ends else max(t_ends)
    first_done = 0 if not first_dones or 0 in first_dones else max(first_dones)
    stop = min((x for x in stops if x), default=0)
    return Window(start, end, bool(first_done) and first_done <= start, t0, first_done, stop)


def delivered(records: Sequence[dict], start_ns: int, stop_ns: int) -> dict:
    """Tokens of every request that completed between the window's start and the stop (no
    new request after it), warm-up ones included, per second of that span: the rate the
    server delivered while the window's lanes were all sending. In a steady state the
    requests running on past the stop stand for those that were running at its start, so
    unlike the measured requests' throughput it has no gap at the window's start when
    requests are long next to it. None without such a span."""
    span = (stop_ns - start_ns) / 1e9 if stop_ns and stop_ns > start_ns else 0.0
    done = [r for r in records if r["ok"] and start_ns <= r["end_ns"] <= stop_ns] if span else []
    isl = sum((r["isl"] if r["isl"] is not None else r["isl_intended"]) for r in done)
    osl = sum((r["osl"] or 0) for r in done)
    cached = sum((r.get("cached_tokens") or 0) for r in done)
    return {"delivered_total_tok_s": (isl + osl) / span if span else None,
            "delivered_output_tok_s": osl / span if span else None,
            "delivered_cached_share": cached / (isl + osl) if span and isl + osl else None,
            "delivered_requests": len(done), "delivered_window_s": span or None}


def server_throughput(server_metrics: dict | None) -> dict:
    """Tokens the server processed per second over the whole run, from its /metrics counters
    (Δ vllm:prompt_tokens + Δ vllm:generation_tokens between the first and last scrape,
    over the time between them), start-up included: next to the window's throughput it
    shows how much work the window left out. None where the server does not say."""
    sm = server_metrics or {}
    prompt, gen = sm.get("prompt_tokens"), sm.get("generation_tokens")
    span = (sm.get("window") or {}).get("duration_s")
    if prompt is None or gen is None or not span:
        return {"server_total_tok_s": None, "server_output_tok_s": None, "server_window_s": span}
    return {"server_total_tok_s": (prompt + gen) / span, "server_output_tok_s": gen / span,
            "server_window_s": span}


HEADLINE_DEFINITION = {
    "delivered": "tokens (prompt + output) of every request that completed between the "
                 "window's start and the stop, per second of that span",
    "window": "tokens (prompt + output) of the measured requests, per second of the window",
}


def headline(th: dict, gpus: int | None = None) -> dict:
    """The one throughput a report leads with: the delivered rate where the run has a window
    to deliver in, else the measured requests' rate (a run rebuilt from records, or one that
    never left its warm-up). Delivered, because the measured requests' rate leaves out the
    requests running when the window opened and so reads low by about their share (64 lanes
    on the simulated H200: 10.7k measured vs 20.6k delivered vs 19.8k by the server's own
    counters); the server's /metrics rate counts start-up too."""
    src = "delivered" if th.get("delivered_total_tok_s") is not None else "window"
    total = th["delivered_total_tok_s"] if src == "delivered" else th.get("total_tok_s")
    out = th["delivered_output_tok_s"] if src == "delivered" else th.get("output_tok_s")
    share = th.get("delivered_cached_share" if src == "delivered" else "cached_share")
    return {"total_tok_s": total, "output_tok_s": out, "cached_share": share,
            "per_gpu_tok_s": total / gpus if gpus and total is not None else None,
            "per_gpu_output_tok_s": out / gpus if gpus and out is not None else None,
            "source": src, "definition": HEADLINE_DEFINITION[src]}


def not_steady_note(window: dict) -> str | None:
    """One plain sentence for a run whose window did not see the steady state."""
    if window.get("steady_state", True):
        return None
    done = window.get("all_lanes_first_done_s")
    if window.get("warmup") == "auto" or done is None:
        return ("run ended before every lane finished its first request: it measured only "
                "start-up, no steady-state window (run longer, with fewer lanes, or against a "
                "faster server)")
    return (f"the window opened at +{window['start_s']:.1f} s, before every lane had finished "
            f"its first request (+{done:.1f} s): it includes start-up (--warmup auto starts "
            "it there)")
