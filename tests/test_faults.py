"""Fault matrix: each fault a server (or the user) can inflict on a run, through the real CLI in
a subprocess. Each case checks the record's error class, the exit status (docs/reliability.md),
that summary.json exists and that requests.jsonl holds one valid line per finished request.

Faults come from the embedded simulator's injection (--sim-fail-rate 1 --sim-fail-kinds K: every
request hit, so the error-rate abort ends the run after 10), from a raw HTTP server below for
what the simulator cannot send (a non-JSON data line, broken chunked framing), and from real
sockets and processes (nothing listening, a listener that never answers, a killed server)."""
from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from helpers import free_port, wait_healthy, write_trace

REPO = Path(__file__).resolve().parents[1]
EXIT_BAD_INPUT, EXIT_FAILED, EXIT_ABORTED, EXIT_INTERRUPTED = 2, 3, 4, 130
SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("tr"), think=0.0, out=40)


def bench(out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "bench.py"), "--output-dir", str(out), "--no-progress",
           *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def results(out: Path) -> tuple[dict, list[dict]]:
    """summary.json and the records; every line must parse, ids are unique, and the lines are
    exactly the requests the summary counted."""
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "requests.jsonl").read_bytes().splitlines()
    recs = [orjson.loads(ln) for ln in lines]
    assert len({r["request_id"] for r in recs}) == len(recs)
    counted = (summary["completed"] + summary["failed"] + summary["cancelled"]
               + summary["warmup_requests"])
    assert counted == len(recs), (counted, len(recs))
    return summary, recs


# --- faults injected by the simulator ----------------------------------------------------------
# (kind, extra flags, error class in the record). A stall or slow headers longer than --timeout
# is a `timeout`; a data line with broken JSON is `malformed`.
SIM_FAULTS = [
    ("429", [], "http_429"),
    ("500", [], "http_500"),
    ("503", [], "http_503"),
    ("reset", [], "reset"),
    ("stall", ["--timeout", "0.5", "--sim-stall-s", "3"], "timeout"),
    ("malformed", [], "malformed"),
    ("slow-headers", ["--timeout", "0.5", "--sim-slow-headers-s", "3"], "timeout"),
]


@pytest.mark.parametrize("kind,extra,error", SIM_FAULTS, ids=[k for k, _, _ in SIM_FAULTS])
def test_injected_fault_is_classified_and_aborts(tmp_path, trace, kind, extra, error):
    out = tmp_path / "out"
    p = bench(out, "--trace", str(trace), "--conc", "2", "--duration", "60", *SIM,
              "--sim-fail-rate", "1", "--sim-fail-kinds", kind, *extra)
    assert p.returncode == EXIT_ABORTED, p.stderr[-2000:]
    summary, recs = results(out)
    finished = [r for r in recs if r["error"] != "cancelled"]
    assert finished and all(r["error"] == error and not r["ok"] for r in finished)
    assert summary["stop_reason"] == (f"aborted: error rate 100% over last 10 requests "
                                      f"(most common: {error})")
    assert summary["validation"]["verdict"] == "fail"
    assert summary["stop_reason"] in p.stderr  # said on the console too, not only in the file
    assert "Traceback" not in p.stderr


def test_abort_in_worker_processes_ends_the_run(tmp_path, trace):
    """--workers 2: each process judges its own requests; the first abort stops the others (the
    parent forwards a forced stop), so the run ends with exit 4 and one merged summary."""
    out = tmp_path / "out"
    p = bench(out, "--trace", str(trace), "--conc", "4", "--workers", "2", "--duration", "60",
              *SIM, "--sim-fail-rate", "1", "--sim-fail-kinds", "500")
    assert p.returncode == EXIT_ABORTED, p.stderr[-2000:]
    summary, recs = results(out)
    assert summary["stop_reason"].startswith("aborted: error rate 100%")
    assert summary["client"]["workers"] == 2
    assert {r["error"] for r in recs} <= {"http_500", "cancelled"}


def test_some_errors_fail_the_verdict_without_aborting(tmp_path, trace):
    """A quarter of the requests fail: below --max-error-rate, so the run goes to its end, but
    the verdict fails (error rate > 1%): exit 3, or 0 under --validate warn."""
    flags = ["--trace", str(trace), "--conc", "2", "--duration", "0", "--max-requests", "24",
             *SIM, "--sim-fail-rate", "0.25", "--sim-fail-kinds", "429,500", "--sim-seed", "1",
             "--scrape-interval", "0.5", "--loop-lag-threshold", "1000"]
    p = bench(tmp_path / "strict", *flags)
    assert p.returncode == EXIT_FAILED, p.stderr[-2000:]
    summary, recs = results(tmp_path / "strict")
    classes = Counter(r["error"] for r in recs if not r["ok"])
    assert set(classes) <= {"http_429", "http_500"} and sum(classes.values()) >= 2
    assert summary["stop_reason"] == "max_requests"
    assert summary["validation"]["verdict"] == "fail"
    assert any(r.startswith("error_rate:") for r in summary["validation"]["reasons"])
    warn = bench(tmp_path / "warn", *flags, "--validate", "warn")
    assert warn.returncode == 0, warn.stderr[-2000:]
    assert "validation: fail" in warn.stdout


# --- faults the simulator cannot send: a raw HTTP/1.1 server ------------------------------------
MODELS = b'{"object":"list","data":[{"id":"raw","object":"model","max_model_len":100000}]}'


def _chunk(n: int) -> bytes:
    return (b'data: {"id":"x","object":"chat.completion.chunk","model":"raw","choices":[{"index":0,'
            b'"delta":{"content":"w "},"finish_reason":null}],"usage":{"prompt_tokens":10,'
            b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (n, 10 + n))


BODIES = {
    # a data line that is not JSON at all (an HTML error page inside the stream)
    "sse-garbage": _chunk(1) + b"data: <html>502 Bad Gateway</html>\n\n" + _chunk(2)
    + b"data: [DONE]\n\n",
    # the stream ends without [DONE] (a proxy cut it)
    "truncated": _chunk(1) + _chunk(2),
}


class _Raw(socketserver.BaseRequestHandler):
    mode = "sse-garbage"

    def handle(self) -> None:
        f = self.request.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = f.readline()
            if not line:
                return
            head += line
        length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        f.read(length)
        if head.startswith(b"GET /v1/models"):
            self._send(b"200 OK", b"application/json", MODELS)
        elif head.startswith(b"POST /v1/chat/completions"):
            if self.mode == "bad-chunk":
                self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n")
            else:
                self._send(b"200 OK", b"text/event-stream", BODIES[self.mode])
        else:
            self._send(b"404 Not Found", b"text/plain", b"not here")

    def _send(self, status: bytes, ctype: bytes, body: bytes) -> None:
        self.request.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype
                             + b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
                             + body)


@pytest.mark.parametrize("mode,error", [("sse-garbage", "malformed"), ("truncated", "incomplete"),
                                        ("bad-chunk", "client_error")])
def test_raw_server_faults(tmp_path, trace, mode, error):
    handler = type("H", (_Raw,), {"mode": mode})
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "out"
        p = bench(out, "--trace", str(trace), "--conc", "2", "--duration", "60",
                  "--base-url", f"http://127.0.0.1:{srv.server_address[1]}",
                  "--scrape-interval", "0", "--no-cache-salt")
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == EXIT_ABORTED, p.stderr[-2000:]
    summary, recs = results(out)
    assert recs and all(r["error"] == error for r in recs if r["error"] != "cancelled")
    assert f"(most common: {error})" in summary["stop_reason"]
    # no /tokenize on this server: the token model fell back and says so
    assert summary["run"]["tokens"]["mode"] == "assumed"


# --- start-up: nothing listening, or a listener that never answers ------------------------------
def test_connection_refused_at_start(tmp_path, trace):
    port = free_port()  # nobody listens there
    p = bench(tmp_path / "out", "--trace", str(trace), "--duration", "5",
              "--base-url", f"http://user:hunter22@127.0.0.1:{port}")
    assert p.returncode == EXIT_BAD_INPUT
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused" in lines[0] and "/v1/models" in lines[0]
    assert "hunter22" not in p.stderr and "<redacted>@" in lines[0]
    assert not (tmp_path / "out").exists()  # a failed start leaves no directory behind


def test_silent_server_fails_start_within_the_connect_timeout(tmp_path, trace):
    """The kernel completes the handshake for a listening socket nobody accepts from: the
    connection succeeds and no byte ever comes back. Start-up must fail after --connect-timeout,
    not after the 600 s read timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        t0 = time.monotonic()
        p = bench(tmp_path / "out", "--trace", str(trace), "--duration", "5",
                  "--base-url", f"http://127.0.0.1:{s.getsockname()[1]}",
                  "--connect-timeout", "1")
        took = time.monotonic() - t0
    assert p.returncode == EXIT_BAD_INPUT
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no answer to GET /v1/models within 1 s" in lines[0], p.stderr
    assert took < 60  # interpreter start-up and imports on a loaded machine, plus the 1 s
    assert not (tmp_path / "out").exists()


# --- mid-run: the server dies; the user presses Ctrl-C -----------------------------------------
def _wait_for_records(out: Path, p: subprocess.Popen, n: int, limit: float = 90) -> None:
    deadline = time.time() + limit
    while time.time() < deadline and p.poll() is None:
        f = out / "requests.jsonl"
        if f.exists() and len(f.read_bytes().splitlines()) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {n} records in {limit} s (exit {p.poll()})")


def test_credentials_in_the_url_never_reach_the_results(tmp_path, trace):
    """`--base-url http://alice:Pw0rd@host` (and a bare token as user): no result file holds
    the secret; the scraper recorded its URL unredacted in summary.json before."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentx.sim", "--port", str(port),
                               "--profile", "cpu-tiny", "--time-scale", "20"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        for i, cred in enumerate(("alice:Pw0rd", "tok3nSECRET")):
            out = tmp_path / f"out{i}"
            p = subprocess.run([sys.executable, str(REPO / "bench.py"), "--trace", str(trace),
                                "--conc", "2", "--duration", "0", "--max-requests", "4",
                                "--base-url", f"http://{cred}@127.0.0.1:{port}",
                                "--output-dir", str(out), "--no-progress",
                                "--scrape-interval", "0.5", "--validate", "warn"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr[-2000:]
            secret = cred.split(":")[-1]
            for f in out.iterdir():
                assert secret not in f.read_text(errors="replace"), f
            assert secret not in p.stdout + p.stderr
            summary = json.loads((out / "summary.json").read_text())
            assert "<redacted>@" in summary["server_metrics"]["scrape"]["url"]
    finally:
        server.kill()
        server.wait(10)


def test_dead_server_aborts_within_seconds(tmp_path, trace):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentx.sim", "--port", str(port),
                               "--profile", "cpu-tiny", "--time-scale", "20"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "out"
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        p = subprocess.Popen([sys.executable, str(REPO / "bench.py"), "--trace", str(trace),
                              "--conc", "2", "--duration", "300", "--max-think", "0.2",
                              "--base-url", url, "--output-dir", str(out), "--no-progress",
                              "--scrape-interval", "1"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for_records(out, p, 6)
    finally:
        server.kill()
        server.wait(10)
    t_kill = time.monotonic()
    _, stderr = p.communicate(timeout=120)
    took = time.monotonic() - t_kill
    assert p.returncode == EXIT_ABORTED, stderr[-2000:]
    assert took < 60, took  # seconds of failed requests, not the rest of the 300 s run
    summary, recs = results(out)
    assert summary["stop_reason"].startswith("aborted: error rate")
    assert {r["error"] for r in recs if not r["ok"]} <= {"connect", "reset", "cancelled"}
    assert summary["errors"].get("connect", 0) >= 1
    assert summary["validation"]["verdict"] == "fail"


def test_sigint_is_interrupted_not_pass(tmp_path):
    """Ctrl-C with --drain-timeout 0 cancels what is in flight: exit 130, summary written,
    verdict `interrupted` saying what was cancelled (not 'no request was sent')."""
    trace = write_trace(tmp_path / "tr", think=0.0, out=3000)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, str(REPO / "bench.py"), "--trace", str(trace),
                          "--conc", "2", "--duration", "120", "--output-dir", str(out),
                          "--no-progress", "--drain-timeout", "0", "--sim-profile", "cpu-tiny",
                          "--sim-time-scale", "2"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _wait_for_records(out, p, 2)  # the two lanes' warm-up turns are done
        time.sleep(0.5)  # their first measured turns (3000 tokens: seconds) are in flight
        os.killpg(p.pid, signal.SIGINT)
        _, stderr = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == EXIT_INTERRUPTED, stderr[-2000:]
    summary, recs = results(out)
    v = summary["validation"]
    assert summary["stop_reason"] == "signal" and v["verdict"] == "interrupted"
    assert v["reasons"][0].startswith("interrupted: stopped by a signal")
    assert not any("no request was sent" in r for r in v["reasons"])
    if summary["completed"] == 0 and summary["cancelled"]:
        assert any(f"no request completed: {summary['cancelled']} cancelled" in r
                   for r in v["reasons"]), v["reasons"]


# --- the two rules the exit status rests on, at their edges ------------------------------------
def test_error_window_judges_from_the_10th_and_ignores_cancelled():
    from agentx.engine.abort import ErrorWindow

    w = ErrorWindow(0.5, 50)
    assert all(w.note(False, "connect") is None for _ in range(9))  # too few to judge
    assert all(w.note(False, "cancelled") is None for _ in range(20))  # our own stop
    assert w.note(True, None) == ("aborted: error rate 90% over last 10 requests "
                                  "(most common: connect)")
    healthy = ErrorWindow(0.5, 50)
    outcomes = [healthy.note(i % 2 == 0, None if i % 2 == 0 else "http_503") for i in range(60)]
    assert not any(outcomes)  # exactly half failed: not more than the limit
    assert ErrorWindow(0.0, 50).note(False, "reset") is None  # 0 disables


LAG = {"p50": 0.05, "p75": 0.1, "p99": 1.0}


@pytest.mark.parametrize("lag,cpu,wait,itl,ttft,verdict", [
    (LAG, 0.05, 0.0, 7.0, 400.0, None),  # a quiet run
    ({"p50": 0.3, "p75": 0.4, "p99": 10.5}, 0.05, 70.0, 7.3, 400.0, "warn:client load"),
    ({"p50": 4.4, "p75": 6.0, "p99": 95.0}, 0.08, 517.0, 0.0, 73.0, "warn:machine load"),
    ({"p50": 9.0, "p75": 12.0, "p99": 20.0}, 0.95, 0.0, 7.0, 400.0, "fail"),  # its own work
    ({"p50": 9.0, "p75": 12.0, "p99": 20.0}, 0.10, 300.0, 7.0, 60.0, "fail"),  # > 10% of TTFT
    # a thread holding the interpreter in 20 ms slices: the probe often wakes while the loop
    # holds it, so the p50 stays low while a quarter of the wake-ups (and TTFTs) are far off
    ({"p50": 1.3, "p75": 9.6, "p99": 32.0}, 0.97, 0.0, 10.0, 30.0, "fail"),
    # one long stall in a busy but healthy run (mean 9 ms from it): the tail only
    ({"p50": 0.19, "p75": 0.27, "mean": 9.2, "p99": 255.0}, 0.95, 0.0, 7.0, 400.0,
     "warn:client load"),
])
def test_client_bound_rule(lag, cpu, wait, itl, ttft, verdict):
    from agentx.metrics.client_bound import client_bound

    client = {"loop_lag_ms": lag, "cpu_util": cpu, "runqueue_wait_ms_per_s": wait}
    fails, warns = client_bound(client, itl, ttft)
    if verdict is None:
        assert fails == [] and warns == []
    elif verdict == "fail":
        assert len(fails) == 1 and fails[0].startswith("client-bound: event-loop lag p75")
        assert warns == []
    else:
        assert fails == [] and len(warns) == 1 and warns[0].startswith(verdict[5:])
    # an explicit threshold is the strict p99 rule
    assert bool(client_bound(client, itl, ttft, threshold_ms=5.0)[0]) == (lag["p99"] > 5.0)
