"""The pool-aware (tiered) theory against the simulator it validates: a prompt the client clamped
to the server's max_model_len is modelled as sent, not as its whole trace turn; the issue's
configuration (MiniMax-M3 TP8, 300k-token pool, 200 GB SimpleCPUOffload tier, 24 lanes)
passes validation; over a seeded sample of configurations around the working set, each
connector's store policy, the theory is within 5 points of what the simulator achieves, or the
configuration sits where the theory cannot say (its band, docs/metrics.md) and validation
accepts it."""
from __future__ import annotations

import json
import os
import random

import pytest

from agentx.cache_theory.tiers import replay_theory, theory_band
from agentx.cli import main
from agentx.prefix_cache import sent_keys
from agentx.trace.model import Trace, TraceSet, Turn
from agentx.verdict.validate import Expectations, validate

BS = 64  # the trace's block size (context scale 1: a key is 64 tokens)


def _traces() -> TraceSet:
    """`big`: one 200-block turn (the client clamps it to 20 blocks); `small`: 20 blocks, then
    25 that extend them."""
    big = Trace("big", [Turn(200 * BS, 10, list(range(10_000, 10_200)))])
    small = Trace("small", [Turn(20 * BS, 10, list(range(1, 21))),
                            Turn(25 * BS, 10, list(range(1, 26)))])
    return TraceSet("t", [big, small])


def _record(rid: str, trace: str, turn: int, lane: int, t: int, isl: int) -> dict:
    return {"request_id": rid, "session_id": f"abcdefgh-L{lane}.0", "trace_id": trace,
            "turn": turn, "start_ns": (t + 1) * 10**9, "end_ns": (t + 1) * 10**9 + 10**8,
            "isl_intended": isl}


def test_sent_keys_cut_only_a_clamped_prompt():
    keys = list(range(10))
    assert sent_keys(keys, 10 * BS, BS) == keys  # as long as its turn: unchanged
    assert sent_keys(keys, 10 * BS - 30, BS) == keys  # a partial last block is still a block
    assert sent_keys(keys, 3 * BS + 1, BS) == keys[:4]  # clamped: the blocks it has
    assert sent_keys(keys, 64, 12.8) == keys[:5]  # context scale 0.2: 12.8 tokens a key


def test_a_clamped_turn_does_not_flush_the_tier():
    """A 200-block turn clamped to 20 blocks between two turns of another session: the server
    stores 20 blocks of it, so the tier (60 blocks) still holds the other session's 20 when it
    comes back; modelled whole (the theory before issue 34), its 200 keys flushed the tier
    and the other session's tier hit was 0."""
    records = [_record("s0", "small", 0, 0, 0, 20 * BS), _record("b0", "big", 0, 1, 1, 20 * BS),
               _record("s1", "small", 1, 0, 2, 25 * BS)]
    pred = replay_theory(records, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                         tier_tokens=60 * BS, eager=False)
    assert pred["s1"] == (20 * BS, 20 * BS)  # all of it from the tier
    assert pred["b0"] == (0, 0)


def test_the_band_is_wide_on_the_cliff_and_a_point_elsewhere():
    """The same three requests: a 30-block tier holds exactly what fell out of the 10-block
    pool (`small`'s 20 blocks and `big`'s last 10), so 10% less loses the 4 blocks of `small`
    stored first (its tail) and the band spans 16..20 of its blocks; a tier twice as large
    keeps them whatever the 10%: a band of one value."""
    records = [_record("s0", "small", 0, 0, 0, 20 * BS), _record("b0", "big", 0, 1, 1, 20 * BS),
               _record("s1", "small", 1, 0, 2, 25 * BS)]
    for r in records:
        r.update(ok=True, warmup=r["request_id"] == "s0")
    share = 20 / 45  # s1's hit over the measured prompts (b0 and s1)

    def band(tier_blocks: int) -> dict:
        pred = replay_theory(records, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                             tier_tokens=tier_blocks * BS)
        rate = sum(pred[r][0] for r in ("b0", "s1")) / (45 * BS)
        cache = {"offload_tokens": tier_blocks * BS, "kv_pool_tokens": 10 * BS,
                 "offload_eager": False, "theoretical_hit_rate_pool": rate,
                 "theoretical_hit_rate_offload": rate}
        return theory_band(records, _traces(), cache, context_scale=1.0)

    cliff = band(30)
    assert cliff["pool"] == [pytest.approx(16 / 45), pytest.approx(share)]
    assert cliff["offload"] == cliff["pool"] and cliff["gpu"] == [0.0, 0.0]
    assert band(60)["pool"] == [pytest.approx(share)] * 2
    assert theory_band(records, _traces(), {"kv_pool_tokens": 640}, context_scale=1.0) is None


def _burst(first_answered: str) -> list[dict]:
    """Two sessions' first turns sent 1 ms apart, `b0` first; the server answers
    `first_answered` 40 ms after the send and the other at 90 ms (first token), each 10 ms
    before its end. Both come back 2 s later."""
    def rec(rid: str, lane: int, turn: int, sent_ms: int, first_ms: int) -> dict:
        r = _record(rid, "small", turn, lane, 0, (20 if turn == 0 else 25) * BS)
        r.update(start_ns=10**9 + sent_ms * 10**6, first_token_ns=10**9 + first_ms * 10**6,
                 end_ns=10**9 + (first_ms + 10) * 10**6, ok=True, warmup=turn == 0)
        return r
    a_first = first_answered == "a0"
    return [rec("b0", 1, 0, 0, 90 if a_first else 40), rec("a0", 0, 0, 1, 40 if a_first else 90),
            rec("a1", 0, 1, 2000, 2050), rec("b1", 1, 1, 2200, 2250)]


def test_the_band_holds_the_order_the_server_answered_in():
    """A 10-block pool, an eager 20-block tier: it keeps the 20 blocks of the first turn
    computed last. Sent `b0` then `a0`, the client's order has `a0` wait while `b0` holds the
    pool, so `a0` is computed last and `a1` finds all 20 of its blocks in the tier. The server
    answered `a0` first, so it computed `b0` last and the tier holds `b0`'s: the replay in
    the server's order finds none there. Validation judges a tier that stored and never
    loaded by that order (the run's own order, not a what-if like a capacity 10% off): here it
    passes and says why; with the client's order alone it failed."""
    records = _burst("a0")
    sent = replay_theory(records, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                         tier_tokens=20 * BS, eager=True)
    answered = replay_theory(records, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                             tier_tokens=20 * BS, eager=True, server_order=True)
    assert sent["a1"] == (20 * BS, 20 * BS) and answered["a1"] == (0, 0)
    # answered in the order sent: the two replays agree
    in_order = _burst("b0")
    assert (replay_theory(in_order, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                          tier_tokens=20 * BS, eager=True, server_order=True)
            == replay_theory(in_order, _traces(), context_scale=1.0, pool_tokens=10 * BS,
                             tier_tokens=20 * BS, eager=True))

    measured = 50 * BS  # a1 and b1
    nominal = {k: sum(v[0 if k == "pool" else 1] for r, v in sent.items() if r in ("a1", "b1"))
               / measured for k in ("pool", "offload")}
    cache = {"offload_tokens": 20 * BS, "kv_pool_tokens": 10 * BS, "offload_eager": True,
             "theoretical_hit_rate_pool": nominal["pool"],
             "theoretical_hit_rate_offload": nominal["offload"]}
    band = theory_band(records, _traces(), cache, context_scale=1.0)
    assert band["server_order"]["offload"] == 0.0 < nominal["offload"] == 0.4
    assert band["offload"][0] == band["pool"][0] == 0.0

    sm = {"available": True, "offload": {
        "hits_observed": False, "loads": {"simple_kv_offload_blocks_loaded": 0.0},
        "stores": {"simple_kv_offload_blocks_stored": 40.0}}}
    exp = dict(offload_expected=True, working_set_exceeds_pool=True,
               tier_hit_rates={"gpu": nominal["pool"] - nominal["offload"],
                               "offload": nominal["offload"]},
               required_families=[], require_complete_window=False, min_samples=0)
    v = validate({"server_metrics": sm}, Expectations(**exp, theory_band=band))
    check = next(c for c in v["checks"] if c["name"] == "offload_hits")
    assert check["ok"] is True, check
    assert "0.0% from the tier in the order the server answered" in check["note"]
    v = validate({"server_metrics": sm}, Expectations(**exp))
    assert v["verdict"] == "fail"
    assert any("stores but never loads" in r for r in v["reasons"])


@pytest.mark.slow
def test_the_issue_configuration_passes_validation(tmp_path):
    """serve-sim --kv-pool-tokens 300000 --kv-offload simple-cpu --offload-gb 200 --time-scale 10
    (MiniMax-M3 TP8, blocks of 128) under swe, 24 lanes, 40 s, think <= 5 s: one lane's session
    has turns of ~635k tokens, clamped to the pool's 299,904. Before issue 34 the theory said
    9.0% against 26.7% achieved, all of it from the tier, and validation failed; modelled as
    sent it said 25.3% against 29.1% (2026-12-03)."""
    out = tmp_path / "run"
    rc = main(["run", "--trace", "swe", "--conc", "24", "--duration", "40", "--max-think", "5",
               "--expect-offload", "--no-progress", "-o", str(out), "--validate", "warn",
               "--sim-kv-pool-tokens", "300000", "--sim-kv-offload", "simple-cpu",
               "--sim-offload-gb", "200", "--sim-time-scale", "10"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert any(r["isl"] < 300_000 < r["isl"] + 1_000 for r in records)  # clamped prompts ran
    c = s["cache"]
    assert c["offload_tokens"] == 1_627_520 and c["kv_pool_tokens"] == 299_904
    assert s["server_metrics"]["external_cache"]["hits"] > 0
    assert abs(c["achieved_hit_rate"] - c["theoretical_hit_rate_pool"]) <= 0.10, c
    assert s["validation"]["verdict"] == "pass", s["validation"]["reasons"]


KV_BYTES = 122_880  # h200-minimaxm3-fp8: bytes of one token's KV over the TP8 group
CONNECTORS = [("simple-cpu", "lazy"), ("simple-cpu", "eager"), ("mooncake", None),
              ("lmcache", None)]
# PROPERTY_RUNS=N draws N configurations per connector instead of one (a longer local check)
PER_CONNECTOR = int(os.environ.get("PROPERTY_RUNS", "1"))


def _configurations(seed: int = 34) -> list[dict]:
    """One seeded draw per connector (store policy): blocks of 16 or 128 tokens, 8-16 lanes,
    prompts scaled to 5-10% of the swe trace's, think <= 0.5-2 s, the simulator 5-20x real
    time, and the GPU pool and the tier each 0.3-1.2x and 0.3-2x the working set (lanes x the
    trace's mean prompt of ~130k tokens, scaled)."""
    rng = random.Random(seed)
    out = []
    for kind, store in CONNECTORS * PER_CONNECTOR:
        lanes, scale = rng.choice([8, 12, 16]), rng.choice([0.05, 0.1])
        working_set = lanes * 130_000 * scale
        out.append({"kind": kind, "store": store, "block": rng.choice([16, 128]), "duration": 3,
                    "lanes": lanes, "scale": scale, "think": rng.choice([0.5, 1.0, 2.0]),
                    "time_scale": rng.choice([5, 10, 20]), "seed": rng.randrange(1000),
                    "pool": int(working_set * rng.uniform(0.3, 1.2)),
                    "tier": int(working_set * rng.uniform(0.3, 2.0))})
    return out


def _simulated(tmp_path, c: dict) -> dict:
    """A real run of configuration `c` against the embedded simulator: its summary."""
    out = tmp_path / "run"
    argv = ["run", "--trace", "swe", "--conc", str(c["lanes"]),
            "--duration", str(c["duration"]),
            "--max-think", str(c["think"]), "--context-scale", str(c["scale"]),
            "--seed", str(c["seed"]), "--expect-offload", "--no-progress", "-o", str(out),
            "--validate", "warn", "--sim-block-size", str(c["block"]),
            "--sim-kv-pool-tokens", str(c["pool"]), "--sim-kv-offload", c["kind"],
            "--sim-offload-gb", f"{c['tier'] * KV_BYTES / 1e9:.6f}",
            "--sim-time-scale", str(c["time_scale"])]
    if c["store"]:
        argv += ["--sim-offload-store", c["store"]]
    assert main(argv) == 0
    return json.loads((out / "summary.json").read_text())


def _hit_checks_pass(s: dict) -> None:
    checks = {x["name"]: x for x in s["validation"]["checks"]}
    for name in ("prefix_hit_rate", "offload_hits"):
        assert checks[name]["ok"] is not False, checks[name]


@pytest.mark.parametrize("c", _configurations(), ids=lambda c: f"{c['kind']}-{c['store']}")
def test_theory_follows_the_simulator(tmp_path, c):
    """A real run against the embedded simulator (its scheduler, pool and tier), 3 s after its
    warm-up (~10 s in all). The theory is within 5 points of the achieved hit rate; where it
    is not (the configuration sits
    on the cliff where a revisit's hit depends on the order the server admitted requests in:
    seed 34 draws two such, mooncake and lmcache, e.g. 33.5% achieved vs 46.5% with a band of
    27.7..71.4%), the achieved rate is within 5 points of the theory's band (both capacities
    10% off). Either way validation's hit-rate and offload checks do not fail the simulator,
    which serves correctly."""
    s = _simulated(tmp_path, c)
    cache = s["cache"]
    achieved, theory = cache["achieved_hit_rate"], cache["theoretical_hit_rate_pool"]
    band = cache["theory_band"]["pool"]
    assert cache["offload_tokens"] and cache["offload_eager"] == (c["store"] != "lazy")
    if abs(achieved - theory) > 0.05:  # on the cliff: the theory's band holds it
        assert band[0] - 0.05 <= achieved <= band[1] + 0.05, (achieved, theory, band)
    _hit_checks_pass(s)


def test_on_the_cliff_the_band_is_wide_and_validation_accepts(tmp_path):
    """A configuration on the cliff (12 lanes of prompts at 2% of the trace's, a 23k-token
    pool, a 33k-token eager tier: the working set a little larger than the tier): two runs of
    it achieved 4.6% and 1.2% against a theory of 19.1% and 0.0%. The band spans more than the
    tolerance and validation judges the achieved rate by it, with its tolerance (10 points):
    on the loaded CI machine one run achieved 2.1% against a theory of 14.7% and a band from
    9.8%, inside the tolerance but not inside 5 points (test_theory_follows_the_simulator
    holds the 5 points off the cliff). Its hits come from the first 12 requests, sent within
    1 ms on new connections, and on a loaded machine the server answered them in another order:
    one CI run achieved 0.0% against 14.4% and failed `offload_hits`, another's band from the
    capacities alone was 9.2..17.3%. The band now holds the theory in the server's order too
    (0.0% on such a run, test_the_band_holds_the_order_the_server_answered_in), and
    `offload_hits` is judged by it."""
    s = _simulated(tmp_path, {"kind": "simple-cpu", "store": "eager", "block": 16, "lanes": 12,
                              "scale": 0.02, "think": 2.0, "time_scale": 10, "seed": 807,
                              "duration": 6,
                              "pool": 23_271, "tier": 33_200})
    band = s["cache"]["theory_band"]["pool"]
    assert band[1] - band[0] > 0.10, band
    check = {x["name"]: x for x in s["validation"]["checks"]}["prefix_hit_rate"]
    assert check["expected"]["band"] == band and check["expected"]["tolerance"] == 0.10
    tol = check["expected"]["tolerance"]
    assert band[0] - tol <= s["cache"]["achieved_hit_rate"] <= band[1] + tol
    _hit_checks_pass(s)
