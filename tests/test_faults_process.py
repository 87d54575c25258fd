"""Faults of our own processes and of the disk, real ones (issue 20: 2, 3, 5, 6, 10, 16): a
worker SIGKILLed or frozen mid-run, a second Ctrl-C while one is frozen, a full filesystem (a
tmpfs of a few hundred KB) under a run and under `agentx report`, a summary.json left broken,
`--overwrite` over a user's files, and Ctrl-C during start-up. docs/reliability.md says what
each must do; each test checks the exit status, the one line said, and what stays on disk."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from helpers import write_trace
from test_kill import complete_lines, descendants, kill_all, wait_gone

REPO = Path(__file__).resolve().parents[1]
PY = [sys.executable]
SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20"]


def bench(tmp_path: Path, out: Path, *args: str, think: float = 0.05) -> list[str]:
    """bench.py (= `agentx run`) on a small trace against the embedded simulator."""
    trace = tmp_path / "tr"
    if not trace.exists():
        write_trace(trace, think=think, out=50)
    return [*PY, str(REPO / "bench.py"), "--trace", str(trace), "--conc", "4", "--max-think",
            "0.2", *SIM, "--no-progress", "--min-samples", "1", "--output-dir", str(out), *args]


def agentx(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, "-m", "agentx.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def worker_pids(out: Path) -> dict[int, int]:
    """{worker index: pid} of the processes holding a requests.w<N>.jsonl of `out` open."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                target = os.readlink(fd)
                m = re.fullmatch(re.escape(str(out)) + r"/requests\.w(\d+)\.jsonl", target)
                if m:
                    found[int(m.group(1))] = int(d.name)
        except OSError:
            continue
    return found


def wait_workers(p: subprocess.Popen, out: Path, records: int = 5,
                 timeout: float = 60) -> dict[int, int]:
    """Both workers running and worker 1 with `records` whole records on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        pids = worker_pids(out)
        if len(pids) == 2 and len(complete_lines(out / "requests.w1.jsonl")) >= records:
            return pids
        time.sleep(0.1)
    kill_all({p.pid} | descendants(p.pid))
    raise AssertionError(f"workers did not start (exit {p.poll()})")


def ids_of(*files: Path) -> set[str]:
    return {orjson.loads(line)["request_id"] for f in files for line in complete_lines(f)}


def finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs = {p.pid} | descendants(p.pid)
        kill_all(procs)
        p.communicate()
        raise AssertionError(f"the run did not end within {timeout} s") from None
    assert "Traceback" not in err, err[-3000:]
    return p.returncode, err, time.monotonic() - t0


# --- a worker lost --------------------------------------------------------------------------

def lost_worker_run(tmp_path: Path, sig: signal.Signals, *, interrupt: bool = False):
    out = tmp_path / "out"
    p = start(bench(tmp_path, out, "--workers", "2", "--duration", "30", "--drain-timeout", "3"))
    pids = wait_workers(p, out)
    procs = {p.pid} | descendants(p.pid)
    before = ids_of(out / "requests.w1.jsonl")
    os.kill(pids[1], sig)
    if interrupt:  # two Ctrl-C, as a user at a terminal would (to the parent: w0 is healthy)
        for _ in range(2):
            time.sleep(0.5)
            os.kill(p.pid, signal.SIGINT)
    rc, err, took = finish(p, timeout=25)  # on a timeout, every process is killed
    left = wait_gone(procs)
    kill_all(left)
    assert not left, "a process of the run outlived it"
    summary = orjson.loads((out / "summary.json").read_bytes())
    kept = ids_of(out / "requests.jsonl")
    assert before <= kept, f"{len(before - kept)} records of the lost worker were dropped"
    assert not list(out.glob("requests.w*.jsonl")) and not list(out.glob("*.tmp"))
    return rc, err, took, summary


def test_killed_worker_fails_the_run(tmp_path):
    """Before: the run went on with half its lanes, `stop_reason: duration`, verdict pass,
    exit 0, and one stderr line `worker errors: w1: worker exited with code -9`."""
    rc, err, took, summary = lost_worker_run(tmp_path, signal.SIGKILL)
    assert rc == 3, err
    reason = "error: worker w1 (lanes 1, 3) lost: killed by SIGKILL"
    assert summary["stop_reason"].startswith(reason)
    assert summary["validation"]["verdict"] == "fail"
    assert any(reason in r for r in summary["validation"]["reasons"])
    assert "agentx: worker w1 (lanes 1, 3) lost: killed by SIGKILL" in err
    assert took < 15, "the other worker was not stopped when w1 was lost"


def test_frozen_worker_is_killed_and_named(tmp_path):
    """Before: SIGSTOP on one worker hung the parent for ever (two Ctrl-C did not end it)."""
    from agentx.engine.workers import SILENT_LIMIT_S

    rc, err, took, summary = lost_worker_run(tmp_path, signal.SIGSTOP)
    assert rc == 3, err
    assert summary["stop_reason"].startswith("error: worker w1 (lanes 1, 3) lost: silent for")
    assert "killed (SIGKILL)" in summary["stop_reason"]
    assert summary["validation"]["verdict"] == "fail"
    assert took < SILENT_LIMIT_S + 8


def test_second_ctrl_c_ends_a_run_with_a_frozen_worker(tmp_path):
    from agentx.engine.workers import KILL_GRACE_S

    rc, err, took, summary = lost_worker_run(tmp_path, signal.SIGSTOP, interrupt=True)
    assert rc == 130, err
    assert summary["stop_reason"] == "signal"
    assert summary["validation"]["verdict"] == "interrupted"
    assert "worker w1 (lanes 1, 3) lost: still running past the forced stop" in err
    assert took < 1 + KILL_GRACE_S + 6


def test_every_worker_lost_is_one_line_exit_4_and_report_rebuilds(tmp_path):
    out = tmp_path / "out"
    p = start(bench(tmp_path, out, "--workers", "2", "--duration", "30"))
    pids = wait_workers(p, out)
    before = ids_of(*out.glob("requests.w*.jsonl"))
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    rc, err, _ = finish(p, timeout=20)
    assert rc == 4, err
    assert [x for x in err.splitlines() if x.startswith("agentx: every worker was lost")], err
    assert not (out / "summary.json").exists()
    assert before <= ids_of(out / "requests.jsonl")  # merged: nothing written was lost
    r = agentx("report", "--no-plots", str(out))
    assert r.returncode == 0, r.stderr


# --- a full disk ----------------------------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path):
    """A 200 KB tmpfs (root on Linux: CI here); skipped, saying why, where it cannot mount."""
    mnt = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root on Linux): "
                    f"{(r.stderr or r.stdout).strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def grow(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)


def check_disk_full(err: str, rc: int, out: Path) -> int:
    """Exit 2 and one line naming the file and the system's reason; every record on disk is a
    whole line; nothing half-written. Returns the number of records kept."""
    assert rc == 2, err
    lines = [x for x in err.splitlines() if "No space left on device" in x]
    assert len(lines) == 1 and str(out) in lines[0] and lines[0].startswith("error: "), err
    assert not list(out.glob("*.tmp")), "a half-written temporary file was left"
    n = 0
    for f in out.glob("requests*.jsonl"):
        data = f.read_bytes()
        assert not data or data.endswith(b"\n"), f"{f.name}: a cut-off last line"
        n += sum(1 for line in data.splitlines() if orjson.loads(line))
    return n


def test_disk_full_single_process_then_report(tmp_path, tiny_fs):
    """Before: `orjson.JSONDecodeError` traceback, exit 1, no summary, ENOSPC never named
    (201 readable records of 203 completed); `agentx report` on the full disk then left a
    0-byte summary.json that every later report refused as 'not valid JSON'."""
    out = tiny_fs / "out"
    rc, err, _ = finish(start(bench(tmp_path, out, "--duration", "40")), timeout=60)
    kept = check_disk_full(err, rc, out)
    assert f"{out / 'requests.jsonl'}: cannot write: No space left on device" in err
    assert kept >= 10 and not (out / "summary.json").exists()
    assert f"the {kept} records written before are kept" in err
    r = agentx("report", "--no-plots", str(out))  # still full: nothing half-written either
    assert r.returncode == 2 and "summary.json: cannot write: No space left" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (out / "summary.json").exists()
    assert not list(out.glob("*.tmp"))
    (out / "summary.json").write_bytes(b"")  # what the report left before this fix
    grow(tiny_fs)
    r = agentx("report", "--no-plots", str(out))
    assert r.returncode == 0, r.stderr
    assert "summary.json is empty: rebuilt it from the records" in r.stdout
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["rebuilt_from"]["records"] == kept
    assert summary["rebuilt_from"]["broken_summary"] == "empty"


def test_disk_full_with_workers_then_report(tmp_path, tiny_fs):
    """Before: an ENOSPC traceback from the merge, exit 1, an empty requests.jsonl.tmp."""
    out = tiny_fs / "out"
    p = start(bench(tmp_path, out, "--duration", "40", "--workers", "2"))
    rc, err, _ = finish(p, timeout=60)
    kept = check_disk_full(err, rc, out)
    assert kept >= 10
    assert not (out / "summary.json").exists()
    grow(tiny_fs)
    r = agentx("report", "--no-plots", str(out))
    assert r.returncode == 0, r.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["rebuilt_from"]["records"] == kept
    assert summary["rebuilt_from"]["worker_files_merged"] == 2


def test_write_json_replaces_whole_or_not_at_all(tmp_path, tiny_fs):
    from agentx.errors import OutputError
    from agentx.rundir import write_json

    path = tiny_fs / "summary.json"
    write_json(path, {"old": True})
    with pytest.raises(OutputError, match="summary.json: cannot write: No space left"):
        write_json(path, {"big": "x" * 400_000})
    assert orjson.loads(path.read_bytes()) == {"old": True}
    assert [f.name for f in tiny_fs.iterdir()] == ["summary.json"]


# --- --overwrite ----------------------------------------------------------------------------

def test_overwrite_removes_only_the_runs_own_files(tmp_path):
    """Before: `--overwrite` removed the user's diagram.png (a `*.png` pattern)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "diagram.png").write_bytes(b"\x89PNG mine")
    (out / "latency_cdf.png").write_bytes(b"\x89PNG a previous report's plot")
    (out / "requests.w3.jsonl").write_bytes(b"{}\n")  # a previous run's unmerged worker file
    (out / ".agentx-files").write_text("run.json\nlatency_cdf.png\nrequests.w3.jsonl\n"
                                       "../outside\n")
    (tmp_path / "outside").write_text("never touched")
    r = subprocess.run(bench(tmp_path, out, "--duration", "2", "--overwrite", "--validate",
                             "warn"), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    left = {f.name for f in out.iterdir()}
    assert {"notes.txt", "diagram.png", "summary.json", "requests.jsonl"} <= left
    assert not {"latency_cdf.png", "requests.w3.jsonl"} & left
    assert (tmp_path / "outside").exists()
    assert (out / ".agentx-files").read_text().split() == [
        "run.json", "requests.jsonl", "metrics.jsonl", "summary.json", "sessions.csv", "turns.csv"]


# --- Ctrl-C during start-up -----------------------------------------------------------------

@pytest.mark.parametrize("at, workers", [(0.3, 1), (1.0, 1), (1.8, 1), (2.0, 2)])
def test_ctrl_c_during_start_up(tmp_path, at, workers):
    """Before: a KeyboardInterrupt traceback (up to three: agentx, the embedded simulator and
    the scraper child, or a worker's), exit -2 or 1. The terminal's SIGINT reaches the whole
    process group; whatever phase it hits, one line and exit 130."""
    out = tmp_path / "out"
    p = start(bench(tmp_path, out, "--duration", "5", "--workers", str(workers)))
    procs: set[int] = set()
    deadline = time.monotonic() + at
    while time.monotonic() < deadline:
        procs |= descendants(p.pid)
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    rc, err, _ = finish(p, timeout=40)
    assert rc == 130, err
    assert "KeyboardInterrupt" not in err
    said = [x for x in err.splitlines() if x.strip() and "warning" not in x]
    assert said in (["agentx: interrupted"],
                    ["agentx: stopping — draining in-flight requests (Ctrl-C again to cancel)"]), err
    assert not wait_gone(procs | descendants(p.pid))
