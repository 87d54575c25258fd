"""A request's record filled from what the client observed: the raw facts copied, the derived
fields computed by `metrics.definitions`, impossible token counts turned into a `bad_usage`
failure (`records.usage_problem`). The one place a record's measured fields are set; the
client (http.py) calls it when a request ends, the lane engine for a request cancelled before
it was sent. It lives in the client, above metrics, so that records stay data only."""
from __future__ import annotations

from ..metrics import definitions as d
from ..records import RequestRecord, usage_problem
from .facts import StreamFacts


def assemble(rec: RequestRecord, f: StreamFacts) -> None:
    """Fill `rec` from what the client observed: raw fields copied, metrics computed by
    metrics.definitions (also for failed and cancelled requests)."""
    rec.start_wall_ns, rec.start_ns, rec.end_ns = f.start_wall_ns, f.start_ns, f.end_ns
    rec.first_token_ns, rec.first_content_ns = f.first_chunk_ns, f.first_content_ns
    rec.chunk_offsets_ns, rec.chunk_tokens = f.chunk_offsets_ns, f.chunk_tokens
    rec.status, rec.error, rec.error_detail = f.status, f.error, f.error_detail
    rec.isl, rec.cached_tokens, rec.reasoning_tokens = f.isl, f.cached_tokens, f.reasoning_tokens
    rec.server_ttft_ms, rec.server_queue_ms = f.server_ttft_ms, f.server_queue_ms
    rec.spec_accepted, rec.spec_steps = f.spec_accepted, f.spec_steps
    rec.finish_reason, rec.retry_after_s = f.finish_reason, f.retry_after_s
    rec.ok = f.error is None and f.status == 200
    rec.osl_counted = sum(f.chunk_tokens)
    rec.osl = d.output_tokens(f.osl, f.chunk_tokens)
    bad = usage_problem(rec.isl, rec.osl, rec.cached_tokens, rec.osl_counted,
                        rec.isl_intended, rec.osl_intended)
    if bad:  # the server's numbers are not kept as facts (a lane would grow its history by them)
        rec.isl = rec.osl = rec.cached_tokens = None
        if rec.ok:
            rec.ok, rec.error, rec.error_detail = False, "bad_usage", bad
    rec.ttft_ms = d.ttft_ms(f.start_ns, f.first_chunk_ns)
    rec.ttfc_ms = d.ttfc_ms(f.start_ns, f.first_content_ns)
    rec.e2e_ms = d.e2e_ms(f.start_ns, f.end_ns, f.last_chunk_ns, rec.ok)
    rec.tpot_ms = d.tpot_ms(rec.e2e_ms, rec.ttft_ms, rec.osl) if rec.ok else None
    rec.dispatch_lag_ms = d.dispatch_lag_ms(rec.intended_send_ns, f.start_ns)


