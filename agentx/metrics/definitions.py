"""Every metric agentx reports, defined once as a pure function over raw facts (monotonic ns
timestamps and token counts); its declaration (key, label, unit, direction, SLO key, where it
is shown) is its entry in `metrics.catalog`. The client only records facts
(agentx.client.facts); `client.assemble` computes the per-request fields with these functions
and the catalog's entries read them, or derive theirs, from a record. docs/metrics.md states
the same definitions for users.

vLLM's definitions are those of its benchmark client, `vllm bench serve`:
vllm/benchmarks/lib/endpoint_request_func.py (async_request_openai_chat_completions: TTFT at
the first SSE event with non-empty `choices`, ITL between later such events, latency at the
last one) and vllm/benchmarks/serve.py (calculate_metrics: TPOT = (latency - TTFT) /
(output_tokens - 1) for output_tokens > 1, output_tokens = usage.completion_tokens).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

VLLM_CLIENT = "vllm/benchmarks/lib/endpoint_request_func.py"
VLLM_SERVE = "vllm/benchmarks/serve.py (calculate_metrics)"


def _ms(a_ns: int, b_ns: int) -> float:
    return (b_ns - a_ns) / 1e6


# -- per request --------------------------------------------------------------------------------
def ttft_ms(start_ns: int, first_chunk_ns: int) -> float | None:
    """Send -> first event with non-empty `choices` (vLLM). On vLLM that is the role chunk,
    written in the same engine step as the first token; reasoning tokens count as tokens.
    Send = the write on a connection in hand (a new connection's handshake is dispatch lag)."""
    return _ms(start_ns, first_chunk_ns) if first_chunk_ns else None


def ttfc_ms(start_ns: int, first_content_ns: int) -> float | None:
    """Send -> first non-reasoning content: the first token a user sees as the answer."""
    return _ms(start_ns, first_content_ns) if first_content_ns else None


def e2e_ms(start_ns: int, end_ns: int, last_chunk_ns: int = 0, ok: bool = False) -> float | None:
    """Send -> last event with non-empty `choices` for a completed request (vLLM's latency);
    send -> the moment the client gave up for a failed or cancelled one."""
    if not start_ns:
        return None
    return _ms(start_ns, last_chunk_ns if ok and last_chunk_ns else end_ns)


def output_tokens(usage_completion_tokens: int | None, chunk_tokens: Sequence[int]) -> int | None:
    """usage.completion_tokens (vLLM); the tokens counted from the chunks when the server
    sends no usage (None when there were none)."""
    if usage_completion_tokens is not None:
        return usage_completion_tokens
    return sum(chunk_tokens) or None


def tpot_ms(e2e: float | None, ttft: float | None, n_out: int | None) -> float | None:
    """(E2E - TTFT) / (output tokens - 1) (vLLM); undefined for one output token or none."""
    if e2e is None or ttft is None or not n_out or n_out <= 1:
        return None
    return (e2e - ttft) / (n_out - 1)


def interactivity_tok_s(tpot: float | None) -> float | None:
    """Tokens per second one user sees: 1000 / TPOT (ms)."""
    return 1000.0 / tpot if tpot else None


def ttft_per_1k_uncached_ms(ttft: float | None, isl: int | None,
                            cached: int | None) -> float | None:
    """TTFT per 1,000 prompt tokens the server had to prefill (prompt - cached): a TTFT that
    compares requests whose prompts and cache hits differ (an agentic turn of 40k tokens with
    39k cached prefills 1k). AIPerf's prefill throughput is ISL / TTFT, all prompt tokens
    counted; this counts only the uncached ones, and reads as a time. Undefined when the server
    reports no cached tokens (vLLM without --enable-prompt-tokens-details) or nothing was left
    to prefill (a full hit: TTFT is then a decode step, not a prefill)."""
    if ttft is None or isl is None or cached is None or isl <= cached:
        return None
    return ttft / ((isl - cached) / 1000.0)


def prompt_tokens(r: Mapping) -> int:
    """A record's prompt tokens: the server's count, else the intended one (a server that
    sent no usage)."""
    return r["isl"] if r.get("isl") is not None else r.get("isl_intended") or 0


def dispatch_lag_ms(intended_send_ns: int, start_ns: int) -> float | None:
    """Send - intended send: how late the client itself was. The intended send is when the
    trace says the request is due: the previous response's end plus the (scaled, capped)
    think time; a session's first request, the previous session's end or the lane's start.
    Building the request runs before that instant where it can (engine/lanes.py), so this
    counts the build only when it did not fit."""
    if not intended_send_ns or not start_ns:
        return None
    return max(0, start_ns - intended_send_ns) / 1e6


# -- per gap (pooled over requests) -------------------------------------------------------------
def chunk_itls_ms(offsets_ns: Sequence[int]) -> list[float]:
    """Gaps between consecutive token chunks' arrivals. vLLM's ITL list also holds the gap from
    its role chunk to the first token chunk (~0, same engine step); ours starts at the first
    token chunk."""
    return [(offsets_ns[i] - offsets_ns[i - 1]) / 1e6 for i in range(1, len(offsets_ns))]


def token_itls_ms(offsets_ns: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """Per-token ITL: each chunk gap split evenly over the k tokens the later chunk carried,
    counted k times (a chunk without a token counts once). Under speculative decoding one chunk
    carries several tokens, so this is the per-token time a user sees; its mean over a request
    is TPOT when the first chunk carries one token."""
    out: list[float] = []
    for i in range(1, len(offsets_ns)):
        k = max(1, tokens[i])
        out.extend([(offsets_ns[i] - offsets_ns[i - 1]) / 1e6 / k] * k)
    return out


# -- speculative decoding -----------------------------------------------------------------------
VLLM_SPEC = "vllm/v1/spec_decode/metrics.py"


def acceptance_length(accepted: float | None, drafts: float | None) -> float | None:
    """Mean acceptance length AL = 1 + accepted draft tokens / drafts, a draft being one verify
    step that proposed tokens; the 1 is the bonus token every step emits (vLLM's "Mean
    acceptance length"; from /metrics deltas it is how InferenceX calibrates golden ALs)."""
    if accepted is None or not drafts:
        return None
    return 1.0 + accepted / drafts


def position_acceptance(accepted_at: Sequence[float], drafts: float | None) -> list[float] | None:
    """Per-position acceptance rate: accepted tokens at draft position i / drafts, i.e. the
    unconditional probability that the first i+1 drafts of a step are all accepted."""
    if not drafts or not accepted_at:
        return None
    return [a / drafts for a in accepted_at]


def chunk_spec_counts(chunk_tokens: Sequence[int]) -> tuple[int, int]:
    """(accepted, steps) of one streamed request seen from its chunks: every chunk after the
    first is one decode step carrying 1 + its accepted drafts (the first is the prefill's
    token). An approximation of the server's counts: a step without a draft (ngram found no
    match) counts as a step, and the last step's tokens may be cut by max_tokens."""
    decode = [max(1, k) for k in chunk_tokens[1:]]
    return sum(decode) - len(decode), len(decode)
