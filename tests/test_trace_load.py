"""Trace loaders: every container form, subagents, documented fallbacks, Mooncake chaining and
one-line errors for malformed input (in-process and through the CLI)."""
from __future__ import annotations

import gzip
import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest

from agentx.errors import InputError
from agentx.trace.load import BUILTIN_TRACES, load_traces
from agentx.trace.model import Subagent, Turn


def _session(sid: str, base: int = 0) -> dict:
    """A small hand-written session: 3 turns, ids growing by prefix extension."""
    return {"id": sid, "block_size": 64, "system_tokens": 100, "tool_tokens": 200,
            "hash_id_scope": "local",
            "requests": [
                {"t": 0.0, "type": "n", "in": 130 + base, "out": 7, "hash_ids": [1, 2, 3],
                 "think_time": 0.0, "api_time": 1.5, "input_types": ["text"]},
                {"t": 4.0, "type": "n", "in": 200 + base, "out": 9, "hash_ids": [1, 2, 4, 5],
                 "think_time": 2.5, "api_time": 2.0, "input_types": ["tool_result"]},
                {"t": 9.0, "type": "s", "in": 260 + base, "out": 11,
                 "hash_ids": [1, 2, 4, 5, 6], "think_time": 3.0, "api_time": 1.0,
                 "input_types": ["tool_result"]},
            ]}


SESSIONS = [_session("alpha"), _session("beta", base=1000)]


def _check(ts, ids=("alpha", "beta")) -> None:
    assert [t.id for t in ts.traces] == list(ids)
    a = ts.traces[0]
    assert [(t.in_tokens, t.out_tokens, t.hash_ids) for t in a.turns] == [
        (130, 7, [1, 2, 3]), (200, 9, [1, 2, 4, 5]), (260, 11, [1, 2, 4, 5, 6])]
    assert [t.think_time for t in a.turns] == [0.0, 2.5, 3.0]
    assert [t.kind for t in a.turns] == ["n", "n", "s"]
    assert a.turns[1].input_types == ("tool_result",)
    assert (a.block_size, a.system_tokens, a.tool_tokens) == (64, 100, 200)


def _tar(path: Path, mode: str, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _blob(doc: dict) -> bytes:
    return json.dumps(doc, indent=1).encode()


# -- containers -------------------------------------------------------------------------------
def test_single_json(tmp_path):
    p = tmp_path / "one.json"
    p.write_bytes(_blob(SESSIONS[0]))
    ts = load_traces(str(p))
    _check(ts, ids=("alpha",))
    assert ts.name == "one" and ts.traces[0].source == str(p)


def test_directory_recursive_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "b" / "x.json").write_bytes(_blob(SESSIONS[1]))
    (tmp_path / "a" / "deep" / "y.json.gz").write_bytes(gzip.compress(_blob(SESSIONS[0])))
    (tmp_path / "README.md").write_text("not a trace")
    _check(load_traces(str(tmp_path)))  # a/deep/y.json.gz sorts before b/x.json


@pytest.mark.parametrize("suffix,pack", [(".json.gz", gzip.compress), (".json.xz", lzma.compress),
                                         (".gz", gzip.compress), (".xz", lzma.compress)])
def test_compressed_single(tmp_path, suffix, pack):
    p = tmp_path / f"s{suffix}"
    p.write_bytes(pack(_blob(SESSIONS[0])))
    _check(load_traces(str(p)), ids=("alpha",))


@pytest.mark.parametrize("suffix,mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
                                         (".tar.xz", "w:xz"), (".txz", "w:xz")])
def test_tar_archives(tmp_path, suffix, mode):
    p = _tar(tmp_path / f"set{suffix}", mode, {  # members written out of order on purpose
        "set/t_b.json": _blob(SESSIONS[1]), "set/t_a.json": _blob(SESSIONS[0]),
        "set/notes.txt": b"ignored", "set/._t_a.json": b"\x00mac resource fork"})
    ts = load_traces(str(p))
    _check(ts)
    assert ts.traces[0].source == f"{p}:set/t_a.json"


def test_list_document_and_default_ids(tmp_path):
    docs = [dict(SESSIONS[0]), dict(SESSIONS[1])]
    for d in docs:
        del d["id"]
    p = tmp_path / "pair.json"
    p.write_bytes(_blob(docs))
    _check(load_traces(str(p)), ids=("pair_0", "pair_1"))


def test_builtin_name_and_unknown_name(tmp_path, monkeypatch):
    assert "swe" in BUILTIN_TRACES
    with pytest.raises(InputError) as e:
        load_traces("no-such-trace-name")
    assert "built-in traces: swe" in str(e.value)
    monkeypatch.setenv("AGENTX_TRACES_DIR", str(tmp_path))  # override the repo's traces/
    _tar(tmp_path / "swe.tar.xz", "w:xz", {"a.json": _blob(SESSIONS[0])})
    ts = load_traces("swe")
    assert ts.name == "swe" and [t.id for t in ts.traces] == ["alpha"]


# -- subagents and fallbacks ------------------------------------------------------------------
def test_subagent_entries(tmp_path):
    doc = _session("p")
    doc["requests"].insert(1, {
        "t": 2.0, "type": "subagent", "agent_id": "agent_007", "system_tokens": 50,
        "tool_tokens": 70, "requests": [
            {"t": 0.0, "in": 150, "out": 3, "hash_ids": [10, 11, 12], "api_time": 0.5},
            {"t": 1.0, "in": 210, "out": 4, "hash_ids": [10, 11, 13, 14], "api_time": 0.5}]})
    p = tmp_path / "p.json"
    p.write_bytes(_blob(doc))
    tr = load_traces(str(p)).traces[0]
    assert [type(s) for s in tr.steps] == [Turn, Subagent, Turn, Turn]
    sub = tr.subagents[0]
    assert (sub.agent_id, sub.t) == ("agent_007", 2.0)
    assert (sub.trace.id, sub.trace.system_tokens, sub.trace.tool_tokens) == ("p/agent_007", 50,
                                                                                70)
    assert [t.hash_ids for t in sub.trace.turns] == [[10, 11, 12], [10, 11, 13, 14]]
    assert sub.trace.turns[1].think_time == 0.5  # 1.0 - 0.0 - 0.5 (fallback)
    assert len(tr.turns) == 3  # the parent's own requests


def test_missing_optional_fields(tmp_path):
    doc = {"requests": [
        {"in": 130, "out": 0},                        # first: t 0, think 0, ids 1..3
        {"in": 200, "out": 5, "t": 10.0},              # think = 10 - 0 - 0 (no api_time)
        {"in": 330, "out": 5, "api_time": 2.0},        # t missing: cumulative 10 + 0 + 0
        {"in": 400, "out": 5, "t": 20.0},              # think = 20 - 10 - 2
        {"in": 300, "out": 5, "t": 21.0, "api_time": 1.0},  # shrink: keep 300 // 64 blocks
        {"in": 320, "out": 5, "t": 20.5},              # t before previous end: think clamps 0
    ]}
    p = tmp_path / "bare.json"
    p.write_bytes(_blob(doc))
    tr = load_traces(str(p)).traces[0]
    assert (tr.id, tr.block_size, tr.system_tokens, tr.tool_tokens, tr.hash_id_scope) == (
        "bare", 64, 0, 0, "local")
    turns = tr.turns
    assert turns[0].out_tokens == 1  # out 0 → 1: a replayed request generates a token
    assert [t.t for t in turns] == [0.0, 10.0, 10.0, 20.0, 21.0, 20.5]
    assert [t.think_time for t in turns] == [0.0, 10.0, 0.0, 8.0, 1.0, 0.0]
    assert [t.api_time for t in turns] == [None, None, 2.0, None, 1.0, None]
    # ceil(in/64) ids; the previous turn's full blocks (prev in // 64) that still fit
    # (in // 64) are kept, then fresh ids: 130 → 3 ids; 200 keeps 2 of them; 330 keeps 3;
    # 400 keeps 5; 300 (shrink) keeps 4; 320 keeps 4
    assert [t.hash_ids for t in turns] == [
        [1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 6, 7, 8], [1, 2, 4, 6, 7, 9, 10],
        [1, 2, 4, 6, 11], [1, 2, 4, 6, 12]]


def test_missing_hash_ids_after_explicit_ones(tmp_path):
    doc = {"block_size": 10, "requests": [
        {"in": 25, "out": 1, "hash_ids": [40, 41, 90]},
        {"in": 41, "out": 1},  # keeps 2 full blocks of 25; fresh ids start above 90
    ]}
    p = tmp_path / "mix.json"
    p.write_bytes(_blob(doc))
    assert [t.hash_ids for t in load_traces(str(p)).traces[0].turns] == [
        [40, 41, 90], [40, 41, 91, 92, 93]]


# -- Mooncake ---------------------------------------------------------------------------------
MOONCAKE = [  # timestamp ms, input_length, output_length, hash_ids (block 512)
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
    # extends request 1 beyond its partial last block (rule b) → session A
    {"timestamp": 2000, "input_length": 1600, "output_length": 20, "hash_ids": [1, 3, 4, 5]},
    # has request 2's ids as a strict prefix (rule a) → session B
    {"timestamp": 2500, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
    # shares [1] with request 1 but is not longer than it → new session C
    {"timestamp": 3000, "input_length": 900, "output_length": 5, "hash_ids": [1, 99]},
    # two identical first requests (D, then E), then a continuation of that prompt:
    # the latest of the two (E) wins
    {"timestamp": 4000, "input_length": 1000, "output_length": 5, "hash_ids": [50, 51]},
    {"timestamp": 4100, "input_length": 1000, "output_length": 5, "hash_ids": [50, 51]},
    {"timestamp": 5000, "input_length": 1500, "output_length": 0, "hash_ids": [50, 52, 53]},
]


def _mooncake_bytes(records=MOONCAKE) -> bytes:
    return b"\n".join(json.dumps(r).encode() for r in records) + b"\n"


@pytest.mark.parametrize("name,pack", [("m.jsonl", None), ("m.jsonl.gz", gzip.compress),
                                       ("m.jsonl.xz", lzma.compress), ("m.json", None)])
def test_mooncake_chaining(tmp_path, name, pack):
    p = tmp_path / name
    data = _mooncake_bytes()
    p.write_bytes(pack(data) if pack else data)  # m.json: recognised by content
    ts = load_traces(str(p))
    assert ts.block_size == 512
    sessions = [[t.hash_ids for t in tr.turns] for tr in ts.traces]
    assert sessions == [[[1, 2], [1, 3, 4, 5]], [[7, 8], [7, 8, 9]], [[1, 99]], [[50, 51]],
                        [[50, 51], [50, 52, 53]]]
    a, e = ts.traces[0], ts.traces[4]
    assert all(tr.hash_id_scope == "global" and tr.block_size == 512 for tr in ts.traces)
    assert [(t.t, t.think_time, t.api_time) for t in a.turns] == [(0.0, 0.0, None),
                                                                   (2.0, 2.0, None)]
    assert [(t.t, t.think_time) for t in e.turns] == [(0.0, 0.0), (0.9, 0.9)]
    assert e.turns[1].out_tokens == 1  # output_length 0 → 1
    assert [tr.id for tr in ts.traces] == [f"m-{i:05d}" for i in range(5)]


def test_mooncake_unsorted_and_without_hash_ids(tmp_path):
    recs = [dict(MOONCAKE[2]), dict(MOONCAKE[0]),
            {"timestamp": 10, "input_length": 1100, "output_length": 3}]
    p = tmp_path / "u.jsonl"
    p.write_bytes(_mooncake_bytes(recs))
    ts = load_traces(str(p))
    # sorted by time: r1(0) → session A; no-id request (10) gets fresh ids 6,7,8 → session B;
    # r3(2000) continues A
    assert [[t.hash_ids for t in tr.turns] for tr in ts.traces] == [
        [[1, 2], [1, 3, 4, 5]], [[6, 7, 8]]]


# -- malformed input --------------------------------------------------------------------------
BAD = {
    "syntax": ('bad_syntax.json', b'{"requests": [\n  {"in": 5, "out": 1},\n  {"in": 6,, }\n]}',
               ":3:", None),
    "missing_in": ("missing_in.json", _blob({"requests": [{"in": 5, "out": 1}, {"out": 2}]}),
                   ":requests[1]:", "'in'"),
    "hash_ids_type": ("bad_ids.json", _blob({"requests": [{"in": 5, "out": 1,
                                                            "hash_ids": "1,2"}]}),
                      ":requests[0]:", "'hash_ids'"),
    "negative_out": ("neg_out.json", _blob({"requests": [{"in": 5, "out": 1},
                                                         {"in": 9, "out": -3}]}),
                     ":requests[1]:", "'out'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_raises_input_error(tmp_path, case):
    name, data, where, field = BAD[case]
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        load_traces(str(p))
    msg = str(e.value)
    assert f"{p}{where}" in msg and "\n" not in msg
    assert field is None or f"field {field}" in msg


def test_malformed_nested_and_archived(tmp_path):
    doc = _session("p")
    doc["requests"].append({"type": "subagent", "requests": [{"in": 5, "out": 1},
                                                              {"in": 7, "out": 2,
                                                               "hash_ids": [1, "x"]}]})
    p = _tar(tmp_path / "a.tar.gz", "w:gz", {"ok.json": _blob(SESSIONS[0]),
                                             "bad.json": _blob(doc)})
    with pytest.raises(InputError) as e:
        load_traces(str(p))
    assert str(e.value).startswith(f"error: {p}:bad.json:requests[3].requests[1]: "
                                   "field 'hash_ids'")


def test_malformed_mooncake_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_bytes(_mooncake_bytes(MOONCAKE[:2]) + b'{"timestamp": 5, "output_length": 1}\n')
    with pytest.raises(InputError) as e:
        load_traces(str(p))
    assert str(e.value) == f"error: {p}:3: field 'input_length' missing"


@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_malformed_exits_2_with_one_line(tmp_path, case, cli):
    name, data, where, field = BAD[case]
    p = tmp_path / name
    p.write_bytes(data)
    r = cli("trace", "stats", p)  # in-process (conftest); the exit code is main()'s
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert f"{p}{where}" in lines[0]
    assert field is None or f"field {field}" in lines[0]
