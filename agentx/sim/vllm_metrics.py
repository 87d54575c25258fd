"""Engine statistics exported on /metrics with vLLM's names, label set and bucket boundaries.

Rendered by prometheus_client from a private registry per simulator (so several embedded
simulators can live in one process), which yields the same text as vLLM: counters as
`<name>_total` plus a `<name>_created` gauge, histograms with `_bucket{le=...}`/`_count`/`_sum`,
labels `engine` and `model_name`. Families and buckets follow a real vLLM 0.32 scrape
(tests/data/vllm-samples/metrics_after.txt). Names come from agentx.vllm_names (the reader's
too); a KV connector's own families are its class's (agentx.offload), see docs/simulator.md
§Metrics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from .. import vllm_names as vn
from ..offload import connector

if TYPE_CHECKING:
    from .request import SimRequest

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
PREEMPT_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
N_BUCKETS = [1, 2, 5, 10, 20]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
CACHE_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


def buckets_125(max_value: int) -> list[float]:
    """vLLM's 1-2-5 series up to max_value (token-count histograms, bounded by max_model_len)."""
    out, e = [], 1
    while True:
        for m in (1, 2, 5):
            v = m * e
            if v > max_value:
                return [float(x) for x in out]
            out.append(v)
        e *= 10


def iteration_buckets(max_batched: int) -> list[float]:
    out, v = [1.0], 8
    top = max(16384, max_batched)
    while v <= top:
        out.append(float(v))
        v *= 2
    return out


class EngineStats:
    def __init__(self, *, model: str, engine: str = "0", max_model_len: int, max_batched: int,
                 spec_k: int = 0, offload: str = "none") -> None:
        self.registry = r = CollectorRegistry()
        process_collector.ProcessCollector(registry=r)
        platform_collector.PlatformCollector(registry=r)
        gc_collector.GCCollector(registry=r)
        L = ["engine", "model_name"]
        lv = {"engine": engine, "model_name": model}
        self.labels = lv
        self.offload = offload
        self.k = spec_k

        def counter(name: str, doc: str):
            return Counter(name, doc, L, registry=r).labels(**lv)

        def gauge(name: str, doc: str):
            return Gauge(name, doc, L, registry=r).labels(**lv)

        def hist(name: str, doc: str, buckets):
            return Histogram(name, doc, L, buckets=buckets, registry=r).labels(**lv)

        # speculative decoding (vLLM registers these only with a speculative config)
        if spec_k:
            self.c_drafts = counter(vn.SPEC_DRAFTS, "Number of spec decoding drafts.")
            self.c_draft_tokens = counter(vn.SPEC_DRAFT_TOKENS, "Number of draft tokens.")
            self.c_accepted = counter(vn.SPEC_ACCEPTED, "Number of accepted tokens.")
            per_pos = Counter(vn.SPEC_PER_POS, "Accepted tokens per draft position.",
                              L + ["position"], registry=r)
            self.c_per_pos = [per_pos.labels(position=str(i), **lv) for i in range(spec_k)]
        self.c_flops = counter(vn.FLOPS,
                               "Estimated number of floating point operations per GPU (for Model Flops "
                               "Utilization calculations).")
        self.c_read = counter(vn.READ_BYTES,
                              "Estimated number of bytes read from memory per GPU (for Model Flops "
                              "Utilization calculations).")
        self.c_write = counter(vn.WRITE_BYTES,
                               "Estimated number of bytes written to memory per GPU (for Model Flops "
                               "Utilization calculations).")
        self.g_running = gauge(vn.RUNNING, "Number of requests in model execution batches.")
        self.g_waiting = gauge(vn.WAITING, "Number of requests waiting to be processed.")
        by_reason = Gauge(vn.WAITING_BY_REASON, "Number of waiting requests by reason.",
                          L + ["reason"], registry=r)
        self.g_wait_capacity = by_reason.labels(reason="capacity", **lv)
        self.g_wait_deferred = by_reason.labels(reason="deferred", **lv)
        sleep = Gauge(vn.SLEEP_STATE, "Engine sleep state; awake = 1 means engine is awake.",
                      L + ["sleep_state"], registry=r)
        for st, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(sleep_state=st, **lv).set(v)
        self.g_kv = gauge(vn.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.")
        self.c_pc_queries = counter(vn.PREFIX_QUERIES,
                                    "Prefix cache queries, in terms of number of queried tokens.")
        self.c_pc_hits = counter(vn.PREFIX_HITS, "Prefix cache hits, in terms of number of cached tokens.")
        self.c_ext_queries = counter(vn.EXT_QUERIES,
                                     "External prefix cache queries from KV connector cross-instance cache "
                                     "sharing, in terms of number of queried tokens.")
        self.c_ext_hits = counter(vn.EXT_HITS,
                                  "External prefix cache hits from KV connector cross-instance cache sharing, "
                                  "in terms of number of cached tokens.")
        counter(vn.MM_QUERIES, "Multi-modal cache queries, in terms of number of queried items.")
        counter(vn.MM_HITS, "Multi-modal cache hits, in terms of number of cached items.")
        self.c_preempt = counter(vn.PREEMPTIONS, "Cumulative number of preemption from the engine.")
        self.c_prompt = counter(vn.PROMPT_TOKENS, "Number of prefill tokens processed.")
        by_src = Counter(vn.PROMPT_BY_SOURCE, "Number of prompt tokens by source.", L + ["source"],
                         registry=r)
        self.c_src_compute = by_src.labels(source="local_compute", **lv)
        self.c_src_hit = by_src.labels(source="local_cache_hit", **lv)
        self.c_src_ext = by_src.labels(source="external_kv_transfer", **lv)
        self.c_cached = counter(vn.PROMPT_CACHED, "Number of cached prompt tokens (local + external).")
        cached_src = Counter(vn.CACHED_BY_SOURCE,
                             "Prefix-cache hit tokens by the cache tier that supplied them.", L + ["source"],
                             registry=r)
        self.c_cached_src = {s: cached_src.labels(source=s, **lv) for s in CACHE_SOURCES}
        self.c_gen = counter(vn.GEN_TOKENS, "Number of generation tokens processed.")
        success = Counter(vn.REQUEST_SUCCESS, "Count of successfully processed requests.",
                          ["engine", "finished_reason", "model_name"], registry=r)
        self.c_success = {f: success.labels(finished_reason=f, **lv) for f in FINISH_REASONS}
        adm = Counter(vn.ADMISSION_REJECTIONS, "Number of admission attempts rejected by a queue limit, "
                      "by reason.", ["model_name", "reason"], registry=r)
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            adm.labels(model_name=model, reason=reason)
        tok_b = buckets_125(max_model_len)
        self.h_prompt = hist(vn.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", tok_b)
        self.h_gen = hist(vn.REQUEST_GEN_TOKENS, "Number of generation tokens processed.", tok_b)
        self.h_iter = hist(vn.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.",
                           iteration_buckets(max_batched))
        self.h_max_gen = hist(vn.REQUEST_MAX_GEN_TOKENS,
                              "Histogram of maximum number of requested generation tokens.", tok_b)
        self.h_n = hist(vn.REQUEST_PARAMS_N, "Histogram of the n request parameter.", N_BUCKETS)
        self.h_max_tokens = hist(vn.REQUEST_PARAMS_MAX_TOKENS,
                                 "Histogram of the max_tokens request parameter.", tok_b)
        self.h_ttft = hist(vn.TTFT, "Histogram of time to first token in seconds.",
                           TTFT_BUCKETS)
        self.h_itl = hist(vn.ITL, "Histogram of inter-token latency in seconds.",
                          ITL_BUCKETS)
        self.h_tpot = hist(vn.TPOT,
                           "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.h_e2e = hist(vn.E2E, "Histogram of e2e request latency in seconds.",
                          LATENCY_BUCKETS)
        self.h_queue = hist(vn.QUEUE_TIME,
                            "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS)
        self.h_infer = hist(vn.INFERENCE_TIME,
                            "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS)
        self.h_prefill = hist(vn.PREFILL_TIME,
                              "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS)
        self.h_decode = hist(vn.DECODE_TIME,
                             "Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS)
        self.h_preempt = hist(vn.REQUEST_PREEMPTIONS,
                              "Histogram of the number of times a request was preempted.", PREEMPT_BUCKETS)
        self.h_kv_computed = hist(vn.PREFILL_KV_COMPUTED,
                                  "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                  tok_b)
        self.info = Gauge(vn.CACHE_CONFIG, "Information of the LLMEngine CacheConfig", [], registry=r)
        self._info_labels: dict[str, str] = {}
        # waiting requests by async KV load stage: vLLM registers it with a KV connector that
        # loads (kv_transfer_config.is_kv_consumer, vllm/v1/metrics/loggers.py); set by the
        # scheduler (sim/sched.py `_count_waiting`)
        self.kv_fetch: dict[str, int] = dict.fromkeys(vn.KV_FETCH_STAGES, 0)
        self.g_kv_fetch = {}
        if connector(offload).enabled:
            fetch = Gauge(vn.KV_FETCH_BY_STAGE, "Number of waiting requests by async KV load stage.",
                          L + ["stage"], registry=r)
            self.g_kv_fetch = {st: fetch.labels(stage=st, **lv) for st in vn.KV_FETCH_STAGES}
        # the connector's own families (agentx.offload: `Connector.sim_metrics`)
        self.off = connector(offload).sim_metrics(r, L, lv)
        # the simulator's own health (not vLLM names): is the step loop keeping real time?
        self.c_sim_steps = Counter("agentx_sim_steps", "Engine steps simulated.", registry=r)
        self.c_sim_model = Counter("agentx_sim_model_seconds", "Modelled step time, after time_scale.",
                                   registry=r)
        self.c_sim_late = Counter("agentx_sim_late_seconds",
                                  "Wall time the step loop fell behind the modelled schedule.", registry=r)
        # plain state the engine updates; copied into gauges at scrape time
        self.num_running = 0
        self.num_waiting = 0  # waiting queue + holding KV blocks + loading (vLLM's gauge)
        self.num_deferred = 0  # of those, loading from the offload tier
        self.kv_usage = 0.0
        self.num_preemptions = 0
        self._iter_prompt = 0  # computed prompt tokens of the prefills that ended in this step
        self._preempt_seen = 0
        self.offload_used_blocks = 0

    # ------------------------------------------------------------ config info
    def set_cache_config(self, labels: dict[str, str]) -> None:
        """One `vllm:cache_config_info` line; its labels must include block_size and num_gpu_blocks."""
        # re-create the gauge with the label names of this config
        self.registry.unregister(self.info)
        self.info = Gauge(vn.CACHE_CONFIG, "Information of the LLMEngine CacheConfig",
                          sorted(labels), registry=self.registry)
        self.info.labels(**labels).set(1.0)

    def set_offload_info(self, capacity_blocks: int, lazy: bool) -> None:
        self.off.set_info(capacity_blocks, lazy)

    # ------------------------------------------------------------ engine hooks
    def on_scheduled(self, req: "SimRequest") -> None:
        # vLLM v1 (vllm/v1/metrics/stats.py `update_from_finished_request`): queued_time =
        # scheduled_ts - queued_ts, both engine-core events; the API server's time is not in it
        self.h_queue.observe((req.scheduled_ns - (req.queued_ns or req.arrival_ns)) / 1e9)

    def on_prefix_lookup(self, prompt: int, dev: int, host: int, connector: bool, keys_queried: int = 0) -> None:
        """At admission, as vLLM records its scheduler stats (vllm/v1/core/sched/scheduler.py
        `record_prefix_cache_stats` "at admission so unscheduled lookups are not counted"; the
        connector's stats after allocation; loggers.py feeds prompt_tokens_cached_by_source
        from both)."""
        self.c_pc_queries.inc(prompt)
        self.c_pc_hits.inc(dev)
        if connector:
            self.c_ext_queries.inc(prompt - dev)
            self.c_ext_hits.inc(host)
            self.off.on_lookup(keys_queried)
        self.c_cached_src["device"].inc(dev)
        self.c_cached_src["host"].inc(host)

    def on_first_token(self, req: "SimRequest") -> None:
        """When the request's prefill ends, as vLLM counts prompt tokens: the iteration that
        carries a request's first token adds its PrefillStats (taken at its first scheduling) to
        vllm:prompt_tokens, prompt_tokens_by_source and prompt_tokens_cached
        (vllm/v1/metrics/stats.py `IterationStats.update_from_output` with is_prefilling;
        loggers.py). A preempted request's re-prefill is not counted again. Its computed tokens
        also go into this step's vllm:iteration_tokens_total (see on_step)."""
        prompt, dev, host = req.prompt_len, req.cached_device, req.cached_host
        self.c_prompt.inc(prompt)
        self.c_src_compute.inc(prompt - dev - host)
        self.c_src_hit.inc(dev)
        self.c_src_ext.inc(host)
        self.c_cached.inc(dev + host)
        self._iter_prompt += prompt - dev - host

    def on_host_load(self, tokens: int, nbytes: float = 0.0, seconds: float = 0.0, blocks: int = 0) -> None:
        self.off.on_load(blocks, nbytes, seconds)

    def on_store(self, blocks: int, nbytes: float, seconds: float) -> None:
        self.off.on_store(blocks, nbytes, seconds)

    def on_drafts(self, k: int, accepted: int) -> None:
        self.c_drafts.inc()
        self.c_draft_tokens.inc(k)
        self.c_accepted.inc(accepted)
        pp = self.c_per_pos
        for i in range(accepted):
            pp[i].inc()

    def on_tokens(self, req: "SimRequest", n: int, now_ns: int) -> None:
        self.c_gen.inc(n)
        if req.last_token_ns:
            self.h_itl.observe((now_ns - req.last_token_ns) / 1e9)
        else:
            self.h_ttft.observe((now_ns - req.arrival_ns) / 1e9)

    def on_step(self, gen_tokens: int, flops: float = 0.0, read_bytes: float = 0.0, write_bytes: float = 0.0) -> None:
        """One engine step. vllm:iteration_tokens_total observes, per iteration, the generated
        tokens plus the computed prompt tokens of the requests whose prefill ended in it
        (vllm/v1/metrics/loggers.py: prompt_token_stats.computed + num_generation_tokens), not
        the tokens the step scheduled: a chunked prefill counts once, in its last chunk's step."""
        self.h_iter.observe(self._iter_prompt + gen_tokens)
        self._iter_prompt = 0
        if flops:
            self.c_flops.inc(flops)
            self.c_read.inc(read_bytes)
            self.c_write.inc(write_bytes)

    def on_finish(self, req: "SimRequest") -> None:
        f = req.finish or "abort"
        self.c_success[f if f in self.c_success else "abort"].inc()
        n = req.num_out
        first, last = req.first_token_ns, req.last_token_ns
        self.h_e2e.observe((last - req.arrival_ns) / 1e9)
        if n > 1:
            self.h_tpot.observe((last - first) / 1e9 / (n - 1))
        sched = req.scheduled_ns or req.arrival_ns
        self.h_infer.observe((last - sched) / 1e9)
        self.h_prefill.observe((first - sched) / 1e9)
        self.h_decode.observe((last - first) / 1e9)
        self.h_prompt.observe(req.prompt_len)
        self.h_gen.observe(n)
        self.h_max_gen.observe(req.max_tokens)
        self.h_n.observe(1)
        self.h_max_tokens.observe(req.max_tokens)
        self.h_preempt.observe(req.preemptions)
        # vLLM observes it when the request finishes: prompt tokens minus cached ones
        self.h_kv_computed.observe(req.prompt_len - req.cached_device - req.cached_host)

    def on_sim_step(self, modelled_s: float, late_s: float) -> None:
        self.c_sim_steps.inc()
        self.c_sim_model.inc(modelled_s)
        if late_s > 0:
            self.c_sim_late.inc(late_s)

    # ------------------------------------------------------------ rendering
    def render(self) -> bytes:
        self.g_running.set(self.num_running)
        self.g_waiting.set(self.num_waiting)
        self.g_wait_capacity.set(self.num_waiting - self.num_deferred)
        self.g_wait_deferred.set(self.num_deferred)
        for st, g in self.g_kv_fetch.items():
            g.set(self.kv_fetch[st])
        self.g_kv.set(self.kv_usage)
        self.off.before_render(self.offload_used_blocks)
        d = self.num_preemptions - self._preempt_seen
        if d:
            self.c_preempt.inc(d)
            self._preempt_seen = self.num_preemptions
        return generate_latest(self.registry)
