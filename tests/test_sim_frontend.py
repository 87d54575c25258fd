"""The API-server front end as a shared queue (sim/frontend.py) and vLLM's server-side timing
definitions (queue time from the engine core's queue, not from HTTP arrival)."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentx import vllm_names as vn
from agentx.sim.build import build_engine
from agentx.sim.config import SimConfig
from agentx.sim.frontend import FrontEnd, ServedFrontEnd
from agentx.sim.request import SimRequest


def _mean_stay(n: int, servers: float) -> float:
    """Mean seconds in the front end of n requests of 10k tokens arriving together."""
    fe = FrontEnd(0.01, 1e-6, servers)
    done = [x for i in range(n) for x in fe.add(0.0, i, fe.work(10_000))] + fe.advance(100.0)
    assert sorted(item for _, item in done) == list(range(n))
    return sum(t for t, _ in done) / n


def test_waiting_grows_with_load():
    one = _mean_stay(1, 2)
    assert one == pytest.approx(0.02)  # alone: exactly its own work
    assert _mean_stay(2, 2) == pytest.approx(one)  # within capacity: no waiting
    eight, thirty_two = _mean_stay(8, 2), _mean_stay(32, 2)
    assert one < eight < thirty_two
    assert thirty_two > 10 * one  # 32 requests share 2 servers: each waits for most of the others
    assert _mean_stay(32, 0) == pytest.approx(one)  # unlimited capacity (servers 0): independent holds


def _long_then_short(ordered: bool) -> list[tuple[float, str]]:
    """A cold 127k-token prompt, then 11 short ones sent 5 ms apart: (departure, name) in order."""
    fe = FrontEnd(0.0114, 1.26e-6, 1, ordered=ordered)
    out = fe.add(0.0, "long", fe.work(127_000))
    for i in range(11):
        out += fe.add(0.005 * (i + 1), f"short{i}", fe.work(2_000))
    return out + fe.advance(10.0)


def test_unordered_front_end_releases_in_finish_order():
    """Without `ordered` (the model of 2026-12-02) the long prompt leaves after the 11 short ones
    sent after it."""
    order = [item for _, item in _long_then_short(False)]
    assert order[-1] == "long"
    assert order[:11] == [f"short{i}" for i in range(11)]


def test_ordered_front_end_releases_in_arrival_order():
    """With `ordered` (as measured on vLLM 0.24: the engine core's `add` events follow the send
    order, tests/data/h200-runs-6) the short ones wait for the long one and leave with it; their
    work was done while they waited (shared capacity), so they leave at the long one's finish."""
    out = _long_then_short(True)
    assert [item for _, item in out] == ["long"] + [f"short{i}" for i in range(11)]
    t_long = out[0][0]
    unordered = dict((item, t) for t, item in _long_then_short(False))
    assert t_long == pytest.approx(unordered["long"])  # the long one is not delayed by holding
    assert all(t == t_long for t, _ in out)  # the others were done before it: held, then released


def test_ordered_front_end_without_capacity_limit_still_keeps_order():
    """servers 0 (unlimited: independent holds) with `ordered`: a short request whose own work ends
    first still waits for the long one sent before it; one sent after the long one left does not."""
    fe = FrontEnd(0.01, 1e-6, 0, ordered=True)
    out = fe.add(0.0, "long", fe.work(100_000)) + fe.add(0.001, "short", fe.work(1_000))
    out += fe.advance(0.2) + fe.add(0.2, "later", fe.work(1_000)) + fe.advance(1.0)
    assert [item for _, item in out] == ["long", "short", "later"]
    times = dict((item, t) for t, item in out)
    assert times["short"] == pytest.approx(0.11) and times["later"] == pytest.approx(0.211)


@pytest.mark.parametrize("ordered", [False, True])
def test_served_front_end_releases_in_the_models_order(ordered):
    """The event-loop front end the HTTP server awaits: the same orders, on real (scaled) time.
    At scale 2 the long request holds 55 ms against the short ones' 5.5 ms: at scale 10 (11 ms vs
    1.1 ms) a loop lag of a busy machine let the long one finish first (`-n 6` run, 2026-12-03)."""
    async def go() -> list[str]:
        sfe = ServedFrontEnd(FrontEnd(0.01, 1e-6, 1, ordered=ordered), time_scale=2.0)
        out: list[str] = []

        async def one(name: str, tokens: int, delay: float) -> None:
            await asyncio.sleep(delay)
            await sfe.hold(sfe.fe.work(tokens))
            out.append(name)

        await asyncio.gather(one("long", 100_000, 0.0), one("a", 1_000, 0.001), one("b", 1_000, 0.002))
        return out

    assert asyncio.run(go()) == (["long", "a", "b"] if ordered else ["a", "b", "long"])


def _hist_sum(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_sum":
                return s.value
    raise AssertionError(name)


def test_queue_time_counts_from_engine_arrival():
    """vLLM v1: queued_time = scheduled_ts - queued_ts (engine-core events), TTFT and e2e from the
    request's arrival. A request that spent 50 ms in the front end and was scheduled at once has
    queue time 0 and TTFT > 50 ms."""
    built = build_engine(SimConfig(profile="h200-qwen3-8b-bf16"))
    eng = built.engine
    eng.use_virtual_clock()
    eng.virtual_ns = 50_000_000  # it leaves the front end 50 ms after it arrived
    req = SimRequest(rid="0", prompt_len=2_000, max_tokens=4, block_hashes=list(range(125)), arrival_ns=0)
    eng.submit(req)
    while eng.step_offline():
        pass
    assert req.queued_ns == 50_000_000 and req.scheduled_ns == 50_000_000
    text = built.stats.render().decode()
    assert _hist_sum(text, vn.QUEUE_TIME) == 0.0
    prefill = _hist_sum(text, vn.PREFILL_TIME)
    assert prefill == (req.first_token_ns - req.scheduled_ns) / 1e9 > 0
    assert _hist_sum(text, vn.TTFT) == req.first_token_ns / 1e9 > 0.05
    assert _hist_sum(text, vn.E2E) == req.last_token_ns / 1e9


def test_served_concurrent_requests_all_leave_the_front_end():
    """Over HTTP: 12 requests at once through a 4-server front end all complete (a departure
    at an arrival's instant must be released too)."""
    import json
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from agentx.sim.embedded import start_in_thread

    with start_in_thread(SimConfig(profile="h200-qwen3-8b-bf16", time_scale=4)) as sim:
        def go(i: int) -> int:
            body = json.dumps({"prompt": "hello " * (2000 + 500 * i), "max_tokens": 4}).encode()
            req = urllib.request.Request(sim.base_url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status

        with ThreadPoolExecutor(12) as ex:
            assert list(ex.map(go, range(12))) == [200] * 12


def test_replayed_engine_receives_requests_in_send_order():
    """Start-up as on the real H200: a cold 127k-token prompt sent first, then 11 short ones 2 ms
    apart. vLLM 0.24's engine core received requests in the order they were sent (h200-runs-6:
    no request overtook an earlier one by more than 0.1 ms), and the shipped profile's front end
    keeps that order (`frontend_in_order`): the long prompt reaches the engine first and, first
    come first served, gets its first token no later than the short ones."""
    from sim_calibration.replay import replay

    def rec(i: int, isl: int, at_ms: float) -> dict:
        return {"request_id": str(i), "session_id": f"s{i}", "start_ns": int(at_ms * 1e6), "isl": isl,
                "osl": 8, "cached_tokens": 0, "ok": True, "warmup": False}

    recs = [rec(0, 127_000, 0.0)] + [rec(i, 3_000, 2.0 * i) for i in range(1, 12)]
    rows = replay(SimConfig(profile="h200-qwen3-8b-bf16"), recs)
    left = [r["frontend_ms"] + recs[i]["start_ns"] / 1e6 for i, r in enumerate(rows)]
    assert left == sorted(left)  # into the engine in send order
    first = [r["ttft_ms"] + recs[i]["start_ns"] / 1e6 for i, r in enumerate(rows)]
    assert first[0] <= min(first[1:])  # the last short chunk may share the long one's last step
    # and the queue time of each (engine core -> scheduled) excludes its time in the front end
    assert all(r["frontend_ms"] > 0 and r["queue_ms"] < r["ttft_ms"] for r in rows)


def _burst(first_read: int, later_read: int) -> list[tuple[float, str]]:
    """A cold burst as the real runs send it: prompts 0.1 ms apart, a 127k-token one and a 26k one
    among 5k ones, through the shipped front end's work and capacity."""
    fe = FrontEnd(0.01495, 0.946e-6, 1, ordered=True, first_read_tokens=first_read,
                  read_tokens=later_read)
    out: list = []
    for i, (name, tokens) in enumerate([("s0", 5_000), ("L", 127_000), ("s1", 5_000), ("M", 26_000),
                                        ("s2", 5_000)]):
        out += fe.add(1e-4 * i, name, fe.work(tokens), fe.reads(tokens))
    return out + fe.advance(10.0)


def test_a_body_of_several_reads_goes_behind_the_requests_waiting():
    """A body larger than the first read waits a turn at the back of the line for each later
    read, as vLLM 0.24's engine core received the real cold bursts (the 127k-token prompt sent
    21st of 32 always last, a 26k one behind the shorter ones sent after it:
    tests/data/h200-runs-6 to -9 events); short ones keep their order, and no work is lost."""
    fe = FrontEnd(0.01, 1e-6, 1, ordered=True, first_read_tokens=24_000, read_tokens=48_000)
    assert [fe.reads(n) for n in (24_000, 24_001, 72_000, 72_001, 127_043)] == [0, 1, 1, 2, 3]
    assert [item for _, item in _burst(24_000, 48_000)] == ["s0", "s1", "s2", "M", "L"]
    assert [item for _, item in _burst(0, 0)] == ["s0", "L", "s1", "M", "s2"]  # one read each
    # the server never idles, so all the work is done at its sum; the long one, which had the
    # most, leaves when its own is done: the turns reorder, they cost no time
    left = dict((item, t) for t, item in _burst(24_000, 48_000))
    total = sum(0.01495 + 0.946e-6 * n for n in (5_000, 127_000, 5_000, 26_000, 5_000))
    assert left["L"] == pytest.approx(total, rel=1e-9)


def test_a_long_body_alone_takes_its_reads_at_once():
    """Alone in the server a long prompt's reads cost no turn: it leaves after its own work."""
    fe = FrontEnd(0.01, 1e-6, 1, ordered=True, first_read_tokens=24_000, read_tokens=48_000)
    out = fe.add(0.0, "L", fe.work(127_000), fe.reads(127_000)) + fe.advance(1.0)
    assert out == [(pytest.approx(0.137), "L")]


def test_the_shipped_front_end_orders_the_real_cold_bursts():
    """In every probed 32-lane run (vLLM 0.24's engine events, tests/data/h200-runs-6 to -9 and
    h100-runs*) the engine core received the cold burst's longest prompt (127k tokens, sent 21st)
    last; the shipped front end does the same, and its order is closer to the real one than the
    send order is (bench/frontend_events.py prints the table)."""
    from agentx.sim.build import frontend
    from agentx.sim.profile import load_profile
    from sim_calibration.events import burst, displacement, frontend_order, probed_runs
    from sim_calibration.realruns import DATA

    cal = load_profile("h200-qwen3-8b-bf16").calibration
    n = sent_total = model_total = 0
    for run in probed_runs(DATA):
        sent, real = burst(run)
        if run.lanes < 32 or not sent:
            continue
        n += 1
        longest = max(sent, key=lambda r: r["isl"])["request_id"]
        order = frontend_order(frontend(cal), sent)
        assert real[-1] == longest and order[-1] == longest, run.name
        assert sorted(order) == sorted(real)
        sent_total += displacement([r["request_id"] for r in sent], real)
        model_total += displacement(order, real)
    assert n >= 15
    assert model_total < 0.4 * sent_total


def test_timing_series_carry_vllms_names():
    """The series whose definitions the simulator follows are the ones vLLM v1 registers
    (vllm/v1/metrics/loggers.py, PrometheusStatLogger) and a real vLLM 0.32 scrape shows."""
    from pathlib import Path

    want = {vn.QUEUE_TIME: "vllm:request_queue_time_seconds", vn.PREFILL_TIME: "vllm:request_prefill_time_seconds",
            vn.DECODE_TIME: "vllm:request_decode_time_seconds",
            vn.INFERENCE_TIME: "vllm:request_inference_time_seconds", vn.E2E: "vllm:e2e_request_latency_seconds",
            vn.TTFT: "vllm:time_to_first_token_seconds"}
    assert all(ours == theirs for ours, theirs in want.items())
    sample = (Path(__file__).parent / "data" / "vllm-samples" / "metrics_after.txt").read_text()
    names = {f.name for f in text_string_to_metric_families(sample)}
    assert set(want) <= names
