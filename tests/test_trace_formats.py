"""The trace-reader registry (agentx/trace/readers.py): each format read from its public sample
in tests/data/traces (sources: tests/data/NOTICE), mapped to sessions, turns, think times and
shared prefixes as docs/traces.md says (the expected values are computed here from the
sample's own fields), `agentx trace stats` on each, and a replay of each on the simulator."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from agentx.trace.load import load_traces
from agentx.trace.readers import KINDS, READERS
from agentx.trace.textblocks import estimate_tokens, messages_text
from conftest import DATA
from helpers import write_trace

TRACES = DATA / "traces"
AIPERF = TRACES / "aiperf-multiturn.jsonl"
OTEL = TRACES / "otel-fan-in-dependencies.json"
BAILIAN = TRACES / "bailian-sample.jsonl"
SAMPLES = {"aiperf-mooncake": AIPERF, "otel-genai": OTEL, "bailian": BAILIAN}


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_registry_reads_every_format_by_its_reader(tmp_path):
    assert len(KINDS) == len(READERS) >= 5 and {"weka", "mooncake"} <= set(KINDS)
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, '
                    '"hash_ids": [1, 2]}\n')
    files = {**SAMPLES, "mooncake": moon, "weka": write_trace(tmp_path / "w", sessions=2)}
    for kind, path in files.items():
        ts = load_traces(str(path))
        assert {t.reader for t in ts.traces} == {kind}, path


def test_aiperf_sessions_history_and_delays():
    ts = {t.id.removeprefix("aiperf-multiturn-"): t for t in load_traces(str(AIPERF)).traces}
    rows = _rows(AIPERF)
    a1, a2 = (r for r in rows if r["session_id"] == "abc-123")
    t = ts["abc-123"]
    assert [x.in_tokens for x in t.turns] == [  # AIPerf keeps the history: prompt + answer
        a1["input_length"], a1["input_length"] + a1["output_length"] + a2["input_length"]]
    assert [x.out_tokens for x in t.turns] == [a1["output_length"], a2["output_length"]]
    assert t.turns[1].think_time == pytest.approx(a2["delay"] / 1000)
    s1, s2 = (r for r in rows if r["session_id"] == "sess-1")
    m = ts["sess-1"]
    assert [x.in_tokens for x in m.turns] == [estimate_tokens(messages_text(r["messages"]))
                                              for r in (s1, s2)]
    assert m.turns[1].think_time == pytest.approx((s2["timestamp"] - s1["timestamp"]) / 1000)
    assert m.start_s == s1["timestamp"] / 1000 and t.start_s is None


def test_otel_spans_times_tokens_and_overlap():
    doc = json.loads(OTEL.read_text())
    (t,) = load_traces(str(OTEL)).traces
    spans = sorted(doc["spans"], key=lambda s: s["start_time"])
    assert len(t.turns) == len(spans)
    from agentx.trace.otel import _time

    starts = [_time(s["start_time"], "", "", "") for s in spans]
    ends = [_time(s["end_time"], "", "", "") for s in spans]
    for i, (turn, s) in enumerate(zip(t.turns, spans)):
        a = s["attributes"]
        assert turn.in_tokens == estimate_tokens(messages_text(
            orjson.loads(a["gen_ai.input.messages"])))
        assert turn.out_tokens == estimate_tokens(a["gen_ai.output.text"])
        assert turn.api_time == pytest.approx(ends[i] - starts[i])
        gap = starts[i] - max(ends[:i]) if i else 0.0
        assert turn.think_time == pytest.approx(max(0.0, gap))  # overlap: 0
    assert any(x.think_time == 0 for x in t.turns[1:])  # span 3 overlaps span 2 (fan-out)


def test_shared_prefix_from_text_blocks(tmp_path):
    """A later call repeating an earlier call's messages shares their full blocks."""
    first = [{"role": "system", "content": "x" * 2000}, {"role": "user", "content": "q1"}]
    later = first + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    spans = [{"span_id": f"s{i}", "start_time": f"2026-01-01T00:00:0{2 * i}",
              "end_time": f"2026-01-01T00:00:0{2 * i + 1}",
              "attributes": {"session.id": "one", "gen_ai.input.messages": json.dumps(m),
                             "gen_ai.usage.output_tokens": 7}}
             for i, m in enumerate((first, later))]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"trace_id": "t", "spans": spans}))
    (t,) = load_traces(str(path)).traces
    full = len(messages_text(first)) // (4 * t.block_size)  # whole blocks of the first prompt
    assert full >= 7 and t.turns[1].hash_ids[:full] == t.turns[0].hash_ids[:full]
    # the first prompt's partial last block was completed by other text: a block of its own
    assert t.turns[1].hash_ids[full] != t.turns[0].hash_ids[full]
    assert [x.out_tokens for x in t.turns] == [7, 7]


def test_bailian_chains_by_parent():
    rows = _rows(BAILIAN)
    (t,) = load_traces(str(BAILIAN)).traces
    assert [x.in_tokens for x in t.turns] == [r["input_length"] for r in rows]
    assert [x.hash_ids for x in t.turns] == [r["hash_ids"] for r in rows]
    assert t.turns[1].think_time == pytest.approx(rows[1]["timestamp"] - rows[0]["timestamp"])
    assert t.block_size == 16 and t.hash_id_scope == "global"


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_trace_stats_and_a_replay_of_each_format(kind, cli, tmp_path):
    path = SAMPLES[kind]
    r = cli("trace", "stats", path, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    ts = load_traces(str(path))
    assert st["formats"] == [kind] and st["sessions"] == len(ts.traces)
    assert st["turns"] == sum(len(t.turns) for t in ts.traces)
    assert kind in cli("trace", "stats", path).stdout
    out = tmp_path / "run"
    r = cli("run", "--trace", path, "--conc", 1, "--max-requests", 6, "--duration", 0,
            "--sim-profile", "cpu-tiny", "--sim-time-scale", 20, "--max-think", 0,
            "--no-progress", "--validate", "warn", "--scrape-interval", 0, "-o", out)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert recs and all(x["ok"] for x in recs)
    assert {x["trace_id"] for x in recs} <= {t.id for t in ts.traces}


@pytest.mark.parametrize("name,text,field", [
    ("a.jsonl", '{"session_id": "s", "input_length": 10}\n', "output_length"),
    ("b.jsonl", '{"chat_id": 1, "parent_chat_id": -1, "timestamp": "x", "input_length": 3, '
                '"output_length": 1}\n', "timestamp"),
    ("c.json", '{"spans": [{"start_time": "noon", "end_time": "2026-01-01T00:00:00", '
               '"attributes": {"gen_ai.input.messages": "[]"}}]}', "start_time"),
])
def test_bad_rows_are_one_line_errors(name, text, field, cli, tmp_path):
    (tmp_path / name).write_text(text)
    r = cli("trace", "stats", tmp_path / name)
    assert r.returncode == 2 and field in r.stderr and name in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
