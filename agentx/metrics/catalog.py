"""The metric catalog: every metric a report shows, declared once, in the order the console,
runs.csv and ab.json show them.

An entry says what the metric is called (`key` in summary.json, `name` and `unit` in labels),
which way is better, its SLO name for `--slo` (vLLM's `--goodput` names), the percentiles
`agentx ab` compares and runs.csv carries, the CDF figures that draw it, and its value for one
request record (a function of the record that calls the pure definition in
`metrics.definitions`). Summary, console, plots, Pareto rows, A/B statistics and goodput
iterate this tuple, so a new metric is an entry here plus its definition
(docs/metrics.md, "The metric catalog"). Two kinds:

- `Dist`: a distribution over the measured requests (one value per request, or, `pooled`,
  several: the ITLs of each chunk gap), summarised by `dist.dist` under its key;
- `Ratio`: a sum over the measured requests over another sum (or over the window's
  seconds), e.g. the achieved prefix hit rate; A/B resamples it like the distributions.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from . import definitions as d
from .percentiles import pct_key, pct_name

VLLM_CLIENT = "vllm/benchmarks/lib/endpoint_request_func.py"
VLLM_SERVE = "vllm/benchmarks/serve.py (calculate_metrics)"
RUN_CDF, AB_CDF = "run", "ab"  # the figures: a run's latency_cdf.png, the A/B's ab_cdf.png

Value = Callable[[Mapping], "float | None"]


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution: `value(record)` is one request's value (None: undefined for it), or
    with `pooled` the request's list of values (every chunk gap)."""

    key: str  # summary.json key; a per-request metric's requests.jsonl field where it has one
    name: str  # "TTFT": labels are built from it and the unit
    unit: str  # "ms", "tok/s/user"
    higher_is_better: bool
    description: str
    source: str  # where its definition comes from (vLLM's file, InferenceX, AIPerf, agentx)
    value: Callable[[Mapping], object]
    pooled: bool = False  # several values per request (A/B cannot resample it per request)
    slo: str | None = None  # its --slo / vLLM --goodput name
    ab: tuple[float, ...] = ()  # percentiles `agentx ab` compares (default of --percentiles)
    csv: tuple[float, ...] = ()  # percentiles runs.csv carries (default of --percentiles)
    cdf: tuple[str, ...] = ()  # figures that draw its CDF (RUN_CDF, AB_CDF)
    console_label: str = ""  # the console row's label when not "<name> <unit>"
    column_format: str = ""  # "<stem>_p{q}_<unit>" when the key does not end in _ms

    def values(self, r: Mapping) -> Iterable[float]:
        """Its values for one record: none, one, or (pooled) one per chunk gap."""
        v = self.value(r)
        if self.pooled:
            return v  # type: ignore[return-value]
        return () if v is None else (v,)

    @property
    def label(self) -> str:
        """The console row's label: `TTFT ms`."""
        return self.console_label or f"{self.name} {self.unit}"

    @property
    def axis(self) -> str:
        """A CDF's x label: `TTFT (ms)`."""
        return f"{self.name} ({self.unit})"

    def column(self, q: float) -> str:
        """The name of its q-th percentile in runs.csv and ab.json: `ttft_p50_ms`,
        `ttft_p99_9_ms` (metrics/percentiles.py)."""
        fmt = self.column_format or f"{self.key.removesuffix('_ms')}_p{{q}}_ms"
        return fmt.format(q=pct_name(q))

    def pct_label(self, q: float) -> str:
        """`TTFT p50 ms`, `TTFT p99.9 ms`."""
        return f"{self.name} p{q:g} {self.unit}"


@dataclass(frozen=True, slots=True)
class Ratio:
    """Σ num / Σ den over the measured requests that have both (den None: Σ num per second of
    the measurement window); placed in summary.json at `summary` (block, key)."""

    key: str  # its ab.json key
    name: str  # its label
    unit: str  # "tok/s", "fraction" (printed as a percentage)
    higher_is_better: bool
    description: str
    source: str
    num: Value
    den: Value | None  # None: per second of the window
    summary: tuple[str, str]
    ab: bool = True

    def over(self, records: Sequence[Mapping], window_s: float) -> float | None:
        """Its value over `records` (the measured ones) in a window of `window_s` seconds."""
        if self.den is None:
            return sum(self.num(r) or 0.0 for r in records) / max(window_s, 1e-9)
        pairs = [(self.num(r), self.den(r)) for r in records]
        num = sum(n for n, m in pairs if n is not None and m is not None)
        den = sum(m for n, m in pairs if n is not None and m is not None)
        return num / den if den else None


Metric = Dist | Ratio


def _field(name: str) -> Value:
    """A per-request metric stored in the record by `records.assemble` (from the definition
    named in the entry's description)."""
    def value(r: Mapping) -> float | None:
        return r.get(name)
    return value


def _cached_prompt(r: Mapping) -> int | None:
    """Prompt tokens of a request that reports its cached tokens (the hit rate's denominator)."""
    return None if r.get("cached_tokens") is None else d.prompt_tokens(r)


CATALOG: tuple[Metric, ...] = (
    Dist("ttft_ms", "TTFT", "ms", False, "time to first token (definitions.ttft_ms)",
         VLLM_CLIENT, _field("ttft_ms"), slo="ttft", ab=(50, 90, 99), csv=(50, 90, 99),
         cdf=(RUN_CDF, AB_CDF)),
    Dist("ttft_per_1k_uncached_ms", "TTFT per 1k uncached", "ms", False,
         "TTFT per 1,000 prompt tokens the server prefilled (definitions.ttft_per_1k_uncached_ms)",
         "agentx (AIPerf's prefill throughput, uncached tokens only)",
         lambda r: d.ttft_per_1k_uncached_ms(r.get("ttft_ms"), r.get("isl"), r.get("cached_tokens")),
         ab=(50, 90), csv=(50,)),
    Dist("ttfc_ms", "TTFC", "ms", False,
         "time to first non-reasoning content (definitions.ttfc_ms)", "agentx",
         _field("ttfc_ms")),
    Dist("tpot_ms", "TPOT", "ms", False,
         "time per output token after the first (definitions.tpot_ms)", VLLM_SERVE,
         _field("tpot_ms"), slo="tpot", ab=(50, 90), csv=(50, 90), cdf=(RUN_CDF, AB_CDF)),
    Dist("itl_ms", "ITL (chunk)", "ms", False, "gap between token chunks", VLLM_CLIENT,
         lambda r: d.chunk_itls_ms(r["chunk_offsets_ns"]), pooled=True, cdf=(RUN_CDF,)),
    Dist("itl_token_ms", "ITL (token)", "ms", False, "chunk gap per token it carried",
         "agentx", lambda r: d.token_itls_ms(r["chunk_offsets_ns"], r["chunk_tokens"]),
         pooled=True),
    Dist("e2e_ms", "E2E", "ms", False, "end-to-end request latency (definitions.e2e_ms)",
         VLLM_CLIENT, _field("e2e_ms"), slo="e2el", ab=(90,)),
    Ratio("output_tok_s", "output tok/s", "tok/s", True,
          "output tokens of the measured requests per second of the window", "agentx",
          lambda r: r.get("osl") or 0, None, ("throughput", "output_tok_s")),
    Dist("interactivity_tok_s_user", "interactivity", "tok/s/user", True,
         "tokens per second per user, 1000 / TPOT", "InferenceX",
         lambda r: d.interactivity_tok_s(r.get("tpot_ms")), ab=(50,),
         console_label="tok/s/user", column_format="interactivity_p{q}_tok_s"),
    Ratio("hit_rate", "achieved hit rate", "fraction", True,
          "cached prompt tokens / prompt tokens, over the requests that report cached tokens",
          "agentx", lambda r: r.get("cached_tokens"), _cached_prompt,
          ("cache", "achieved_hit_rate")),
)

DISTS: tuple[Dist, ...] = tuple(m for m in CATALOG if isinstance(m, Dist))
RATIOS: tuple[Ratio, ...] = tuple(m for m in CATALOG if isinstance(m, Ratio))
SLO_KEYS: tuple[str, ...] = tuple(m.slo for m in DISTS if m.slo)


def dist_named(key: str) -> Dist:
    """The distribution whose summary key is `key` (KeyError: no such metric)."""
    for m in DISTS:
        if m.key == key:
            return m
    raise KeyError(key)


def by_slo(slo: str) -> Dist:
    """The distribution whose SLO name is `slo` (`ttft`, `tpot`, `e2el`)."""
    return next(m for m in DISTS if m.slo == slo)


def cdf_metrics(figure: str) -> tuple[Dist, ...]:
    """The distributions a figure (RUN_CDF, AB_CDF) draws, in catalog order."""
    return tuple(m for m in DISTS if figure in m.cdf)


def csv_columns(summary: Mapping) -> dict[str, float | None]:
    """runs.csv's percentile columns of one run, from its summary: each metric's `csv`
    percentiles (always there: tools read them), plus the summary's --percentiles for every
    metric that has csv columns."""
    chosen = tuple(summary.get("percentiles") or ())
    return {m.column(q): (summary.get(m.key) or {}).get(pct_key(q))
            for m in DISTS for q in (sorted({*m.csv, *chosen}) if m.csv else ())}


def _check() -> None:
    """Declarations that cannot work are refused at import: duplicate keys or SLO names,
    an A/B percentile of a pooled metric (the bootstrap resamples requests)."""
    keys = [m.key for m in CATALOG]
    if len(set(keys)) != len(keys) or len(set(SLO_KEYS)) != len(SLO_KEYS):
        raise ValueError(f"metric catalog: a key or SLO name declared twice ({keys})")
    for m in DISTS:
        if m.pooled and m.ab:
            raise ValueError(f"metric catalog: {m.key} is pooled; A/B resamples requests")


_check()
