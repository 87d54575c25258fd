"""Property-based fuzzing of the trace loaders (Weka JSON, Mooncake JSONL, compressed files):
whatever the bytes, loading either succeeds or raises one InputError line naming the file
(and, where there is one, the record or line and the field). Never a traceback, never an
attempt to allocate billions of ids."""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentx.errors import InputError
from agentx.trace.load import load_traces

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# numbers at the edges that broke loaders before: huge ints, 1e308, negatives, -0.0
numbers = st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0, 1, 64, 1e308, 20_000_000_000, -1, 2.5, 1 << 24]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8))
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                  st.dictionaries(st.text(max_size=6), c,
                                                                  max_size=4)),
                      max_leaves=12)
TURN_KEYS = ["in", "out", "hash_ids", "t", "think_time", "api_time", "type", "input_types",
             "requests", "agent_id", "system_tokens", "tool_tokens"]
turn = st.dictionaries(st.sampled_from(TURN_KEYS),
                       st.one_of(values, st.lists(numbers, max_size=6)), max_size=8)
session = st.fixed_dictionaries(
    {"requests": st.lists(st.one_of(turn, values), max_size=5)},
    optional={"id": values, "block_size": values, "hash_id_scope": values,
              "system_tokens": values, "tool_tokens": values})
MOONCAKE_KEYS = ["timestamp", "input_length", "output_length", "hash_ids"]
mooncake_line = st.dictionaries(st.sampled_from(MOONCAKE_KEYS),
                                st.one_of(numbers, st.lists(numbers, max_size=4), values),
                                min_size=2, max_size=4)


def _check(data: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        try:
            ts = load_traces(str(path))
        except InputError as err:
            msg = str(err)
            assert msg.startswith("error: ") and "\n" not in msg, msg
            assert str(path) in msg, msg
        else:
            assert ts.traces  # a successful load holds sessions with turns
            for tr in ts.traces:
                assert tr.steps


@FUZZ
@given(session)
def test_weka_session_documents(doc):
    _check(json.dumps(doc).encode(), "s.json")


@FUZZ
@given(st.lists(session, max_size=3))
def test_weka_session_lists(docs):
    _check(json.dumps(docs).encode(), "s.json")


@FUZZ
@given(st.lists(st.one_of(mooncake_line, values), min_size=1, max_size=6))
def test_mooncake_jsonl(lines):
    data = b"\n".join(json.dumps(x).encode() for x in lines)
    # the first line must look like Mooncake for the JSONL path to be taken
    head = json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1}).encode()
    _check(head + b"\n" + data, "m.jsonl")


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(blob):
    _check(blob, "x.json")
    _check(blob, "x.jsonl")
    _check(blob, "x.json.gz")
    _check(gzip.compress(blob), "y.json.gz")
