"""Ramp-up, the auto warm-up and the steady-state flag, end to end against the embedded
simulator over real HTTP (records and summary.json as written, the console as printed).

Definitions under test (docs/metrics.md#measurement-window-and-steady-state):
- lane i's first request is dispatched i x ramp / conc after the run's start;
- with --warmup auto the warm-up ends at W, the instant the engine sees the last lane's first
  request end; a request is warm-up iff it is a lane's prime or was dispatched before W;
- --duration then counts from W; a run whose warm-up outlasts ramp-up + 5 x duration stops
  there and says steady_state false.
"""
from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from agentx.client.http import ClientConfig, make_session, stream_request
from agentx.config import RunConfig
from agentx.errors import InputError
from agentx.options import build, flag_namer
from agentx.records import RequestRecord, read_records
from agentx.report.console import print_summary
from agentx.run import run
from agentx.targets.embedded import EmbeddedSim
from helpers import serve_chat, write_trace

FAST = {"profile": "cpu-tiny", "time_scale": 20.0}


def _cfg(tmp_path: Path, **kw) -> tuple[RunConfig, EmbeddedSim]:
    trace = write_trace(tmp_path / "tr", think=0.5)
    sim = kw.pop("sim", FAST)
    base = dict(trace=str(trace), conc=4, duration_s=2.0, seed=1, think_scale=0.1,
                output_dir=str(tmp_path / "out"), progress=False, scrape_interval_s=1.0,
                drain_timeout_s=10.0)
    base.update(kw)
    return RunConfig(**base), EmbeddedSim(sim)


def _firsts(recs: list[dict]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for r in sorted(recs, key=lambda r: r["intended_send_ns"]):
        out.setdefault(r["lane"], r)
    return out


def _on_schedule(offsets: list[float], ramp: float, late_s: float = 1.0) -> None:
    """First dispatches relative to lane 0's: lane i's at i x ramp / conc or a little later
    (its history is rebuilt first; a loaded machine wakes it late), never earlier."""
    conc = len(offsets)
    for i, off in enumerate(offsets):
        assert i * ramp / conc - 0.05 <= off <= i * ramp / conc + late_s, (i, offsets)


def _console(s: dict) -> str:
    buf = io.StringIO()
    print_summary(s, Console(file=buf, width=200))
    return buf.getvalue()


def test_ramp_up_spreads_first_requests_and_auto_warmup_flags_exactly(tmp_path):
    conc, ramp = 8, 2.0
    s = run(*_cfg(tmp_path, conc=conc, ramp_up_s=ramp, warmup_s="auto"))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    firsts = _firsts(recs)
    assert sorted(firsts) == list(range(conc))
    t0 = firsts[0]["intended_send_ns"]
    offsets = [(firsts[i]["intended_send_ns"] - t0) / 1e9 for i in range(conc)]
    # lane i at i x ramp / conc, never before (late by its history rebuild and the loop)
    _on_schedule(offsets, ramp)
    span = ramp * (conc - 1) / conc
    # every lane's first request is its prime: warm-up, whatever its timing
    assert all(r["kind"] == "prime" and r["warmup"] for r in firsts.values())

    win = s["window"]
    assert s["steady_state"] is True and win["warmup"] == "auto" and win["ramp_up_s"] == ramp
    w = win["start_ns"]
    last_first_end = max(r["end_ns"] for r in firsts.values())
    # W: when the engine saw the last first request end, just after its last byte
    assert last_first_end <= w < last_first_end + int(0.2e9)
    assert win["all_lanes_first_done_s"] == win["start_s"] >= span
    # exactly the requests dispatched before W (and the primes) are warm-up
    for r in recs:
        assert r["warmup"] == (r["kind"] == "prime" or r["intended_send_ns"] < w), r
    early = [r for r in recs if r["kind"] != "prime" and r["intended_send_ns"] < w]
    late = [r for r in recs if r["kind"] != "prime" and r["intended_send_ns"] >= w]
    assert early and late  # the fast lanes went on during the ramp; measured ones follow
    assert s["completed"] == sum(1 for r in late if r["ok"])
    assert s["warmup_requests"] == sum(r["warmup"] for r in recs)


def test_duration_counts_from_the_end_of_the_auto_warmup(tmp_path):
    ramp, duration = 1.5, 2.0
    s = run(*_cfg(tmp_path, conc=4, ramp_up_s=ramp, warmup_s="auto", duration_s=duration))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    win = s["window"]
    assert s["steady_state"] and s["stop_reason"] == "duration"
    t0 = _firsts(recs)[0]["intended_send_ns"]
    last_sent = max(r["intended_send_ns"] for r in recs)
    # the last request was dispatched within --duration after W, not after the run's start
    after_w = (last_sent - win["start_ns"]) / 1e9
    assert duration - 0.6 <= after_w <= duration + 0.05
    assert (last_sent - t0) / 1e9 > duration + 0.8 * ramp * 3 / 4
    # the window's own throughput is over [W, last measured completion]
    assert win["end_s"] - win["start_s"] == pytest.approx(s["throughput"]["window_s"], abs=1e-6)
    # the server's throughput over the whole run is reported next to it (from /metrics)
    th = s["throughput"]
    assert th["server_total_tok_s"] > 0 and th["server_window_s"] > th["window_s"]
    # ... and the rate of every request completing between W and the stop (duration's end)
    assert th["delivered_window_s"] == pytest.approx(duration, abs=0.3)
    assert th["delivered_requests"] >= s["completed"] - 8 and th["delivered_total_tok_s"] > 0
    out = _console(s)
    assert "steady state: yes" in out and "server's /metrics over the whole run" in out


def test_run_too_short_for_the_start_up_says_so(tmp_path):
    # every first request takes 4 s (fixed TTFT); the warm-up may last 5 x 0.5 s
    sim = {**FAST, "time_scale": 1.0, "fixed_ttft_ms": 4000.0, "fixed_itl_ms": 1.0}
    s = run(*_cfg(tmp_path, conc=3, ramp_up_s=0, warmup_s="auto", duration_s=0.5, sim=sim))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    assert s["steady_state"] is False
    assert s["window"]["all_lanes_first_done_s"] is None
    assert s["completed"] == 0 and all(r["warmup"] for r in recs)
    assert len(recs) == 3 and all(r["ok"] for r in recs)  # drained, not cut off
    assert s["throughput"]["server_total_tok_s"] > 0  # the server did work all the same
    assert s["throughput"]["delivered_total_tok_s"] is None  # no window to deliver in
    assert "run ended before every lane finished its first request: it measured only " \
           "start-up" in _console(s)


def test_fixed_warmup_before_start_up_ended_is_not_steady(tmp_path):
    sim = {**FAST, "time_scale": 1.0, "fixed_ttft_ms": 400.0, "fixed_itl_ms": 1.0}
    s = run(*_cfg(tmp_path, conc=2, ramp_up_s=0, warmup_s=0, duration_s=1.5, sim=sim))
    win = s["window"]
    assert s["steady_state"] is False and win["warmup"] == 0
    assert win["start_s"] == 0 and win["all_lanes_first_done_s"] >= 0.4
    assert "--warmup auto starts it there" in _console(s)


def test_defaults_for_many_lanes_and_bad_values():
    small, big, huge = RunConfig(conc=8), RunConfig(conc=64), RunConfig(conc=1024)
    assert small.warmup_auto() and small.ramp_up() == 0  # auto warm-up at every concurrency
    assert big.warmup_auto() and big.ramp_up() == 8.0  # 8 new lanes a second
    assert huge.ramp_up() == 30.0  # capped
    assert RunConfig(conc=64, warmup_s=5).warmup_auto() is False
    assert RunConfig(conc=2, warmup_s="auto").warmup_auto() is True
    assert RunConfig(conc=512, ramp_up_s="0").ramp_up() == 0.0
    name = flag_namer(RunConfig)
    for field, flag in (("warmup_s", "--warmup"), ("ramp_up_s", "--ramp-up")):
        for bad in ("-1", "soon"):
            with pytest.raises(InputError,
                               match=rf"{flag}.*seconds >= 0 (\(at most 2592000\) )?or auto"):
                build(RunConfig, {field: bad}, field_name=name)


def test_workers_start_together_and_share_one_warmup_end(tmp_path):
    """Two worker processes: lane starts interleave across them by global lane id (they
    start at one instant, once both are ready), and the merged records are flagged against
    the run's warm-up end, the later of the two workers' own."""
    conc, ramp = 6, 1.5
    s = run(*_cfg(tmp_path, conc=conc, ramp_up_s=ramp, warmup_s="auto", workers=2))
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    firsts = _firsts(recs)
    t0 = firsts[0]["intended_send_ns"]
    offsets = [(firsts[i]["intended_send_ns"] - t0) / 1e9 for i in range(conc)]
    _on_schedule(offsets, ramp)  # lanes 0, 2, 4 in one process, 1, 3, 5 in the other
    assert s["client"]["workers"] == 2 and s["steady_state"]
    w = s["window"]["start_ns"]
    assert max(r["end_ns"] for r in firsts.values()) <= w
    for r in recs:
        assert r["warmup"] == (r["kind"] == "prime" or r["intended_send_ns"] < w), r


async def test_first_requests_use_connections_opened_before_the_start():
    """The first wave's connections are opened before the run starts (HTTPClient.preconnect)
    and each request's start is stamped once its connection is in hand; a request whose
    connection cannot be made still records when it tried (so its interval is real)."""
    transports: set[int] = set()

    async def handler(request: web.Request) -> web.StreamResponse:
        transports.add(id(request.transport))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
                         b"data: [DONE]\n\n")
        return resp

    runner, base = await serve_chat(handler)
    url = base + "/v1/chat/completions"
    try:
        async with make_session(ClientConfig(base), 8) as s:
            assert await s.preconnect(url, 8) == 8
            recs = [RequestRecord(f"r{i}", "s", i, 0, False) for i in range(8)]
            await asyncio.gather(*(stream_request(s, url, b"{}", r, {}) for r in recs))
            assert all(r.ok for r in recs) and s.connections_opened == 8  # none opened late
        assert len(transports) == 8
    finally:
        await runner.cleanup()
    async with make_session(ClientConfig("http://127.0.0.1:9"), 1) as s:
        assert await s.preconnect("http://127.0.0.1:9/v1/chat/completions", 2) == 0
        rec = RequestRecord("r", "s", 0, 0, False)
        await stream_request(s, "http://127.0.0.1:9/v1/chat/completions", b"{}", rec, {})
    assert rec.error == "connect" and 0 < rec.start_ns <= rec.end_ns
