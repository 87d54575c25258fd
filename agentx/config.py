"""Every option of a run, declared once: `agentx run`'s flags (and `python bench.py`'s) are
derived from `RunConfig`, and the same typed object travels to worker processes and Ray
actors and is recorded (minus secrets) in summary.json."""
from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BeforeValidator, SecretStr, field_validator, model_validator

from .errors import InputError
from .golden_al import GoldenPin
from .metrics.cost import CostOption
from .metrics.goodput import slo_option
from .metrics.percentiles import PercentilesOption
from .options import FieldError, opt
from .rundir import RunDir, trace_label
from .urls import normalise_base_url, redact_url

WORKLOAD, TARGET, SYNTH, OUTPUT = ("workload", "target", "prompt synthesis",
                                   "output and validation")
# `ttft:MS,tpot:MS,e2el:MS` -> {"ttft": MS, ...}; Annotated so the command line hands the
# string to this validator instead of parsing it as JSON like other mappings
SLO = Annotated[dict[str, float], BeforeValidator(slo_option)]

KEY_CHARS = "must be printable ASCII without spaces (it is sent in an HTTP header)"
MAX_WAIT_S = 30 * 86400.0  # the longest time limit accepted: beyond it, no limit is meant


def header_safe(key: str) -> bool:
    """An API key sendable as a header value: printable ASCII, no space (a non-latin-1 key
    could not be encoded at all, a CR/LF would end the header)."""
    return key.isascii() and key.isprintable() and " " not in key


def _seconds_or_auto(v: object) -> object:
    """'auto' or seconds >= 0, one plain message for anything else (no union jargon)."""
    if v == "auto" or v is None:
        return v
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError("must be seconds >= 0 or auto") from None
    if not 0 <= x <= MAX_WAIT_S:  # NaN and infinity too: they overflow the ns clocks
        raise ValueError(f"must be seconds >= 0 (at most {MAX_WAIT_S:.0f}) or auto")
    return x


def _labels(v: object) -> object:
    """`--label K=V` (repeatable, or K=V,K2=V2) or a mapping -> {K: V}, keys plain words."""
    if v is None:
        return {}
    items: list = []
    if isinstance(v, str):
        v = [v]
    if isinstance(v, dict):
        items = [(str(k), "" if x is None else str(x)) for k, x in v.items()]
    elif isinstance(v, (list, tuple)):
        for part in (p.strip() for s in v for p in str(s).split(",")):
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{part!r} is not KEY=VALUE")
            items.append((key.strip(), value.strip()))
    else:
        raise ValueError("must be KEY=VALUE pairs")
    for key, _ in items:
        if not key.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"label key {key!r}: letters, digits, '_', '-', '.' only")
    return dict(items)


LABELS = Annotated[dict[str, str], BeforeValidator(_labels)]
SecondsOrAuto = Annotated[float | Literal["auto"], BeforeValidator(_seconds_or_auto)]
AUTO_FROM_LANES = 64  # --ramp-up auto acts from this many lanes (docs/scale-out.md)
# The defaults are sized so that the quickstart (`bench.py --trace swe --conc 8`, the embedded
# simulator) reaches its steady state and measures at least DEFAULT_MIN_SAMPLES requests in
# about 2.5 minutes: the built-in swe trace's think times have p50 10 s but mean 122 s (p99
# 2,134 s, `agentx trace stats swe`), so one lane sends a request every ~25 s with a 60 s cap
# and every ~50 s with the former 300 s cap (24 requests in a 150 s window at 8 lanes).
DEFAULT_DURATION_S = 120.0
DEFAULT_MAX_THINK_S = 30.0
DEFAULT_MIN_SAMPLES = 30
RAMP_LANES_PER_S = 8.0
RAMP_MAX_S = 30.0


class RunConfig(PercentilesOption, CostOption):  # declared once, shared with sweep, report
    # --- workload ---
    trace: str = opt("swe", "built-in name (swe) or path", group=WORKLOAD, min_length=1)
    conc: int = opt(8, "concurrent session lanes", group=WORKLOAD, ge=1, le=65536)
    duration_s: float | None = opt(DEFAULT_DURATION_S, "seconds before no new request starts "
                                   "(counted from the end of an auto warm-up; 0 = no limit)",
                                   flag="duration", group=WORKLOAD, ge=0.0)
    max_requests: int | None = opt(None, "stop after N requests in all, split evenly over the "
                                   "lanes (so every run sends the same requests)",
                                   group=WORKLOAD, ge=1)
    warmup_s: SecondsOrAuto = opt(
        "auto", "requests sent in the warm-up are flagged and excluded from the statistics. "
        "auto (default): the warm-up ends when every lane has finished its first request (a "
        "cold prompt: start-up, not steady state) and --duration counts from there, so the "
        "run lasts warm-up + duration; a warm-up still going after ramp-up + 5 x duration stops "
        "the run there, marked steady_state false. SECONDS: a fixed warm-up inside --duration "
        "(0: measure from the first request)", flag="warmup", group=WORKLOAD)
    ramp_up_s: SecondsOrAuto = opt(
        "auto", "spread lane starts evenly over this many seconds (lane i starts at i x "
        "ramp / conc, deterministic). auto: 0 below 64 lanes, else conc / 8 s up to 30 s, "
        "so the server meets 8 new sessions a second instead of every cold first prompt at "
        "one instant", flag="ramp_up", group=WORKLOAD)
    seed: int = opt(0, "schedule seed", group=WORKLOAD)
    session_rate: float | None = opt(
        None, "open loop: sessions arrive as a Poisson process at this many per second "
        "instead of running on --conc lanes (docs/metrics.md#open-loop-arrivals)",
        group=WORKLOAD, gt=0.0)
    burstiness: float = opt(1.0, "open loop: gamma-distributed gaps between session arrivals "
                            "with this shape (vllm bench serve's --burstiness): 1 = Poisson, "
                            "< 1 burstier, > 1 more even; the mean rate stays --session-rate",
                            group=WORKLOAD, gt=0.0)
    max_active: int | None = opt(None, "open loop: at most N sessions in progress; a session "
                                 "arriving beyond the cap waits (the wait is reported)",
                                 group=WORKLOAD, ge=1, le=65536)
    arrivals: Literal["lanes", "trace", "poisson"] = opt(
        "lanes", "how sessions start: lanes (closed loop, --conc), trace (each session of a "
        "Mooncake trace at its own timestamp, whole), poisson (implied by --session-rate)",
        group=WORKLOAD)
    time_scale: float = opt(1.0, "--arrivals trace: multiply the trace's arrival times (0.5 = "
                            "twice the rate)", group=WORKLOAD, gt=0.0)
    think_scale: float = opt(1.0, "multiply trace think times", group=WORKLOAD, ge=0.0)
    max_think_s: float = opt(DEFAULT_MAX_THINK_S, "cap one think time (s): a longer pause in a "
                             "real session is a person away from the keyboard, and at a fixed "
                             "lane count it only idles the lane", flag="max_think",
                             group=WORKLOAD, ge=0.0)
    start_min: float = opt(0.25, "a lane starts each session at a random turn at least this "
                           "fraction into it", group=WORKLOAD, ge=0.0, le=1.0)
    start_max: float = opt(0.75, "... and at most this fraction into it", group=WORKLOAD,
                           ge=0.0, le=1.0)
    drain_timeout_s: float = opt(30.0, "seconds in-flight requests may finish after the stop "
                                 "(then cancelled)", flag="drain_timeout", group=WORKLOAD,
                                 ge=0.0, le=MAX_WAIT_S)
    workers: int | Literal["auto"] = opt(1, "client processes the lanes are split over, or "
                                         "'auto'", group=WORKLOAD)
    ray: str | None = opt(None, "place the worker processes as Ray actors across hosts: a "
                          "cluster address (auto, HOST:6379, ray://HOST:10001) or 'local' (pip "
                          "install 'agentx-bench[ray]'; see docs/scale-out.md)", group=WORKLOAD)
    # --- target ---
    base_url: str | None = opt(None, "OpenAI-compatible server; omitted: start the embedded "
                               "simulator", group=TARGET)
    model: str | None = opt(None, "default: the first model at /v1/models", group=TARGET)
    api_key: SecretStr | None = opt(None, "default: $OPENAI_API_KEY (never recorded)",
                                    group=TARGET)
    timeout_s: float = opt(600.0, "per-read timeout (s)", flag="timeout", group=TARGET, gt=0.0,
                           le=MAX_WAIT_S)
    request_timeout_s: float = opt(
        3600.0, "seconds one request may take in all, connect to last byte, however steadily "
        "the server streams (--timeout bounds only the silence between reads): a server "
        "trickling tokens would otherwise hold a lane, and a --max-requests run, for ever. The "
        "default hour is past any legitimate agentic request: 32k output tokens at 100 ms each "
        "on an overloaded server take 53 min. A request over it fails as `timeout`; a run ends "
        "within the bound in docs/reliability.md", flag="request_timeout", group=TARGET,
        gt=0.0, le=MAX_WAIT_S)
    connect_timeout_s: float = opt(10.0, "seconds to connect, and the bound on each start-up "
                                   "probe (/v1/models, /tokenize, the first /metrics scrape): "
                                   "a server that accepts but never answers fails start-up "
                                   "after this", flag="connect_timeout", group=TARGET, gt=0.0,
                                   le=3600.0)
    thinking: Literal["on", "off"] | None = opt(None, "chat_template_kwargs.enable_thinking "
                                                "(default: the server's)", group=TARGET)
    extra_body: dict = opt(None, "JSON object merged into every request body", factory=dict,
                           group=TARGET)
    # --- prompt synthesis ---
    tokenizer: str | None = opt(None, "local HF tokenizer dir: client-side chat template, exact "
                                "token ids", group=SYNTH)
    context_scale: float = opt(1.0, "scale trace token counts (fit long traces to a small "
                               "model)", group=SYNTH, gt=0.0)
    shared_prefix: Literal["none", "system", "system+tools"] = opt(
        "none", "content shared across sessions", group=SYNTH)
    live_history: bool = opt(False, "history uses the live response, not the trace's",
                             group=SYNTH)
    warm_cache: bool = opt(False, "no per-run cache isolation (repeat runs may hit a warm "
                           "cache)", group=SYNTH)
    cache_salt: bool = opt(True, "send a per-run cache_salt so no earlier run's cache is "
                           "hit (--no-cache-salt for servers that reject unknown fields)",
                           group=SYNTH)
    # --- output and validation ---
    output_dir: str | None = opt(None, "default: results/<time>-<trace>-c<N>", short="-o",
                                 group=OUTPUT)
    overwrite: bool = opt(False, "replace a previous run's result files in --output-dir "
                          "(default: refuse a non-empty directory)", group=OUTPUT)
    gpus: int | None = opt(None, "GPUs behind the server (per-GPU rates)", group=OUTPUT, ge=1)
    progress: bool = opt(True, "live progress display", group=OUTPUT)
    scrape_interval_s: float = opt(5.0, "/metrics period in s (0 = off)",
                                   flag="scrape_interval", group=OUTPUT, ge=0.0)
    gpu_indices: list[int] | None = opt(
        None, "GPUs whose power, energy, utilisation, memory and SM clock are sampled at the "
        "--scrape-interval through NVML when nvidia-ml-py is installed (agentx-bench[gpu]) "
        "and the server is on this machine (docs/metrics.md, GPU power and energy). "
        "Default: all", group=OUTPUT, metavar="I,J")
    validation: Literal["strict", "warn", "off"] = opt(
        "strict", "a failed validation verdict exits 3 (strict) or only warns (warn: exit 0); "
        "off skips validation (docs/reliability.md)", flag="validate", group=OUTPUT)
    max_error_rate: float = opt(0.5, "abort the run when more than this share of the last "
                                "--error-window finished requests failed (0 = never abort)",
                                group=OUTPUT, ge=0.0, le=1.0)
    error_window: int = opt(50, "finished requests the --max-error-rate share is taken over "
                            "(judged from the 10th on)", group=OUTPUT, ge=1, le=1_000_000)
    expect_al: float | None = opt(None, "expected (synthetic) acceptance length to validate",
                                  group=OUTPUT, ge=1.0)
    golden_al: GoldenPin | None = opt(
        None, "the golden entry the server's synthetic AL is pinned from, FILE:MODEL:on|off:K "
        "(recipes/golden/*.yaml): recorded in the summary; it is the expected AL unless "
        "--expect-al is given, validation fails traffic of the other thinking mode, and the "
        "embedded simulator is pinned to it (docs/calibration.md)", group=OUTPUT)
    al_tolerance: float = opt(0.05, "allowed |measured - expected| acceptance length",
                              group=OUTPUT, gt=0.0)
    slo: SLO | None = opt(None, "latency SLOs in ms, e.g. ttft:2000,tpot:50,e2el:60000: the "
                          "summary adds the share of requests meeting each and goodput (as "
                          "vllm bench serve --goodput)", group=OUTPUT)
    expect_offload: bool = opt(False, "an offload connector is configured: offload hits must "
                               "appear (implied when the tier's size is known or the server "
                               "reports external prefix-cache hits)", group=OUTPUT)
    min_samples: int = opt(DEFAULT_MIN_SAMPLES, "a window with fewer measured requests gets "
                           "the verdict insufficient instead of pass (exit 3 under --validate "
                           "strict): too few to publish percentiles from", group=OUTPUT, ge=0)
    labels: LABELS = opt(None, "KEY=VALUE stored in summary.json and shown in reports (e.g. "
                         "connector=mooncake); repeatable, or comma-separated", factory=dict,
                         flag="label", group=OUTPUT, repeat=True)
    offload_tokens: int | None = opt(None, "KV offload tier size in tokens, for the pool-aware "
                                     "theoretical hit rate (default: from the server's /metrics "
                                     "where it says; 0 = no tier)", group=OUTPUT, ge=0)
    loop_lag_threshold_ms: float | None = opt(
        None, "fail the run as client-bound when event-loop lag p99 exceeds this (default: "
        "fail when lag p75 > max(2 ms, 10% of the chunk ITL p50), only warn when lag p99 > "
        "max(5 ms, 10% of it); docs/reliability.md)", flag="loop_lag_threshold", group=OUTPUT,
        gt=0.0)

    @field_validator("duration_s")
    @classmethod
    def _zero_is_unbounded(cls, v: float | None) -> float | None:
        return v or None

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else normalise_base_url(v)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: object) -> object:
        return int(v) if isinstance(v, str) and v.isdigit() else v

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.api_key is not None and not header_safe(self.api_key.get_secret_value()):
            raise FieldError("api_key", KEY_CHARS)  # a validator's message would quote the key
        if self.start_min > self.start_max:
            raise FieldError("start_min", "must be <= start_max")
        if self.duration_s is None and self.max_requests is None:
            raise FieldError("duration_s", "give --duration or --max-requests (a run must be "
                             "bounded)")
        if isinstance(self.workers, int) and self.workers < 1:
            raise FieldError("workers", "must be >= 1 or auto")
        if self.session_rate is not None:
            if "conc" in self.model_fields_set:
                raise FieldError("session_rate", "give --conc (closed loop) or --session-rate "
                                 "(open loop), not both")
        if self.arrivals == "poisson" and self.session_rate is None:
            raise FieldError("arrivals", "poisson needs --session-rate")
        if self.arrivals == "trace" and self.session_rate is not None:
            raise FieldError("session_rate", "--arrivals trace takes the trace's own times "
                             "(scale them with --time-scale)")
        if self.open_loop() and (self.workers != 1 or self.ray):
            raise FieldError("workers", "open-loop arrivals run in one client process: "
                             "--workers 1, no --ray")
        return self

    def arrival_mode(self) -> str:
        """lanes, poisson or trace: --session-rate alone implies poisson."""
        return "poisson" if self.session_rate is not None and self.arrivals == "lanes" \
            else self.arrivals

    def open_loop(self) -> bool:
        """Sessions arrive on a schedule (Poisson or the trace's) instead of running on lanes."""
        return self.arrival_mode() != "lanes"

    def warmup_auto(self) -> bool:
        """The warm-up ends when every lane has finished its first request."""
        return self.warmup_s == "auto"

    def warmup_fixed_s(self) -> float:
        return self.warmup_s if isinstance(self.warmup_s, float) else 0.0

    def ramp_up(self) -> float:
        """Seconds over which lane starts are spread (auto: 8 lanes a second from 64 lanes)."""
        if self.open_loop():  # arrivals have their own schedule: there are no lanes to spread
            return 0.0
        if self.ramp_up_s != "auto":
            return float(self.ramp_up_s)
        return 0.0 if self.conc < AUTO_FROM_LANES else min(RAMP_MAX_S, self.conc / RAMP_LANES_PER_S)

    def public(self) -> dict:
        """The config as recorded in results: everything to rerun, no secrets."""
        d = self.model_dump(mode="json")
        if self.api_key is not None:
            d["api_key"] = "<redacted>"
        d["base_url"] = redact_url(self.base_url)
        return d

    def secret_key(self) -> str | None:
        """The key to send: --api-key, else $OPENAI_API_KEY (read here, never stored)."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        key = os.environ.get("OPENAI_API_KEY") or None
        if key is not None and not header_safe(key):
            raise InputError("environment", KEY_CHARS, field="$OPENAI_API_KEY")
        return key


def run_dir(cfg: RunConfig) -> RunDir:
    """--output-dir, else results/<time>-<trace>-<load>: c<N> lanes, r<R> sessions/s, or
    `arrivals` (trace times)."""
    mode = cfg.arrival_mode()
    load = (f"r{cfg.session_rate:g}" if mode == "poisson" else "arrivals" if mode == "trace"
            else f"c{cfg.conc}")
    return RunDir.at(cfg.output_dir, trace_label(cfg.trace), load)
