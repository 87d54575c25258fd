"""Prometheus text → Snapshot, and counter deltas between snapshots.

A Snapshot keeps every sample exactly as the server exposed it, keyed by the
*sample* name (``vllm:prefix_cache_hits_total``, ``..._bucket``, ``..._sum``):
prometheus_client's parser strips ``_total`` from counter *family* names, and
keying on families would make counters and same-named gauges collide.
``_created`` samples (counter/histogram creation timestamps, which vLLM also
exposes as separate gauges) are dropped: they are not measurements.

Aggregation across label sets is explicit: ``sum`` adds every label set that
matches a filter, so a server with several ``engine`` (data-parallel ranks) or
``model_name`` labels is totalled unless the caller filters.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset  # frozenset of (label, value) pairs
SampleKey = tuple[str, Labels]

# Parser suffix conventions (kept local so the rest of agentx needn't know them).
_CREATED = "_created"


@dataclass
class Snapshot:
    """One scrape of /metrics: samples by (sample name, labels) plus family names.

    ``t`` is a monotonic timestamp in seconds (caller-supplied or parse time);
    ``wall`` the matching Unix time, so series can be lined up with logs.
    """

    t: float
    samples: dict[SampleKey, float]
    families: dict[str, str] = field(default_factory=dict)  # family name -> type
    wall: float = 0.0
    _by_name: dict[str, list[tuple[dict[str, str], float]]] | None = field(
        default=None, repr=False, compare=False)

    # --- lookup -------------------------------------------------------------
    def _index(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        if self._by_name is None:
            idx: dict[str, list[tuple[dict[str, str], float]]] = {}
            for (name, labels), value in self.samples.items():
                idx.setdefault(name, []).append((dict(labels), value))
            self._by_name = idx
        return self._by_name

    def select(self, name: str, **label_filter: str) -> list[tuple[dict[str, str], float]]:
        """All (labels, value) of sample ``name`` whose labels match the filter."""
        rows = self._index().get(name, [])
        if not label_filter:
            return list(rows)
        return [(lb, v) for lb, v in rows
                if all(lb.get(k) == str(want) for k, want in label_filter.items())]

    def has(self, name: str) -> bool:
        """True if any sample called ``name`` was exposed."""
        return name in self._index()

    def sum(self, name: str, **label_filter: str) -> float | None:
        """Sum of sample ``name`` over matching label sets; None if nothing matches.

        None (not 0) when the family is absent *or* the filter matches nothing,
        so a wrong ``model_name`` filter cannot masquerade as a zero counter.
        """
        rows = self.select(name, **label_filter)
        if not rows:
            return None
        return float(sum(v for _, v in rows))

    def mean(self, name: str, **label_filter: str) -> float | None:
        """Mean over matching label sets (for per-engine ratios such as KV usage)."""
        vals = [v for _, v in self.select(name, **label_filter) if not math.isnan(v)]
        return sum(vals) / len(vals) if vals else None

    def max(self, name: str, **label_filter: str) -> float | None:
        """Max over matching label sets."""
        vals = [v for _, v in self.select(name, **label_filter) if not math.isnan(v)]
        return max(vals) if vals else None

    def by_label(self, name: str, label: str, **label_filter: str) -> dict[str, float]:
        """Sum of ``name`` grouped by the value of ``label`` (e.g. ``source``)."""
        out: dict[str, float] = {}
        for lb, v in self.select(name, **label_filter):
            if label in lb:
                out[lb[label]] = out.get(lb[label], 0.0) + v
        return out

    def family_names(self) -> set[str]:
        """Family names as the parser reports them (counters without ``_total``)."""
        return set(self.families)

    def has_family(self, name: str) -> bool:
        """True if ``name`` is exposed, spelled as family or as sample name.

        Accepts ``vllm:prefix_cache_hits`` and ``vllm:prefix_cache_hits_total``
        alike, so required-family lists need not know the parser's convention.
        """
        if name in self.families or self.has(name):
            return True
        if name.endswith("_total") and name[: -len("_total")] in self.families:
            return True
        return self.has(name + "_total")

    def reduced(self, keep: Callable[[str], bool],
                key_cache: dict[SampleKey, SampleKey] | None = None) -> "Snapshot":
        """Copy keeping only samples whose name passes ``keep``.

        ``key_cache`` interns keys across snapshots so a long time series shares
        one copy of each (name, labels) key instead of one per scrape.
        """
        samples: dict[SampleKey, float] = {}
        for key, value in self.samples.items():
            if keep(key[0]):
                if key_cache is not None:
                    key = key_cache.setdefault(key, key)
                samples[key] = value
        return Snapshot(t=self.t, samples=samples, families=self.families, wall=self.wall)


def parse_metrics(text: str, t: float | None = None, wall: float | None = None) -> Snapshot:
    """Parse Prometheus text exposition (or OpenMetrics) into a Snapshot.

    Raises ValueError on text prometheus_client cannot parse.
    """
    samples: dict[SampleKey, float] = {}
    families: dict[str, str] = {}
    try:
        for fam in _families(text):
            if fam.name.endswith(_CREATED):
                continue
            families[fam.name] = fam.type
            for s in fam.samples:
                if s.name.endswith(_CREATED):
                    continue
                samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    except Exception as exc:  # the parser raises assorted types on junk input
        raise ValueError(f"unparseable Prometheus text: {exc}") from exc
    return Snapshot(t=time.monotonic() if t is None else t, samples=samples,
                    families=families, wall=time.time() if wall is None else wall)


def _families(text: str) -> Iterable:
    if text.rstrip().endswith("# EOF"):
        from prometheus_client.openmetrics.parser import (
            text_string_to_metric_families as om_parse,
        )
        return om_parse(text)
    return text_string_to_metric_families(text)


def chain(first: Snapshot, last: Snapshot, series: Sequence[Snapshot] = ()) -> list[Snapshot]:
    """Time-ordered snapshots from ``first`` to ``last`` inclusive (deduplicated)."""
    # strictly inside: the series may hold reduced copies of first/last themselves
    inner = [s for s in series if first.t < s.t < last.t]
    inner.sort(key=lambda s: s.t)
    return [first, *inner, last] if last is not first else [first]


def counter_delta(snaps: Sequence[Snapshot], name: str, **label_filter: str) -> float | None:
    """Increase of counter ``name`` across time-ordered snapshots, reset-aware.

    Per label set, like Prometheus ``increase()`` without extrapolation: a value
    that drops between two scrapes is a counter reset (server restart) and the
    new value counts as the increase. A label set absent from the first
    snapshot started at 0 after it (vLLM creates labelled children lazily). A
    later snapshot that knows nothing of the metric (a truncated page) is
    skipped rather than read as a reset. None if no snapshot exposes the metric;
    0.0 if it is declared but has no matching samples.
    """
    known = False
    total = 0.0
    prev: dict[frozenset, float] | None = None
    for snap in snaps:
        cur = {frozenset(lb.items()): v for lb, v in snap.select(name, **label_filter)}
        declared = bool(cur) or _declares(snap, name)
        known = known or declared
        if prev is None:
            prev = cur  # baseline, even if empty
            continue
        if not declared:
            continue
        for key, v in cur.items():
            before = prev.get(key)
            if before is None:
                total += v
            elif v >= before:
                total += v - before
            else:
                total += v  # reset
        prev = {**prev, **cur}
    return total if known else None


def _declares(snap: Snapshot, sample_name: str) -> bool:
    """True if the snapshot has a family that would own ``sample_name``."""
    if sample_name in snap.families:
        return True
    for suffix in ("_total", "_sum", "_count", "_bucket"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in snap.families:
            return True
    return False


def counter_delta_by_label(snaps: Sequence[Snapshot], name: str, label: str,
                           **label_filter: str) -> dict[str, float]:
    """``counter_delta`` split by the value of ``label`` (e.g. position, source)."""
    values: set[str] = set()
    for snap in snaps:
        for lb, _ in snap.select(name, **label_filter):
            if label in lb:
                values.add(lb[label])
    out: dict[str, float] = {}
    for val in sorted(values):
        d = counter_delta(snaps, name, **{**label_filter, label: val})
        if d is not None:
            out[val] = d
    return out


def counter_resets(snaps: Sequence[Snapshot], name: str) -> int:
    """How many times any label set of counter ``name`` went backwards."""
    n = 0
    for a, b in zip(snaps, snaps[1:]):
        before = {frozenset(lb.items()): v for lb, v in a.select(name)}
        for lb, v in b.select(name):
            old = before.get(frozenset(lb.items()))
            if old is not None and v < old:
                n += 1
    return n
