"""What the streaming client observed for one request: raw facts only, no derived metric.

The wire client (`wire.HTTPClient.stream`) stamps the start and the HTTP status, the stream
decoder (`sse.StreamDecoder`) the chunk arrivals, token counts and usage; `client.assemble`
turns these into a RequestRecord with the metrics of `metrics.definitions`. Timestamps are
monotonic ns (`time.perf_counter_ns`) except `start_wall_ns`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StreamFacts:
    start_wall_ns: int = 0
    start_ns: int = 0  # right before a connection was taken for the (last) attempt
    end_ns: int = 0  # when the client was done with the request (or gave up on it)
    status: int = 0  # HTTP status of the response head, 0 if none arrived
    first_chunk_ns: int = 0  # arrival of the first event with non-empty `choices`
    last_chunk_ns: int = 0  # arrival of the last event with non-empty `choices`
    first_content_ns: int = 0  # first event with non-reasoning content
    chunk_offsets_ns: list[int] = field(default_factory=list)  # token chunk arrival - start_ns
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each token chunk carried
    reasoning_tokens: int = 0
    isl: int | None = None  # usage.prompt_tokens
    osl: int | None = None  # usage.completion_tokens
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    server_ttft_ms: float | None = None  # the server's per-request `metrics`, when sent
    server_queue_ms: float | None = None
    spec_accepted: int | None = None  # metrics.speculative_decoding (vLLM
    spec_steps: int | None = None  # --per-request-spec-decode-metrics), when sent
    finish_reason: str | None = None
    error: str | None = None  # error class (see RequestRecord.error)
    error_detail: str | None = None
    error_body: bytes = b""  # start of a non-200 response's body
    retry_after_s: float | None = None  # a 429's or 503's Retry-After, in seconds
