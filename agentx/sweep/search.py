"""SLO saturation search (`agentx sweep --search ttft:MS,tpot:MS[,e2el:MS][,goodput:G]`): per
recipe point, the highest concurrency whose goodput (the share of requests meeting every SLO,
agentx.metrics.goodput, vLLM `--goodput` semantics) reaches G (default 0.9), by bisection over
the concurrency with a bounded number of cells.

Bisection assumes goodput falls as concurrency rises. It steps on a log scale (the geometric
midpoint), as concurrency lists do (1, 2, 4, ... 64), so a wide range converges in few cells.
A cell passes when it ran, its verdict is publishable (pass, or no validation) and its goodput
reaches the target; a cell whose verdict is fail or interrupted counts as not passing: a
concurrency whose result cannot be published cannot be the answer. A cell whose verdict is
`insufficient` (too few measured requests) says neither: the sweep reruns it longer
(`LENGTHEN`) before judging it, and if it is still thin the point's search stops there,
undecided, rather than read "too few samples" as "fails the SLO".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..metrics.goodput import parse_slo

DEFAULT_GOODPUT, DEFAULT_MAX_CELLS = 0.9, 6
PUBLISHABLE = ("pass", None, "")  # verdicts a search answer may have (as the Pareto frontier)
THIN = "insufficient"  # the verdict that decides nothing
LENGTHEN = (2, 4)  # a thin cell is rerun at these multiples of its duration before judging


@dataclass
class SloSearch:
    """What the search looks for: SLOs in ms, the goodput target, optional concurrency bounds
    (default: the point's concurrency list) and the cell budget per point."""
    slo: dict[str, float]
    goodput: float = DEFAULT_GOODPUT
    lo: int | None = None
    hi: int | None = None
    max_cells: int = DEFAULT_MAX_CELLS

    def record(self) -> dict:
        return {"slo_ms": self.slo, "goodput_target": self.goodput, "max_cells": self.max_cells}


def parse_search(text: str) -> tuple[dict[str, float], float]:
    """`ttft:500,tpot:50,goodput:0.95` -> ({"ttft": 500, "tpot": 50}, 0.95); ValueError says
    what is wrong."""
    parts, target = [], DEFAULT_GOODPUT
    for part in (p.strip() for p in text.split(",")):
        key, _, value = part.partition(":")
        if key.strip().lower() != "goodput":
            parts.append(part)
            continue
        try:
            target = float(value)
        except ValueError:
            raise ValueError(f"goodput: {value.strip()!r} is not a fraction (e.g. 0.9)") from None
        if not 0.0 < target <= 1.0:
            raise ValueError(f"goodput: {target:g} is not a fraction in (0, 1]")
    return parse_slo(",".join(parts)), target


@dataclass
class Probe:
    """One cell the search ran (or found finished): its goodput and whether it passed."""
    conc: int
    goodput: float | None
    verdict: str | None
    passed: bool
    why: str
    lengthened_s: list[float] = field(default_factory=list)  # reruns of a thin cell

    @property
    def decided(self) -> bool:
        """Passed or failed on evidence: not a cell too thin to say."""
        return self.verdict != THIN

    def record(self) -> dict:
        return {"conc": self.conc, "goodput": self.goodput, "verdict": self.verdict,
                "passed": self.passed, "decided": self.decided, "why": self.why,
                "lengthened_s": self.lengthened_s}


def judge(conc: int, status: str, verdict: str | None, goodput: float | None, target: float,
          error: str | None = None) -> Probe:
    """Whether one cell passes the search, and why (one phrase for sweep.json and the console)."""
    if status == "failed":
        return Probe(conc, goodput, verdict, False, f"failed: {(error or '').splitlines()[0][:80]}")
    if verdict == THIN:
        return Probe(conc, goodput, verdict, False, "verdict insufficient: too few measured "
                     "requests to judge, even lengthened (raise --duration)")
    if verdict not in PUBLISHABLE:
        return Probe(conc, goodput, verdict, False,
                     f"verdict {verdict}: not publishable, cannot be the answer")
    if goodput is None:
        return Probe(conc, goodput, verdict, False, "no goodput (no request measured)")
    ok = goodput >= target
    return Probe(conc, goodput, verdict, ok,
                 f"goodput {goodput:.3f} {'>=' if ok else '<'} {target:g}")


@dataclass
class Outcome:
    """One point's answer: the highest passing concurrency, the lowest failing one (None when
    not found), whether the bracket closed (they are adjacent integers, or an end was reached)."""
    lo: int
    hi: int
    answer: int | None = None
    failing: int | None = None
    probes: list[Probe] = field(default_factory=list)
    converged: bool = False
    undecided: int | None = None  # the concurrency whose cell stayed too thin to judge

    def record(self) -> dict:
        return {"bounds": [self.lo, self.hi], "answer": self.answer,
                "lowest_failing": self.failing, "converged": self.converged,
                "undecided": self.undecided, "cells": [p.record() for p in self.probes]}

    def text(self) -> str:
        tried = ", ".join(f"c{p.conc} {'-' if p.goodput is None else f'{p.goodput:.2f}'}"
                          f"{'' if p.passed else ' x'}"
                          f"{'' if p.verdict in PUBLISHABLE else f' ({p.verdict})'}"
                          + (f" (lengthened to {p.lengthened_s[-1]:g} s)" if p.lengthened_s
                             else "") for p in self.probes)
        if self.undecided is not None:
            thin = next(p for p in self.probes if p.conc == self.undecided)
            so_far = (f"c{self.answer} passes so far" if self.answer is not None
                      else "no answer")
            return (f"undecided: c{self.undecided} {thin.why}; {so_far}; cells: {tried}")
        if self.answer is None:
            why = self.probes[0].why if self.probes else "no cell ran"
            head = f"no concurrency in [{self.lo}, {self.hi}] meets it (c{self.failing}: {why})"
        elif self.failing is None:
            head = f"c{self.answer} (the upper bound {self.hi} passes: raise --search-max)"
        else:
            head = f"c{self.answer} (c{self.failing} fails)"
        left = "" if self.converged else "; not converged within the cell budget"
        return f"{head}{left}; cells: {tried}"


def midpoint(lo: int, hi: int) -> int:
    """The geometric midpoint strictly between lo and hi (hi - lo >= 2)."""
    return min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))


class _Undecided(Exception):
    """A probed cell stayed too thin to judge: the bisection cannot go on from it."""


def bisect(lo: int, hi: int, probe: Callable[[int], Probe], max_cells: int) -> Outcome:
    """Run `probe` at lo, then hi, then midpoints until the passing and failing concurrencies
    are adjacent or `max_cells` cells ran; a cell too thin to judge (`Probe.decided` false)
    stops it there, `undecided`, with the bracket found so far."""
    out = Outcome(lo, hi)

    def run(c: int) -> bool:
        p = probe(c)
        out.probes.append(p)
        if not p.decided:
            out.undecided = c
            raise _Undecided
        return p.passed

    if max_cells < 1:
        return out
    try:
        if not run(lo):
            out.failing, out.converged = lo, True
            return out
        out.answer = lo
        if hi == lo or len(out.probes) >= max_cells:
            out.converged = hi == lo
            return out
        if run(hi):
            out.answer, out.converged = hi, True
            return out
        out.failing = hi
        while out.failing - out.answer > 1 and len(out.probes) < max_cells:
            mid = midpoint(out.answer, out.failing)
            if run(mid):
                out.answer = mid
            else:
                out.failing = mid
    except _Undecided:
        return out
    out.converged = out.failing - out.answer <= 1
    return out
