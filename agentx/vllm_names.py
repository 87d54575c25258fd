"""vLLM's /metrics vocabulary, declared once: the reader (agentx.metrics) and the simulator
(agentx.sim.vllm_metrics) both take their names from here, so the two cannot drift apart.

Names are metric *families* as vLLM 0.32 registers them (prometheus_client appends `_total` to
a counter's sample, `_bucket`/`_sum`/`_count` to a histogram's); `total()` gives a counter's
sample name. Sources, in vLLM 0.32.0:
  * vllm/v1/metrics/loggers.py (`PrometheusStatLogger`): every family below up to CACHE_CONFIG;
  * vllm/v1/simple_kv_offload/metrics.py: the SIMPLE_* families (SimpleCPUOffloadConnector);
  * vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/metrics.py: MOONCAKE_*;
  * vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py: OFFLOAD_* (the native
    OffloadingConnector; the legacy `kv_offload_total_bytes` split by transfer_type).
tests/data/vllm-samples/metrics_after.txt is a real 0.32 scrape of the core families.
"""
from __future__ import annotations

# --- scheduler state (gauges)
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # {reason=capacity|deferred}
# waiting requests by async KV load stage, with a KV connector that loads (kv_both, consumer):
# {stage=waiting_to_start|in_progress|completed_waiting} (vllm/v1/metrics/stats.py KV_FETCH_STAGES)
KV_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SLEEP_STATE = "vllm:engine_sleep_state"  # {sleep_state}
KV_USAGE = "vllm:kv_cache_usage_perc"

# --- prefix cache and tokens (counters)
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
EXT_QUERIES = "vllm:external_prefix_cache_queries"
EXT_HITS = "vllm:external_prefix_cache_hits"
MM_QUERIES = "vllm:mm_cache_queries"
MM_HITS = "vllm:mm_cache_hits"
PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source"  # {source=local_compute|local_cache_hit|...}
PROMPT_CACHED = "vllm:prompt_tokens_cached"
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source"  # {source=device|host|...}
GEN_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # {finished_reason}
ADMISSION_REJECTIONS = "vllm:admission_rejections"  # {reason}
FLOPS = "vllm:estimated_flops_per_gpu"
READ_BYTES = "vllm:estimated_read_bytes_per_gpu"
WRITE_BYTES = "vllm:estimated_write_bytes_per_gpu"

# --- speculative decoding (counters; registered only with a speculative config)
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # {position}

# --- per-request histograms
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GEN_TOKENS = "vllm:request_generation_tokens"
ITERATION_TOKENS = "vllm:iteration_tokens_total"  # a histogram whose name ends in _total
REQUEST_MAX_GEN_TOKENS = "vllm:request_max_num_generation_tokens"
REQUEST_PARAMS_N = "vllm:request_params_n"
REQUEST_PARAMS_MAX_TOKENS = "vllm:request_params_max_tokens"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_PREEMPTIONS = "vllm:request_num_preemptions"
PREFILL_KV_COMPUTED = "vllm:request_prefill_kv_computed_tokens"

# --- configuration (info gauge; carries no model_name label)
CACHE_CONFIG = "vllm:cache_config_info"

# --- KV offload connectors
SIMPLE_LOAD_BLOCKS = "vllm:simple_kv_offload_load_blocks"  # {phase=issued|completed}
SIMPLE_SAVE_OUTCOMES = "vllm:simple_kv_offload_save_outcomes"  # {outcome=stored|...}
SIMPLE_USED_BLOCKS = "vllm:simple_kv_offload_used_blocks"
SIMPLE_PENDING_STORE = "vllm:simple_kv_offload_pending_store_blocks"
SIMPLE_INFO = "vllm:simple_kv_offload_info"  # {capacity_blocks, lazy_offload, backend, ...}
MOONCAKE_TIME = "vllm:mooncake_store_operation_time_seconds"  # {operation, status}
MOONCAKE_OPS = "vllm:mooncake_store_operation"
MOONCAKE_BYTES = "vllm:mooncake_store_operation_bytes"
MOONCAKE_KEYS = "vllm:mooncake_store_operation_keys"
MOONCAKE_FAILED_KEYS = "vllm:mooncake_store_operation_failed_keys"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes"
OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes"
OFFLOAD_LEGACY_BYTES = "vllm:kv_offload_total_bytes"  # {transfer_type=CPU_to_GPU|GPU_to_CPU}

# Families whose absence means "this is not a vLLM-compatible /metrics".
CORE_FAMILIES = (PREFIX_QUERIES, PREFIX_HITS, KV_USAGE, RUNNING, WAITING, PREEMPTIONS,
                 PROMPT_TOKENS, GEN_TOKENS)


def total(family: str) -> str:
    """A counter family's sample name, as /metrics exposes it."""
    return family + "_total"


def int_label(labels: dict[str, str], key: str) -> int | None:
    """An integer label (`"16"`, `"16.0"`); None when absent or unset (vLLM writes "None")."""
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError):
        return None
