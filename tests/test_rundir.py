"""The run directory (agentx/rundir.py) on real files: when it may be created or cleared, what
--overwrite removes, a write that survives its writer's crash, the merge of worker record
files, and strict vs lenient reading of JSON-lines files."""
from __future__ import annotations

import re
import subprocess
import sys

import orjson
import pytest

from agentx.errors import InputError
from agentx.records import read_records
from agentx.rundir import RunDir, default_dir, read_jsonl, trace_label, write_json


def row(rid: str, start: int, warm: bool = False) -> bytes:
    return orjson.dumps({"request_id": rid, "start_ns": start, "intended_send_ns": start,
                         "warmup": warm}) + b"\n"


def test_file_names_are_the_run_formats():
    rd = RunDir("/r")
    assert [p.name for p in (rd.run_json, rd.requests, rd.metrics, rd.summary)] == \
        ["run.json", "requests.jsonl", "metrics.jsonl", "summary.json"]
    assert rd.worker(3).name == "requests.w3.jsonl" and RunDir.WORKER.fullmatch("requests.w3.jsonl")
    assert not RunDir.WORKER.fullmatch("requests.w3.jsonl.bak")


def test_default_dir_names_the_command_time_and_parts():
    assert re.fullmatch(r"results/\d{8}-\d{6}-swe-c8", str(default_dir(trace_label("x/swe.tar.xz"), "c8")))
    assert re.fullmatch(r"results/ab-\d{8}-\d{6}-swe-c4", str(default_dir("swe", "c4", kind="ab")))
    assert re.fullmatch(r"results/calibrate-\d{8}-\d{6}", str(default_dir(kind="calibrate")))


def test_output_dir_never_mixes_runs(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.check(False)
    assert not rd.path.exists()  # nothing is created by the check
    rd.claim(False)
    with pytest.raises(InputError, match="another agentx run"):  # held: a second run refuses
        RunDir(rd.path).claim(True)
    with pytest.raises(InputError, match="another agentx run"):
        RunDir(rd.path).check(True)
    rd.summary.write_text("{}")
    (rd / "notes.txt").write_text("mine")
    rd.release()
    with pytest.raises(InputError, match="not empty"):
        rd.check(False)
    with pytest.raises(InputError, match="not empty"):
        RunDir(rd.path).claim(False)
    rd.check(True)
    rd.claim(True)
    rd.release()
    assert not rd.summary.exists() and (rd / "notes.txt").exists()
    with pytest.raises(InputError, match="not a directory"):
        RunDir(rd / "notes.txt").check(False)
    with pytest.raises(InputError, match="cannot be created"):
        RunDir(rd / "notes.txt" / "sub").check(False)


def test_overwrite_removes_the_manifests_files_only(tmp_path):
    rd = RunDir(tmp_path / "out").claim(False)
    rd.release()
    rd.worker(0).write_text("x")
    rd.register(rd.worker(0).name, RunDir.LATENCY_CDF, "../outside", "sub/x")
    for name in (RunDir.LATENCY_CDF, "diagram.png", "summary.json.bak"):
        (rd / name).write_text("x")
    (tmp_path / "outside").write_text("never touched")
    assert rd.own_files() == [*RunDir.FILES, "requests.w0.jsonl", "latency_cdf.png"]
    rd.claim(True)
    rd.release()
    assert sorted(f.name for f in rd.path.iterdir()) == [".agentx-files", "diagram.png",
                                                         "summary.json.bak"]
    assert (tmp_path / "outside").exists() and rd.own_files() == list(RunDir.FILES)


def test_overwrite_without_a_manifest_removes_fixed_names_only(tmp_path):
    rd = RunDir(tmp_path / "old-run")  # a run from before manifests
    rd.path.mkdir()
    for name in ("summary.json", "requests.w0.jsonl", "server_timeseries.png", "diagram.png",
                 "requests.w0.jsonl.bak", "my-summary.json"):
        (rd / name).write_text("x")
    rd.claim(True)
    rd.release()
    assert sorted(f.name for f in rd.path.iterdir()) == [".agentx-files", "diagram.png",
                                                         "my-summary.json", "requests.w0.jsonl.bak"]
    rd.register("latency_cdf.png", "run.json")
    assert rd.own_files() == ["run.json", "requests.jsonl", "metrics.jsonl", "summary.json",
                              "latency_cdf.png"]


CRASH = """
import os, signal, sys
from agentx.rundir import write_bytes

def chunks():
    yield b'{"new": "' + b"x" * (1 << 20)
    sys.stdout.write("half\\n"); sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # the writer dies mid-write, no clean-up runs
    yield b'"}'

write_bytes(sys.argv[1], chunks())
"""


def test_atomic_write_survives_a_crash_mid_write(tmp_path):
    """A writer SIGKILLed halfway leaves the previous file whole (its half is in `.tmp`, which
    the next write replaces)."""
    path = write_json(tmp_path / "summary.json", {"old": True})
    r = subprocess.run([sys.executable, "-c", CRASH, str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -9 and r.stdout == "half\n", r.stderr
    assert orjson.loads(path.read_bytes()) == {"old": True}
    assert (tmp_path / "summary.json.tmp").stat().st_size > 1 << 20  # the half-written one
    write_json(path, {"new": 1})
    assert orjson.loads(path.read_bytes()) == {"new": 1}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["summary.json"]


def test_worker_merge_orders_dedups_and_keeps_a_killed_workers_lines(tmp_path):
    rd = RunDir(tmp_path)
    rd.requests.write_bytes(row("a", 30))
    rd.worker(2).write_bytes(row("b", 20) + row("a", 30))  # "a" already merged once
    rd.worker(10).write_bytes(row("c", 10) + row("d", 40) + b'{"request_id": "e", "sta')
    (rd / "requests.w1.jsonl.bak").write_bytes(row("z", 1))  # not a worker file
    assert [f.name for f in rd.worker_files()] == ["requests.w2.jsonl", "requests.w10.jsonl"]
    assert rd.is_run() and not RunDir(tmp_path / "none").is_run()
    assert rd.merge_workers(warm_until_ns=25) == 2
    rows = read_records(rd.requests)
    assert [r["request_id"] for r in rows] == ["c", "b", "a", "d"]
    assert [r["warmup"] for r in rows] == [True, True, False, False]
    assert rd.worker_files() == [] and (rd / "requests.w1.jsonl.bak").exists()
    assert not list(tmp_path.glob("*.tmp")) and rd.merge_workers() == 0


def test_strict_and_lenient_reading(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(row("a", 1) + b"\n" + b"[1, 2]\n" + row("b", 2) + b'{"request_id": "c"')
    rows, bad = read_jsonl(path)  # a killed run's file: what can be read, and how much not
    assert [r["request_id"] for r in rows] == ["a", "b"] and bad == 2
    with pytest.raises(InputError, match=r"requests.jsonl:3: is not a JSON object"):
        read_jsonl(path, strict=True)
    path.write_bytes(row("a", 1) + b'{"request_id": "c"')
    with pytest.raises(InputError, match=r"requests.jsonl:2: is not JSON"):
        read_records(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == ([], 0)
    with pytest.raises(InputError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl", strict=True)


def test_read_json_says_why_a_summary_cannot_be_used(tmp_path):
    rd = RunDir(tmp_path)
    assert rd.read_json(RunDir.SUMMARY) == (None, "")
    rd.summary.write_bytes(b"")
    assert rd.read_json(RunDir.SUMMARY) == (None, "empty")
    rd.summary.write_bytes(b"[1]")
    assert rd.read_json(RunDir.SUMMARY) == (None, "not a JSON object")
    rd.summary.write_bytes(b"{")
    assert rd.read_json(RunDir.SUMMARY)[1].startswith("not valid JSON")
    rd.write_run_json({"config": {"conc": 2}})
    assert rd.read_json(RunDir.RUN) == ({"config": {"conc": 2}}, "")
