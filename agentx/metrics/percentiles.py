"""`--percentiles 50,90,95,99,99.9`: which percentiles a run's distributions show and write.

One option (`PercentilesOption.percentiles`), inherited by `run`, `ab` (through RunConfig),
`sweep` and `report`. Unset, every view keeps its catalog default (the console's p50/p90/p99,
runs.csv's and `agentx ab`'s per-metric tuples in `catalog.py`). Set, it replaces them all, and
summary.json's distributions carry the extra keys beside the fixed ones (`dist.KEYS`).

Key names: `p` + the percentile with its decimal point as `_` and no trailing zeros: 50 ->
`p50`, 99.9 -> `p99_9`, 99.99 -> `p99_99` (a `.` in a key would break dotted paths such as
`jq .ttft_ms.p99.9`, and keeps runs.csv's column names identifiers: `ttft_p99_9_ms`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated

from pydantic import BeforeValidator

from ..options import StrictModel, opt

DEFAULT_SHOWN = (50.0, 90.0, 99.0)  # the console table's columns when --percentiles is unset


def pct_key(q: float) -> str:
    """summary.json's key of the q-th percentile: `p50`, `p99_9`."""
    return "p" + pct_name(q)


def pct_name(q: float) -> str:
    """`50`, `99_9`: the percentile as it appears inside a key or column name."""
    text = f"{float(q):.6f}".rstrip("0").rstrip(".")
    return text.replace(".", "_")


def parse_percentiles(v: object) -> list[float] | None:
    """`"50,90,99.9"` or a list of numbers -> sorted, deduplicated floats in (0, 100]; a
    ValueError (one line, naming the bad entry) otherwise."""
    if v is None:
        return None
    items: Iterable = [x for x in v.split(",") if x.strip()] if isinstance(v, str) else v
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ValueError("expected a list of percentiles, e.g. 50,90,99.9")
    out = set()
    for x in items:
        try:
            q = float(x.strip() if isinstance(x, str) else x)
        except (TypeError, ValueError):
            raise ValueError(f"not a number: {x!r} (expected e.g. 50,90,99.9)") from None
        if not 0 < q <= 100:
            raise ValueError(f"{x!r} is outside (0, 100]")
        out.add(q)
    if not out:
        raise ValueError("no percentile given (expected e.g. 50,90,99.9)")
    return sorted(out)


Percentiles = Annotated[list[float] | None, BeforeValidator(parse_percentiles)]


class PercentilesOption(StrictModel):
    """The option, declared once; a command's model inherits it."""

    percentiles: Percentiles = opt(
        None, "percentiles every distribution shows and writes (console, summary.json, "
        "runs.csv, ab.json), e.g. 50,90,95,99,99.9: each in (0, 100]; keys p50, p99_9 "
        "(docs/metrics.md). Default: the console's p50/p90/p99 and the catalog's columns",
        metavar="P,Q,...")


def shown(summary: Mapping, default: Sequence[float] = DEFAULT_SHOWN) -> tuple[float, ...]:
    """The percentiles a summary's views show: the run's (or report's) --percentiles, else
    `default`."""
    return tuple(summary.get("percentiles") or default)
