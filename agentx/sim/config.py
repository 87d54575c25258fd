"""Every option of the simulator, declared once: `serve-sim`'s flags, `agentx run`'s
`--sim-*` flags and the embedding API are all derived from this model.

`None` means "take it from the hardware/model profile" so that a profile stays the single
source of truth for hardware-derived values (TP, block size, KV pool, scheduler limits).
"""
from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ..offload import Connector, Kind, connector
from ..options import FieldError, StrictModel, opt

FAIL_KINDS: tuple[str, ...] = ("429", "500", "503", "reset", "stall", "malformed", "slow-headers")
FailKind = Literal["429", "500", "503", "reset", "stall", "malformed", "slow-headers"]

SERVER, HW, SPEC, OFFLOAD, TIME, FAULTS = ("server", "hardware and model", "speculative decoding",
                                           "KV offload tier", "time", "fault injection")


class SimConfig(StrictModel):
    # --- server ---
    host: str = opt("127.0.0.1", "bind address (loopback by default)", group=SERVER)
    port: int = opt(8000, "port; 0 picks a free one (the embedded server always does)",
                    group=SERVER, ge=0, le=65535)
    model_name: str = opt("agentx-sim", "served model name", group=SERVER, min_length=1)
    max_model_len: int = opt(1_048_576, "longest prompt + output accepted (fits the 1M-token "
                             "prompts of the real traces)", group=SERVER, ge=16)
    api_key: str | None = opt(None, "require 'Authorization: Bearer KEY' on /v1 routes (401)",
                              group=SERVER)
    per_request_metrics: bool = opt(True, "server-side `metrics` in responses, like vLLM's "
                                    "--enable-per-request-metrics", group=SERVER)
    prompt_tokens_details: bool = opt(True, "usage.prompt_tokens_details.cached_tokens, like "
                                      "vLLM's --enable-prompt-tokens-details", group=SERVER)
    default_thinking: bool = opt(True, "chat_template_kwargs.enable_thinking when the client "
                                 "omits it", group=SERVER)
    reasoning_fraction: float = opt(0.3, "share of output tokens sent as delta.reasoning when "
                                    "thinking", group=SERVER, ge=0.0, le=1.0)
    eos_prob: float = opt(0.002, "per-token chance of an early EOS without ignore_eos",
                          group=SERVER, ge=0.0, le=1.0)
    seed: int = opt(0, "random seed (faults, acceptance, EOS)", group=SERVER)
    engine_id: str = opt("0", "the `engine` label of /metrics", group=SERVER, cli=False)

    # --- hardware / model ---
    profile: str = opt("h200-minimaxm3-fp8", "shipped profile name or path to a YAML profile",
                       group=HW, min_length=1)
    tp: int | None = opt(None, "tensor parallel size (default: profile)", group=HW, ge=1)
    gpu_memory_utilization: float | None = opt(None, "share of HBM vLLM may use (default: "
                                               "profile)", group=HW, gt=0.0, le=1.0)
    kv_pool_tokens: int | None = opt(None, "override the derived GPU KV pool size", group=HW,
                                     ge=1)
    block_size: int | None = opt(None, "KV block size in tokens (default: profile)", group=HW,
                                 ge=1)
    max_num_seqs: int | None = opt(None, "scheduler limit (default: profile)", group=HW, ge=1)
    max_num_batched_tokens: int | None = opt(None, "scheduler limit (default: profile)",
                                             group=HW, ge=1)
    long_prefill_token_threshold: int | None = opt(
        None, "most prompt tokens one request prefills per step, 0 = no cap (vLLM's "
        "--long-prefill-token-threshold; default: profile)", group=HW, ge=0)
    max_num_partial_prefills: int | None = opt(
        None, "vLLM's --max-num-partial-prefills: above 1 an unset threshold becomes 4 percent of "
        "max_model_len (default: profile)", group=HW, ge=1)
    reserve_full_isl: bool | None = opt(
        None, "admit a request only when its whole sequence fits the KV pool (vLLM's "
        "scheduler_reserve_full_isl; False: when its first chunk fits; default: profile)", cli=False)

    # --- speculative decoding ---
    spec_k: int = opt(0, "speculative tokens per step (0 = off)", group=SPEC, ge=0, le=16)
    synthetic_al: float | None = opt(None, "synthetic mean acceptance length L (1..K+1)",
                                     group=SPEC, ge=1.0)
    synthetic_rates: list[float] | None = opt(None, "per-position acceptance rates p1,..,pK "
                                              "(non-increasing)", group=SPEC)

    # --- KV offload tier ---
    kv_offload: Kind = opt("none", "CPU offload tier: its connector", group=OFFLOAD)
    offload_gb: float | None = opt(None, "CPU tier size in GB (default: profile)",
                                   group=OFFLOAD, ge=0.0)
    offload_store: Literal["eager", "lazy"] | None = opt(
        None, "when blocks are copied to the tier (default: the connector's; simple-cpu lazy, "
        "mooncake and lmcache eager)", group=OFFLOAD)
    offload_store_walk: bool = opt(
        False, "model a lazy store as vLLM 0.24's SimpleCPUOffload does it: each step a walk "
        "over the GPU free queue holds the blocks it copies until the copy ends (off: the copy "
        "is free and instant at eviction)", group=OFFLOAD)
    offload_chunk_tokens: int | None = opt(
        None, "tier hits come back in whole chunks of this many tokens (default: the "
        "connector's; lmcache 256, others one GPU block)", group=OFFLOAD, ge=1)

    # --- time ---
    time_scale: float = opt(1.0, "run F x faster than real time (tests)", group=TIME, gt=0.0)
    fixed_ttft_ms: float | None = opt(None, "fidelity mode: exact TTFT, no roofline",
                                      group=TIME, ge=0.0)
    fixed_itl_ms: float | None = opt(None, "fidelity mode: exact gap between chunks",
                                     group=TIME, ge=0.0)

    # --- faults ---
    fail_rate: float = opt(0.0, "share of requests that fail", group=FAULTS, ge=0.0, le=1.0)
    fail_kinds: tuple[FailKind, ...] = opt(FAIL_KINDS, "kinds a failure is drawn from",
                                           group=FAULTS, min_length=1)
    stall_s: float = opt(5.0, "how long a `stall` fault freezes the stream", flag="stall_s",
                         group=FAULTS, ge=0.0)
    slow_headers_s: float = opt(5.0, "how long a `slow-headers` fault delays the headers",
                                flag="slow_headers_s", group=FAULTS, ge=0.0)

    # --- ground truth ---
    truth_log: str | None = opt(None, "write one JSON line per request (chunk send times)",
                                group=TIME)

    extra: dict = opt(None, "free-form settings for experiments", factory=dict, cli=False)

    @property
    def offload_connector(self) -> type[Connector]:
        """The class of `kv_offload`: whether a tier exists, its store policy, its families."""
        return connector(self.kv_offload)

    @model_validator(mode="after")
    def _consistent(self) -> "SimConfig":
        if self.synthetic_al is not None and self.synthetic_rates is not None:
            raise FieldError("synthetic_al", "give either synthetic_al or synthetic_rates, not both")
        if self.synthetic_al is not None and not 1.0 <= self.synthetic_al <= self.spec_k + 1:
            raise FieldError("synthetic_al", f"must be in [1, spec_k+1={self.spec_k + 1}]")
        r = self.synthetic_rates
        if r is not None:
            if len(r) != self.spec_k:
                raise FieldError("synthetic_rates", f"needs exactly spec_k={self.spec_k} rates")
            if any(not 0.0 <= x <= 1.0 for x in r) or any(b > a for a, b in zip(r, r[1:])):
                raise FieldError("synthetic_rates", "rates must be in [0, 1] and non-increasing")
        if (self.fixed_ttft_ms is None) != (self.fixed_itl_ms is None):
            raise FieldError("fixed_ttft_ms", "fixed_ttft_ms and fixed_itl_ms go together")
        return self
