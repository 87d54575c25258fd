"""The built-in `swe` trace: shipped file properties, acceptance against the real traces,
byte-identical regeneration and the generator's hash_id rules."""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path

import pytest

from agentx.cli import main
from agentx.trace.generate import (
    SWE,
    SWE_SEED,
    SWE_SESSIONS,
    archive_bytes,
    generate_sessions,
    omit_implied_hash_ids,
)
from agentx.trace.load import load_traces
from agentx.trace.shape import trace_stats

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "traces" / "swe.tar.xz"

# acceptance: p50 within ±15 %, p90 within ±20 % of the real set
SHAPE_KEYS = ("turns_per_session", "first_prompt_tokens", "last_prompt_tokens",
              "input_growth_tokens", "output_tokens", "think_time_s")
COMPACTION_TOL = 0.20  # relative, on the fraction of turns whose prompt shrinks (real: 0.88 %)
SUBAGENT_TOL = 0.35  # relative, on subagents per session (real: 52 in 533 sessions, 13 of
#                      them with subagents, so the real rate itself is uncertain by ~±30 %)


@pytest.fixture(scope="module")
def swe_stats() -> tuple[dict, float]:
    """Stats of the shipped trace and the CPU seconds its load took (the set is dropped)."""
    t0 = time.process_time()
    ts = load_traces("swe")
    load_s = time.process_time() - t0
    return trace_stats(ts), load_s


def test_shipped_file_is_small_and_loads_fast(swe_stats):
    st, load_s = swe_stats
    assert SHIPPED.stat().st_size < 2_000_000
    assert st["sessions"] == SWE_SESSIONS and st["name"] == "swe"
    assert load_s < 2.0, f"loading swe took {load_s:.2f} CPU s"


@pytest.mark.parametrize("key", SHAPE_KEYS)
def test_swe_shape_matches_real(swe_stats, real_stats, key):
    got, want = swe_stats[0]["parent"][key], real_stats["parent"][key]
    assert got["p50"] == pytest.approx(want["p50"], rel=0.15), (key, got, want)
    assert got["p90"] == pytest.approx(want["p90"], rel=0.20), (key, got, want)


def test_swe_compaction_subagents_and_hit_rate_match_real(swe_stats, real_stats):
    st = swe_stats[0]
    assert st["compaction_turn_fraction"] == pytest.approx(
        real_stats["compaction_turn_fraction"], rel=COMPACTION_TOL)
    assert st["subagents_per_session"] == pytest.approx(real_stats["subagents_per_session"],
                                                        rel=SUBAGENT_TOL)
    # in-session infinite-cache hit rate: per-session mean within 2 points, token-weighted
    # within 1 point (real: 92.8 % and 96.4 %)
    assert abs(st["parent"]["prefix_hit_rate"]["mean"]
               - real_stats["parent"]["prefix_hit_rate"]["mean"]) < 0.02
    assert abs(st["prefix_hit_rate_overall"] - real_stats["prefix_hit_rate_overall"]) < 0.01
    # subagent sessions are shorter than their parents, as in the real set
    assert st["subagent"]["turns_per_subagent"]["p50"] == pytest.approx(
        real_stats["subagent"]["turns_per_subagent"]["p50"], rel=0.3)


def test_regeneration_is_byte_identical():
    """`agentx trace gen` (defaults) rebuilds traces/swe.tar.xz exactly."""
    docs = [omit_implied_hash_ids(d) for d in generate_sessions(SWE_SEED, SWE_SESSIONS)]
    assert archive_bytes(docs) == SHIPPED.read_bytes()


def test_omitted_hash_ids_load_back_identically(tmp_path):
    m = dataclasses.replace(SWE, p_subagents=1.0)  # every session spawns subagents
    docs = generate_sessions(7, 3, m)
    full, compact = tmp_path / "full.tar.xz", tmp_path / "compact.tar.xz"
    full.write_bytes(archive_bytes(copy.deepcopy(docs)))
    compact.write_bytes(archive_bytes([omit_implied_hash_ids(copy.deepcopy(d))
                                       for d in docs]))
    a, b = load_traces(str(full)), load_traces(str(compact))

    def all_ids(ts):
        out = []
        for tr in ts.traces:
            out += [t.hash_ids for t in tr.turns]
            for s in tr.subagents:
                out += [t.hash_ids for t in s.trace.turns]
        return out

    assert all_ids(a) == all_ids(b) and len(all_ids(a)) > 50
    n_omitted = sum("hash_ids" not in r for d in docs for r in
                    omit_implied_hash_ids(copy.deepcopy(d))["requests"]
                    if r["type"] != "subagent")
    assert n_omitted > 0.8 * sum(r["type"] != "subagent" for d in docs for r in d["requests"])
    # later subagents of a session reuse the first one's system+tools blocks
    subs = max(([s.trace for s in tr.subagents] for tr in b.traces), key=len)
    assert len(subs) >= 2
    n_prefix = (subs[0].system_tokens + subs[0].tool_tokens) // 64
    assert subs[1].turns[0].hash_ids[:n_prefix] == subs[0].turns[0].hash_ids[:n_prefix]


def test_generator_rules():
    docs = generate_sessions(11, 30)
    assert docs == generate_sessions(11, 30)  # seeded
    for d in docs:
        base_blocks = (d["system_tokens"] + d["tool_tokens"]) // 64
        turns = [r for r in d["requests"] if r["type"] != "subagent"]
        assert turns[-1]["stop"] == "end_turn" and d["requests"][-1]["type"] == "n"
        for prev, cur in zip(turns, turns[1:]):
            ids, pids = cur["hash_ids"], prev["hash_ids"]
            assert len(ids) == math.ceil(cur["in"] / 64)
            keep = next((i for i, (x, y) in enumerate(zip(ids, pids)) if x != y),
                        min(len(ids), len(pids)))
            assert keep <= prev["in"] // 64  # the partial last block is never kept
            assert keep >= min(base_blocks, cur["in"] // 64)  # system+tools always kept
            assert set(ids[keep:]).isdisjoint(pids)  # new content gets new ids
            if cur["in"] > prev["in"]:  # growth holds at least the previous answer
                assert cur["in"] - prev["in"] >= prev["out"] + 10
            assert cur["t"] == pytest.approx(prev["t"] + prev["api_time"] + cur["think_time"],
                                             abs=2e-3)


def test_cli_gen(tmp_path, capsys):
    out = tmp_path / "mini.tar.xz"
    assert main(["trace", "gen", "--seed", "5", "--sessions", "4", "--output-file", str(out)]) \
        == 0
    assert "wrote" in capsys.readouterr().out
    ts = load_traces(str(out))
    assert [t.id for t in ts.traces] == ["swe_0001", "swe_0002", "swe_0003", "swe_0004"]
    assert main(["trace", "gen", "--sessions", "0", "--output-file", str(out)]) == 2
