"""Client fidelity against ground truth: what agentx reports vs what the server really did.

The simulator runs as a separate process in fixed-timing mode with a truth log (the send time
of every chunk on the shared monotonic clock); the full engine replays a one-turn trace at it.
Requests are matched by X-Request-ID and compared request by request and chunk by chunk, with
the same code as bench/fidelity.py. A second run overloads the client on purpose (a thread
that holds the interpreter for 20 ms at a time) and must be flagged `client-bound`.
"""
from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import pytest

from agentx.run import RunConfig, run

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_fidelity", REPO / "bench" / "fidelity.py")
F = importlib.util.module_from_spec(_spec)
sys.modules["bench_fidelity"] = F
_spec.loader.exec_module(F)

TTFT_MS, ITL_MS, OUT = 30.0, 10.0, 48


@pytest.fixture()
def truth_server(tmp_path):
    srv = F.Server(tmp_path / "truth.jsonl", TTFT_MS, ITL_MS, None, tmp_path / "sim.log")
    yield srv
    srv.stop()


def _run(tmp_path: Path, base: str, name: str, **kw) -> tuple[dict, list]:
    trace = F.write_trace(tmp_path / "trace", prompt_tokens=100, out_tokens=OUT, sessions=8)
    cfg = RunConfig(trace=str(trace), conc=32, duration_s=5.0, seed=1, start_min=0.0,
                    start_max=0.0, base_url=base, output_dir=str(tmp_path / name),
                    progress=False, scrape_interval_s=0, drain_timeout_s=10.0, **kw)
    summary = run(cfg)
    return summary, F.agentx_requests(tmp_path / name / "requests.jsonl")


@pytest.mark.alone  # timing: tests/parallel.py
def test_reported_timings_match_the_servers_truth(tmp_path, truth_server):
    summary, client = _run(tmp_path, truth_server.base_url, "out")
    truth_server.stop()  # flushes the truth log
    truth = F.read_truth(truth_server.truth)
    assert summary["failed"] == 0 and summary["completed"] > 100
    # every request we sent reached the server and was seen whole, chunk for chunk
    assert {c.rid for c in client} == set(truth)
    for c in client:
        t = truth[c.rid]
        sent = t.token_chunks
        assert len(c.chunk_ns) == len(sent) == OUT  # one token per chunk here
        # causality on the shared clock: nothing is seen before the server sent it
        assert c.start_ns <= t.arrival_ns
        assert all(a >= s for a, s in zip(c.chunk_ns, sent))
    r = F.compare(truth, client, warm_s=1.0)
    assert r["requests"] > 80 and r["chunk_count_mismatch"] == 0 and r["failed"] == 0
    # 98-99% here on a quiet machine; 94% once on a slowed-down shared one, where a lane's
    # gap between two requests (server's last chunk -> next request read) grew to ~20 ms
    assert r["streams_open"] > 0.9 * 32
    # typical errors are sub-millisecond; tails stay within a few ms even on a shared
    # 2-core CI machine (bench/fidelity.py measures the real figures, docs/fidelity.md)
    assert r["ttft_err"]["p50"] < 3.0 and r["ttft_err"]["p99"] < 25.0, r["ttft_err"]
    assert abs(r["itl_err"]["p50"]) < 0.5 and r["itl_err"]["p99"] < 8.0, r["itl_err"]
    assert abs(r["tpot_err"]["p50"]) < 0.2, r["tpot_err"]
    # the summary's self-measurement is present
    cl = summary["client"]
    assert cl["loop_lag_ms"]["count"] > 100 and cl["dispatch_lag_ms"]["count"] > 0
    assert 0 < cl["cpu_util"] <= 1.5 and cl["runqueue_wait_ms_per_s"] >= 0


@pytest.mark.alone  # timing: tests/parallel.py
def test_overloaded_client_is_flagged_client_bound(tmp_path, truth_server):
    stop = threading.Event()

    def hog() -> None:
        # holds the interpreter ~10 ms at a time: one C call is never interrupted, whatever
        # the switch interval (the run sets 0.5 ms: engine/drive.py). With 0.1 ms calls the
        # hog only shared the core, and the lag p75 sat at 2.7-4.4 ms against the 2 ms floor
        # (once under it in a CI run, 2026-12-02)
        while not stop.is_set():
            sum(range(1_000_000))

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.02)
    burner = threading.Thread(target=hog, daemon=True)
    burner.start()
    try:
        summary, client = _run(tmp_path, truth_server.base_url, "hog")
    finally:
        stop.set()
        burner.join()
        sys.setswitchinterval(old)
    truth_server.stop()
    reasons = summary["validation"]["reasons"]
    assert any(x.startswith("client-bound") or "client-bound" in x for x in reasons), reasons
    assert summary["client"]["loop_lag_ms"]["p99"] > 5.0
    # the flag is no false alarm: the reported chunk gaps really are off by that much
    r = F.compare(F.read_truth(truth_server.truth), client, warm_s=1.0)
    assert r["itl_err"]["p99"] > 5.0, r["itl_err"]
