"""Prometheus parsing, server-metric deltas and the scraper, against real vLLM /metrics.

Expected figures are re-derived in the test from the sample texts with a small
regex reader that shares no code with prometheus_client or agentx.
"""
from __future__ import annotations

import asyncio
import math
import pickle
import re

import aiohttp
import pytest
from aiohttp import web

from agentx.scrape import server_metrics as sm
from agentx.scrape.process import ScraperProcess
from agentx.scrape.prom import counter_delta, parse_metrics
from agentx.scrape.scraper import MetricsScraper, metrics_url
from conftest import SAMPLES

BEFORE = (SAMPLES / "metrics_before.txt").read_text()
AFTER = (SAMPLES / "metrics_after.txt").read_text()

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def grep(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Independent reader: every sample line as (name, labels, value)."""
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"unreadable sample line: {line!r}"
        rows.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return rows


def gsum(text: str, name: str, **flt: str) -> float:
    rows = [v for n, lb, v in grep(text) if n == name and all(lb.get(k) == w for k, w in flt.items())]
    assert rows, f"{name} {flt} not in sample"
    return sum(rows)


def gdelta(name: str, **flt: str) -> float:
    return gsum(AFTER, name, **flt) - gsum(BEFORE, name, **flt)


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("text", [BEFORE, AFTER], ids=["before", "after"])
def test_parse_keeps_every_sample_but_created(text: str) -> None:
    snap = parse_metrics(text, t=0.0)
    expected = {(n, frozenset(lb.items())): v for n, lb, v in grep(text) if not n.endswith("_created")}
    assert len(snap.samples) == len(expected)
    for key, value in expected.items():
        got = snap.samples[key]
        assert got == value or (math.isnan(got) and math.isnan(value)), key
    assert not any(n.endswith("_created") for n, _ in snap.samples)
    assert not any(f.endswith("_created") for f in snap.family_names())


def test_counter_families_strip_total_but_samples_keep_it() -> None:
    snap = parse_metrics(AFTER)
    assert "vllm:prefix_cache_hits" in snap.family_names()
    assert snap.has("vllm:prefix_cache_hits_total")
    assert not snap.has("vllm:prefix_cache_hits")
    assert snap.has_family("vllm:prefix_cache_hits") and snap.has_family("vllm:prefix_cache_hits_total")
    # a histogram whose own name ends in _total keeps it
    assert "vllm:iteration_tokens_total" in snap.family_names()
    assert snap.sum("vllm:iteration_tokens_total_count") == gsum(AFTER, "vllm:iteration_tokens_total_count")


def test_sum_filters_and_absence() -> None:
    snap = parse_metrics(AFTER)
    hits = gsum(AFTER, "vllm:prefix_cache_hits_total")
    assert snap.sum("vllm:prefix_cache_hits_total") == hits
    assert snap.sum("vllm:prefix_cache_hits_total", model_name="tiny") == hits
    assert snap.sum("vllm:prefix_cache_hits_total", model_name="no-such-model") is None
    assert snap.sum("vllm:no_such_metric_total") is None
    assert snap.by_label(sm.SPEC_PER_POS, "position") == {
        lb["position"]: v for n, lb, v in grep(AFTER) if n == sm.SPEC_PER_POS}


def test_histogram_samples() -> None:
    snap = parse_metrics(AFTER)
    name = "vllm:time_to_first_token_seconds"
    buckets = [(lb["le"], v) for n, lb, v in grep(AFTER) if n == name + "_bucket"]
    assert buckets and len(snap.select(name + "_bucket")) == len(buckets)
    inf = dict(buckets)["+Inf"]
    assert snap.sum(name + "_bucket", le="+Inf") == inf == snap.sum(name + "_count")
    assert snap.sum(name + "_sum") == gsum(AFTER, name + "_sum")


def test_parse_rejects_junk() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:x{engine=\"0\" 1.0\n")


# ---------------------------------------------------------------- deltas

@pytest.fixture(scope="module")
def metrics() -> dict:
    return sm.compute(parse_metrics(BEFORE, t=100.0), parse_metrics(AFTER, t=160.0), [])


def test_deltas_match_hand_computed(metrics: dict) -> None:
    assert metrics["available"] and metrics["window"]["complete"]
    assert metrics["window"]["duration_s"] == 60.0
    hits, queries = gdelta(sm.PREFIX_HITS), gdelta(sm.PREFIX_QUERIES)
    assert metrics["prefix_cache"]["hits"] == hits
    assert metrics["prefix_cache"]["queries"] == queries
    assert metrics["prefix_cache"]["hit_rate"] == pytest.approx(hits / queries)
    assert metrics["prompt_tokens"] == gdelta(sm.PROMPT_TOKENS)
    assert metrics["generation_tokens"] == gdelta(sm.GEN_TOKENS)
    assert metrics["rates"]["generation_tokens_per_s"] == pytest.approx(gdelta(sm.GEN_TOKENS) / 60.0)
    assert metrics["preemptions"] == gdelta(sm.PREEMPTIONS)
    assert metrics["prompt_tokens_cached"] == gdelta(sm.PROMPT_CACHED)
    # external queries did not move in the sample: rate undefined, not 0
    assert metrics["external_cache"]["queries"] == gdelta(sm.EXT_QUERIES) == 0
    assert metrics["external_cache"]["hit_rate"] is None


def test_tokens_by_source(metrics: dict) -> None:
    sources = {lb["source"] for n, lb, _ in grep(AFTER) if n == sm.CACHED_BY_SOURCE}
    assert metrics["tokens_by_source_origin"] == sm.CACHED_BY_SOURCE
    assert metrics["tokens_by_source"] == {s: gdelta(sm.CACHED_BY_SOURCE, source=s) for s in sources}
    # the device share equals the prefix-cache hits in this sample (no connector)
    assert metrics["tokens_by_source"]["device"] == metrics["prefix_cache"]["hits"]


def test_tokens_by_source_derived_without_source_family() -> None:
    def strip(text: str) -> str:
        return "\n".join(ln for ln in text.splitlines()
                         if "prompt_tokens_cached_by_source" not in ln) + "\n"
    out = sm.compute(parse_metrics(strip(BEFORE), t=0), parse_metrics(strip(AFTER), t=1))
    assert out["tokens_by_source_origin"] == "derived"
    assert out["tokens_by_source"] == {"device": gdelta(sm.PREFIX_HITS), "external": gdelta(sm.EXT_HITS)}


def test_spec_decode_from_ngram_counters(metrics: dict) -> None:
    drafts, accepted = gdelta(sm.SPEC_DRAFTS), gdelta(sm.SPEC_ACCEPTED)
    assert drafts > 0  # the sample server ran ngram speculation
    spec = metrics["spec_decode"]
    assert spec["num_drafts"] == drafts
    assert spec["acceptance_length"] == pytest.approx(1 + accepted / drafts)
    positions = sorted({lb["position"] for n, lb, _ in grep(AFTER) if n == sm.SPEC_PER_POS}, key=int)
    assert spec["per_position"] == pytest.approx(
        [gdelta(sm.SPEC_PER_POS, position=p) / drafts for p in positions])
    # per-position acceptances add up to the accepted total
    assert sum(spec["accepted_per_position"]) == accepted
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / gdelta(sm.SPEC_DRAFT_TOKENS))


def test_kv_pool_from_cache_config_info(metrics: dict) -> None:
    (lb,) = [lb for n, lb, _ in grep(AFTER) if n == sm.CACHE_CONFIG]
    pool = int(lb["num_gpu_blocks"]) * int(lb["block_size"])
    assert metrics["kv_pool_tokens"] == pool
    assert metrics["kv_block_size"] == int(lb["block_size"])
    assert pool == int(lb["kv_cache_size_tokens"])  # vLLM's own figure agrees


def test_gauges_and_histogram_means(metrics: dict) -> None:
    assert metrics["kv_cache"]["usage_max"] == max(gsum(BEFORE, sm.KV_USAGE), gsum(AFTER, sm.KV_USAGE))
    assert metrics["running"]["samples"] == 2
    ttft = "vllm:time_to_first_token_seconds"
    assert metrics["server_latency_mean"]["ttft_s"] == pytest.approx(
        gdelta(ttft + "_sum") / gdelta(ttft + "_count"))
    assert metrics["requests_by_finish_reason"]["length"] == gdelta(sm.REQUEST_SUCCESS, finished_reason="length")
    for fam in sm.CORE_FAMILIES:
        assert fam in metrics["metric_families_present"]
    assert not any(f.startswith(("python_", "process_")) for f in metrics["metric_families_present"])


def test_offload_flat_without_connector(metrics: dict) -> None:
    off = metrics["offload"]
    assert off["hits_observed"] is False
    assert off["loads"]["external_prefix_cache_hits"] == 0
    assert off["loads"]["simple_kv_offload_blocks_loaded"] is None  # not exposed by this server


def _with_copy(text: str, old: str, new: str, factor: float) -> str:
    """Sample text plus, after each vllm: line carrying label ``old``, a copy
    relabelled ``new`` with its value × factor (a second engine or model)."""
    out = []
    for line in text.splitlines():
        out.append(line)
        m = _LINE.match(line) if line.startswith("vllm:") else None
        if m and old in line and not line.startswith(sm.CACHE_CONFIG):
            out.append(line[: m.start(3)].replace(old, new) + repr(float(m.group(3)) * factor))
    return "\n".join(out) + "\n"


def test_several_engines_are_summed() -> None:
    before = _with_copy(BEFORE, 'engine="0"', 'engine="1"', 2.0)
    after = _with_copy(AFTER, 'engine="0"', 'engine="1"', 2.0)
    out = sm.compute(parse_metrics(before, t=0), parse_metrics(after, t=1))

    def delta(name: str, **flt: str) -> float:
        return gsum(after, name, **flt) - gsum(before, name, **flt)

    assert out["prefix_cache"]["hits"] == delta(sm.PREFIX_HITS) == 3 * gdelta(sm.PREFIX_HITS)
    assert out["spec_decode"]["acceptance_length"] == pytest.approx(
        1 + delta(sm.SPEC_ACCEPTED) / delta(sm.SPEC_DRAFTS))
    assert out["running"]["max"] == max(gsum(before, sm.RUNNING), gsum(after, sm.RUNNING))


def test_model_name_filter() -> None:
    before = _with_copy(BEFORE, 'model_name="tiny"', 'model_name="other"', 5.0)
    after = _with_copy(AFTER, 'model_name="tiny"', 'model_name="other"', 5.0)
    snaps = parse_metrics(before, t=0), parse_metrics(after, t=1)
    tiny = sm.compute(*snaps, model_name="tiny")
    both = sm.compute(*snaps)
    assert tiny["prefix_cache"]["hits"] == gdelta(sm.PREFIX_HITS)
    assert both["prefix_cache"]["hits"] == gsum(after, sm.PREFIX_HITS) - gsum(before, sm.PREFIX_HITS)
    assert both["prefix_cache"]["hits"] == 6 * gdelta(sm.PREFIX_HITS)
    assert tiny["kv_pool_tokens"] == both["kv_pool_tokens"]  # cache_config_info has no model label


def test_counter_reset_across_series() -> None:
    """Server restart mid-run: before→after, restart (before values), →after again."""
    snaps = [parse_metrics(t, t=float(i)) for i, t in enumerate([BEFORE, AFTER, BEFORE, AFTER])]
    out = sm.compute(snaps[0], snaps[-1], snaps[1:-1])
    restart_value = gsum(BEFORE, sm.PREFIX_HITS)  # what the restarted counter already shows
    assert out["prefix_cache"]["hits"] == 2 * gdelta(sm.PREFIX_HITS) + restart_value
    assert out["window"]["counter_resets"] >= 1
    assert out["window"]["n_scrapes"] == 4


def test_truncated_page_mid_series_is_not_a_reset() -> None:
    snaps = [parse_metrics(BEFORE, t=0), parse_metrics("", t=1), parse_metrics(AFTER, t=2)]
    assert counter_delta(snaps, sm.PREFIX_HITS) == gdelta(sm.PREFIX_HITS)


def test_lazily_created_label_set_counts_from_zero() -> None:
    head = "# HELP c_total c\n# TYPE c_total counter\n"
    a = parse_metrics(head + 'c_total{k="x"} 5.0\n', t=0)
    b = parse_metrics(head + 'c_total{k="x"} 7.0\nc_total{k="y"} 4.0\n', t=1)
    assert counter_delta([a, b], "c_total") == (7.0 - 5.0) + 4.0
    empty = parse_metrics(head, t=0)  # declared, no children yet
    assert counter_delta([empty, empty], "c_total") == 0.0
    assert counter_delta([empty, empty], "absent_total") is None


def test_gauge_mean_is_time_weighted() -> None:
    def gauge(v: float, t: float):
        text = f'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine="0"}} {v}\n'
        return parse_metrics(text, t=t)
    pts = [(0.0, 0.0), (1.0, 1.0), (3.0, 1.0)]
    snaps = [gauge(v, t) for t, v in pts]
    out = sm.compute(snaps[0], snaps[-1], snaps[1:-1])
    area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:]))
    assert out["kv_cache"]["usage_mean"] == pytest.approx(area / (pts[-1][0] - pts[0][0]))
    assert out["kv_cache"]["usage_mean"] != pytest.approx(sum(v for _, v in pts) / len(pts))
    assert out["kv_cache"]["usage_max"] == 1.0


def test_offload_connector_signals() -> None:
    head = ("# TYPE vllm:simple_kv_offload_load_blocks_total counter\n"
            "# TYPE vllm:mooncake_store_operation_keys_total counter\n")
    def page(loaded: float, keys: float) -> str:
        return (head + f'vllm:simple_kv_offload_load_blocks_total{{engine="0",phase="completed"}} {loaded}\n'
                f'vllm:simple_kv_offload_load_blocks_total{{engine="0",phase="issued"}} {loaded + 3}\n'
                f'vllm:mooncake_store_operation_keys_total{{engine="0",operation="load_get",status="ok"}} {keys}\n')
    out = sm.compute(parse_metrics(page(2, 0), t=0), parse_metrics(page(9, 0), t=1))
    assert out["offload"]["loads"]["simple_kv_offload_blocks_loaded"] == 9 - 2
    assert out["offload"]["loads"]["mooncake_keys_loaded"] == 0
    assert out["offload"]["hits_observed"] is True
    flat = sm.compute(parse_metrics(page(2, 0), t=0), parse_metrics(page(2, 0), t=1))
    assert flat["offload"]["hits_observed"] is False


def test_compute_without_any_scrape() -> None:
    out = sm.compute(None, None, [])
    assert out["available"] is False
    assert out["prefix_cache"]["hit_rate"] is None and out["kv_pool_tokens"] is None


def test_missing_end_scrape_uses_series_and_flags_window() -> None:
    before, after = parse_metrics(BEFORE, t=0), parse_metrics(AFTER, t=5)
    out = sm.compute(before, None, [before, after])
    assert out["window"]["complete"] is False
    assert out["prefix_cache"]["hits"] == gdelta(sm.PREFIX_HITS)


# ---------------------------------------------------------------- scraper

class FakeMetricsServer:
    """Serves the sample texts on 127.0.0.1; ``phase`` picks the response."""

    def __init__(self) -> None:
        self.phase = "before"
        self.hits = 0
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.phase == "error":
            return web.Response(status=500, text="engine dead")
        if self.phase == "junk":
            return web.Response(text='vllm:x{engine="0" 1\n')
        body = BEFORE if self.phase == "before" else AFTER
        return web.Response(text=body, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


@pytest.fixture
async def server():
    srv = FakeMetricsServer()
    await srv.start()
    yield srv
    if srv.runner is not None:
        await srv.stop()


async def test_scraper_start_stop_matches_direct_compute(server: FakeMetricsServer) -> None:
    async with aiohttp.ClientSession() as session:
        scr = MetricsScraper(session, server.url, interval_s=60.0)
        await scr.start()
        server.phase = "after"
        await scr.stop()
    assert scr.available and scr.first is not None and scr.last is not None
    assert scr.errors == [] and len(scr.series) == 2
    out = scr.compute()
    direct = sm.compute(parse_metrics(BEFORE, t=0), parse_metrics(AFTER, t=1))
    for path in [("prefix_cache", "hits"), ("spec_decode", "acceptance_length"), ("kv_pool_tokens",)]:
        a, b = out, direct
        for k in path:
            a, b = a[k], b[k]
        assert a == b, path
    assert out["window"]["complete"] is True
    assert out["scrape"]["errors"] == 0


async def test_scraper_survives_500_junk_and_refused(server: FakeMetricsServer) -> None:
    scr = MetricsScraper(None, f"http://127.0.0.1:{server.port}", interval_s=0.05)
    assert scr.url == server.url  # base URL gets /metrics
    await scr.start()
    server.phase = "error"
    await _wait_for(lambda: scr.n_errors >= 2)
    server.phase = "junk"
    await _wait_for(lambda: scr.n_errors >= 4)
    server.phase = "after"
    await _wait_for(lambda: len(scr.series) >= 3)
    await server.stop()
    server.runner = None
    await _wait_for(lambda: any("Connect" in e["error"] for e in scr.errors))
    await scr.stop()  # final scrape refused: recorded, not raised
    assert scr.first is not None and scr.last is None
    kinds = " ".join(e["error"] for e in scr.errors)
    assert "HTTP 500" in kinds and "ValueError" in kinds
    out = scr.compute()
    assert out["window"]["complete"] is False
    # the series still bounds the run: last good scrape served the after text
    assert out["prefix_cache"]["hits"] == gdelta(sm.PREFIX_HITS)
    assert scr._session is None  # owned session closed


async def test_scraper_unreachable_from_start() -> None:
    srv = FakeMetricsServer()
    await srv.start()
    url = srv.url
    await srv.stop()
    async with aiohttp.ClientSession() as session:
        scr = MetricsScraper(session, url, interval_s=0.05, timeout_s=2.0)
        await scr.start()
        await asyncio.sleep(0.2)
        await scr.stop()
    assert scr.available is False and scr.first is None and scr.last is None
    assert scr.n_errors >= 3
    out = scr.compute()
    assert out["available"] is False
    assert scr.series_json() == []


async def test_series_json(server: FakeMetricsServer) -> None:
    async with aiohttp.ClientSession() as session:
        scr = MetricsScraper(session, server.url, interval_s=0.05)
        await scr.start()
        await _wait_for(lambda: len(scr.series) >= 2)
        server.phase = "after"
        await scr.stop()
    rows = scr.series_json()
    assert len(rows) == len(scr.series) >= 3
    assert rows[0]["t"] == 0 and all(a["t"] <= b["t"] for a, b in zip(rows, rows[1:]))
    assert rows[0]["prefix_hits"] == gsum(BEFORE, sm.PREFIX_HITS)
    assert rows[-1]["prefix_hits"] == gsum(AFTER, sm.PREFIX_HITS)
    assert rows[-1]["kv_usage"] == gsum(AFTER, sm.KV_USAGE)
    picked = scr.series_json(keys=["running", "vllm:generation_tokens_total"])
    assert set(picked[-1]) == {"t", "wall", "running", "vllm:generation_tokens_total"}
    assert picked[-1]["vllm:generation_tokens_total"] == gsum(AFTER, sm.GEN_TOKENS)
    # buckets are dropped from the kept series, kept in first/last
    assert not any(n.endswith("_bucket") for n, _ in scr.series[-1].samples)
    assert scr.last is not None and scr.last.has("vllm:time_to_first_token_seconds_bucket")


def test_metrics_url() -> None:
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/metrics") == "http://127.0.0.1:8000/metrics"


async def _wait_for(cond, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def test_scraper_process_matches_the_scraper_and_keeps_no_secret(
        server: FakeMetricsServer, tmp_path) -> None:
    """`agentx run` scrapes from a child process (none of the parsing holds the client's
    GIL): the baseline scrape is there after start, the final one after stop, each scrape
    is a line of metrics.jsonl, and the scraper sent back carries no header (an API key)."""
    out = tmp_path / "metrics.jsonl"
    scr = ScraperProcess(server.url, interval_s=0.2, headers={"Authorization": "Bearer s3cret"},
                         out_path=out)
    await scr.start()
    assert scr.first is not None
    server.phase = "after"
    await asyncio.sleep(0.5)
    await scr.stop()
    res = scr.compute()
    direct = sm.compute(parse_metrics(BEFORE, t=0), parse_metrics(AFTER, t=1))
    assert res["prefix_cache"]["hits"] == direct["prefix_cache"]["hits"]
    assert res["scrape"]["attempts"] >= 3 and res["scrape"]["errors"] == 0
    assert len(out.read_bytes().splitlines()) == len(scr.scraper.series) >= 3
    assert scr.scraper.headers == {} and b"s3cret" not in pickle.dumps(scr.scraper)


async def test_scraper_process_against_nothing_reports_errors(tmp_path) -> None:
    scr = ScraperProcess("http://127.0.0.1:9/metrics", interval_s=0.1, timeout_s=1.0)
    await scr.start()
    await scr.stop()
    assert scr.first is None
    assert scr.compute()["scrape"]["errors"] >= 2
