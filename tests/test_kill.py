"""Killed processes, real ones: the client SIGKILLed (one process, `--workers 2`, the embedded
simulator's child), the server SIGKILLed or frozen (SIGSTOP) mid-run. Afterwards no process of
the run is left, every record finished before the kill is one whole line, `agentx report`
rebuilds the summary, and a run whose server died ends within its timeouts with each failed
request classified (docs/reliability.md)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]
PY = [sys.executable]
ERROR_CLASSES = {"connect", "reset", "timeout", "incomplete", "cancelled", "client_error",
                 "malformed", "stream_error"}


# --- processes ----------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None once it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return None if state in ("Z", "X") else (state, int(ppid))


def descendants(pid: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))):
            parents.setdefault(st[1], []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def wait_gone(pids: set[int], timeout: float = 20.0) -> set[int]:
    """The pids still alive after `timeout` s (an orphan needs a moment to see its parent go)."""
    deadline = time.monotonic() + timeout
    while (alive := {p for p in pids if _stat(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def kill_all(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def sim_server():
    """`python -m agentx.sim` (what `agentx serve-sim` runs) on a free port, cpu-tiny timing
    at 2x; killed (and thawed first, if a test froze it) at the end."""
    p = subprocess.Popen([*PY, "-m", "agentx.sim", "--port", "0", "--profile", "cpu-tiny",
                          "--time-scale", "2"], cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line and p.poll() is not None:
                break
            if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
        assert port, "serve-sim did not start"
        yield p, f"http://127.0.0.1:{port}"
    finally:
        kill_all({p.pid})
        p.wait(10)
        p.stderr.close()


# --- a run --------------------------------------------------------------------------------

def start_run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """bench.py (= `agentx run`) with short requests and think times, scraping every 0.5 s."""
    trace = write_trace(tmp_path / "tr", think=0.05, out=200)
    out = tmp_path / "out"
    p = subprocess.Popen([*PY, str(REPO / "bench.py"), "--trace", str(trace), "--conc", "4",
                          "--duration", "60", "--max-think", "0.2", "--scrape-interval", "0.5",
                          "--no-progress", "--output-dir", str(out), *args],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    return p, out


def complete_lines(path: Path) -> list[bytes]:
    data = path.read_bytes() if path.exists() else b""
    return data[:data.rfind(b"\n") + 1].splitlines()


def wait_for(out: Path, p: subprocess.Popen, records: int, scrapes: int = 0,
             timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        n = sum(len(complete_lines(f)) for f in out.glob("requests*.jsonl"))
        if n >= records and len(complete_lines(out / "metrics.jsonl")) >= scrapes:
            return
        time.sleep(0.2)
    raise AssertionError(f"run did not reach {records} records / {scrapes} scrapes "
                         f"(exit {p.poll()}): {p.stderr.read().decode()[-1500:] if p.poll() else ''}")


def snapshot(out: Path) -> tuple[set[str], int]:
    """request ids of every whole record line on disk (each must parse), /metrics rows."""
    ids = set()
    for f in out.glob("requests*.jsonl"):
        ids |= {orjson.loads(line)["request_id"] for line in complete_lines(f)}
    return ids, len(complete_lines(out / "metrics.jsonl"))


def report(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, "-c", "import sys; from agentx.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "report", "--no-plots", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def kill_client_and_check(p: subprocess.Popen, out: Path) -> None:
    """SIGKILL the run's main process only: its children must go by themselves; then the
    records and scrapes on disk at the kill survive into `agentx report`'s summary."""
    procs = {p.pid} | descendants(p.pid)
    ids, scrapes = snapshot(out)
    p.kill()
    p.wait(10)
    p.stderr.close()
    left = wait_gone(procs)
    kill_all(left)
    assert not left, f"processes of the killed run still alive: {sorted(left)}"
    r = report(out)
    assert r.returncode == 0, r.stderr
    assert not list(out.glob("requests.w*.jsonl")), "worker files not merged"
    lines = (out / "requests.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"", "requests.jsonl does not end with a whole line"
    recs = [orjson.loads(line) for line in lines[:-1]]  # every line parses
    got = [r["request_id"] for r in recs]
    assert len(got) == len(set(got)), "a request recorded twice"
    assert ids <= set(got), f"{len(ids - set(got))} records written before the kill were lost"
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["rebuilt"] and summary["stop_reason"] == "killed"
    assert summary["rebuilt_from"]["records"] == len(recs)
    assert summary["rebuilt_from"]["metrics_rows"] >= scrapes >= 2
    assert summary["server_metrics"], "the partial metrics.jsonl was not used"


def test_client_sigkill_single_process(tmp_path, sim_server):
    p, out = start_run(tmp_path, "--base-url", sim_server[1])
    wait_for(out, p, records=6, scrapes=2)
    kill_client_and_check(p, out)


def test_client_sigkill_with_workers(tmp_path, sim_server):
    """The issue's case: before, the workers kept loading the server to the end of --duration
    and then hung on their Queue; their records stayed in unmerged requests.w*.jsonl."""
    p, out = start_run(tmp_path, "--base-url", sim_server[1], "--workers", "2")
    wait_for(out, p, records=6, scrapes=2)
    assert len(descendants(p.pid)) >= 2
    kill_client_and_check(p, out)
    # the orphans stopped loading the server: its /metrics counters stand still
    import urllib.request

    def requests_seen() -> str:
        page = urllib.request.urlopen(sim_server[1] + "/metrics", timeout=10).read().decode()
        return "".join(x for x in page.splitlines() if x.startswith("vllm:request_success_total"))

    before = requests_seen()
    time.sleep(1.5)
    assert requests_seen() == before


def test_client_sigkill_takes_the_embedded_simulator_along(tmp_path):
    p, out = start_run(tmp_path, "--sim-profile", "cpu-tiny", "--sim-time-scale", "2")
    wait_for(out, p, records=3, scrapes=2)
    assert descendants(p.pid), "the embedded simulator runs in a child process"
    kill_client_and_check(p, out)


# --- the server dies or freezes -----------------------------------------------------------

def finish(p: subprocess.Popen, out: Path, timeout: float) -> tuple[int, str, dict, list[dict]]:
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all({p.pid} | descendants(p.pid))
        raise AssertionError(f"the run did not end within {timeout} s of the server fault") \
            from None
    assert "Traceback" not in err.decode(), err.decode()[-2000:]
    assert time.monotonic() - t0 < timeout
    summary = orjson.loads((out / "summary.json").read_bytes())
    recs = [orjson.loads(line) for line in (out / "requests.jsonl").read_bytes().splitlines()]
    return p.returncode, err.decode(), summary, recs


def test_server_sigkill_mid_run(tmp_path, sim_server):
    server, url = sim_server
    p, out = start_run(tmp_path, "--base-url", url, "--timeout", "5", "--connect-timeout", "2",
                       "--drain-timeout", "5")
    wait_for(out, p, records=4)
    procs = {p.pid} | descendants(p.pid)
    server.kill()
    rc, err, summary, recs = finish(p, out, timeout=45)  # far from the 60 s --duration
    assert rc not in (0, 1), err  # aborted (4) or a failed verdict (3), never a clean exit
    failed = [r for r in recs if not r["ok"]]
    assert failed and {r["error"] for r in failed} <= ERROR_CLASSES, {r["error"] for r in failed}
    assert {r["error"] for r in failed} & {"connect", "reset", "incomplete"}
    assert summary["validation"]["verdict"] != "pass"
    assert not wait_gone(procs)


def test_server_frozen_mid_run(tmp_path, sim_server):
    """SIGSTOP: the kernel still accepts connections, nothing answers. Requests end at the
    2 s read timeout as `timeout`; the run ends (abort or duration) instead of hanging."""
    server, url = sim_server
    p, out = start_run(tmp_path, "--base-url", url, "--timeout", "2", "--connect-timeout", "2",
                       "--drain-timeout", "3", "--duration", "12")
    wait_for(out, p, records=4)
    procs = {p.pid} | descendants(p.pid)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        rc, err, summary, recs = finish(p, out, timeout=50)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert rc not in (0, 1), err
    failed = [r for r in recs if not r["ok"]]
    assert failed and {r["error"] for r in failed} <= ERROR_CLASSES, {r["error"] for r in failed}
    assert "timeout" in {r["error"] for r in failed}
    assert summary["validation"]["verdict"] != "pass"
    assert not wait_gone(procs)


def test_agentx_serve_sigkill_stops_the_server_group(tmp_path):
    """The server leads its own process group, out of reach of anything the kernel does when
    agentx dies; the guard beside it (agentx.recipe.guard) stops the group instead."""
    p = subprocess.Popen([*PY, "-m", "agentx.cli", "serve", "tiny-cpu", "--sim", "--port", "0",
                          "--workdir", str(tmp_path), "--quiet"], cwd=REPO,
                         stderr=subprocess.PIPE, text=True)
    try:
        line, deadline = "", time.monotonic() + 60
        while "ready:" not in line and time.monotonic() < deadline:
            line = p.stderr.readline()
            assert line or p.poll() is None, "agentx serve exited early"
        kids = descendants(p.pid)
        assert len(kids) >= 2  # the server and its guard
        p.kill()
        p.wait(10)
        left = wait_gone(kids)
        kill_all(left)
        assert not left, f"server processes outlived agentx serve: {sorted(left)}"
    finally:
        kill_all({p.pid})
        p.stderr.close()
