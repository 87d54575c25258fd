"""Every option of the embedded simulator, as one plain dataclass shared by CLI and embedding.

`None` means "take it from the hardware/model profile" so that a profile stays the single
source of truth for hardware-derived values (TP, block size, KV pool, scheduler limits).
"""
from __future__ import annotations

from dataclasses import dataclass, field

FAIL_KINDS: tuple[str, ...] = ("429", "500", "503", "reset", "stall", "malformed", "slow-headers")
OFFLOAD_BACKENDS: tuple[str, ...] = ("none", "simple-cpu", "mooncake")


@dataclass
class SimConfig:
    # --- server ---
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = pick a free port (the embedded server always does)
    model_name: str = "agentx-sim"
    max_model_len: int = 1_048_576  # fits the 1M-token prompts of the real traces
    api_key: str | None = None  # when set, requests need `Authorization: Bearer <key>` (401)
    per_request_metrics: bool = True  # like --enable-per-request-metrics
    prompt_tokens_details: bool = True  # like --enable-prompt-tokens-details
    default_thinking: bool = True  # chat_template_kwargs.enable_thinking when the client omits it
    reasoning_fraction: float = 0.3  # share of output tokens sent as delta.reasoning when thinking
    eos_prob: float = 0.002  # per-token chance of an early EOS when the request lacks ignore_eos
    seed: int = 0
    engine_id: str = "0"

    # --- hardware / model ---
    profile: str = "h200-minimaxm3-fp8"  # shipped name or path to a YAML profile
    tp: int | None = None
    gpu_memory_utilization: float | None = None
    kv_pool_tokens: int | None = None  # override the derived GPU KV pool
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    # --- speculative decoding ---
    spec_k: int = 0
    synthetic_al: float | None = None
    synthetic_rates: list[float] | None = None

    # --- KV offload tier ---
    kv_offload: str = "none"  # none | simple-cpu | mooncake
    offload_gb: float | None = None  # None = the profile's default CPU tier size
    offload_store: str | None = None  # eager | lazy; None = backend default (simple-cpu lazy, mooncake eager)

    # --- time ---
    time_scale: float = 1.0  # run F x faster than real time (tests)
    fixed_ttft_ms: float | None = None  # fidelity mode: bypass the roofline
    fixed_itl_ms: float | None = None

    # --- faults ---
    fail_rate: float = 0.0
    fail_kinds: tuple[str, ...] = FAIL_KINDS
    stall_s: float = 5.0  # how long a `stall` fault freezes the stream
    slow_headers_s: float = 5.0  # how long a `slow-headers` fault delays the response headers

    # --- ground truth ---
    truth_log: str | None = None

    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise InputError naming the bad option (CLI prints it as one line, exit 2)."""
        from ..errors import InputError

        def bad(name: str, msg: str) -> None:
            raise InputError("serve-sim", msg, field=name)

        if self.kv_offload not in OFFLOAD_BACKENDS:
            bad("kv_offload", f"must be one of {', '.join(OFFLOAD_BACKENDS)}")
        if self.offload_store not in (None, "eager", "lazy"):
            bad("offload_store", "must be eager or lazy")
        for k in self.fail_kinds:
            if k not in FAIL_KINDS:
                bad("fail_kinds", f"unknown kind {k!r}; known: {','.join(FAIL_KINDS)}")
        if not 0.0 <= self.fail_rate <= 1.0:
            bad("fail_rate", "must be in [0, 1]")
        if self.time_scale <= 0:
            bad("time_scale", "must be > 0")
        if self.spec_k < 0:
            bad("spec_k", "must be >= 0")
        if self.synthetic_al is not None and self.synthetic_rates is not None:
            bad("synthetic_al", "give either synthetic_al or synthetic_rates, not both")
        if self.synthetic_al is not None and not 1.0 <= self.synthetic_al <= self.spec_k + 1:
            bad("synthetic_al", f"must be in [1, spec_k+1={self.spec_k + 1}]")
        if self.synthetic_rates is not None:
            r = self.synthetic_rates
            if len(r) != self.spec_k:
                bad("synthetic_rates", f"needs exactly spec_k={self.spec_k} rates")
            if any(not 0.0 <= x <= 1.0 for x in r) or any(b > a for a, b in zip(r, r[1:])):
                bad("synthetic_rates", "rates must be in [0, 1] and non-increasing")
        if not 0.0 <= self.reasoning_fraction <= 1.0:
            bad("reasoning_fraction", "must be in [0, 1]")
        for name in ("fixed_ttft_ms", "fixed_itl_ms", "offload_gb", "kv_pool_tokens"):
            v = getattr(self, name)
            if v is not None and v < 0:
                bad(name, "must be >= 0")
        if (self.fixed_ttft_ms is None) != (self.fixed_itl_ms is None):
            bad("fixed_ttft_ms", "fixed_ttft_ms and fixed_itl_ms go together")
