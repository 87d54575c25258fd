"""A request's lifecycle against a lying server, through the real CLI (docs/reliability.md):
a server that trickles tokens forever (the per-request deadline, `--request-timeout`), a
server behind HTTP Basic auth given as `http://user:pass@host` (the credentials go on every
request and nowhere else), warm-up requests that hang or fail (counted, not hidden), and
429 with `Retry-After` (honoured, bounded, counted).

The fake server is a raw HTTP/1.1 server on 127.0.0.1 in a thread; every handler gives up by
itself within LIFETIME seconds, so nothing outlives a test."""
from __future__ import annotations

import base64
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]
LIFETIME = 30.0  # no fake-server handler runs longer than this
MODELS = b'{"object":"list","data":[{"id":"raw","object":"model","max_model_len":100000}]}'


def _chunk(n: int) -> bytes:
    return (b'data: {"id":"x","object":"chat.completion.chunk","model":"raw","choices":[{"index":0,'
            b'"delta":{"content":"w "},"finish_reason":null}],"usage":{"prompt_tokens":10,'
            b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (n, 10 + n))


OK_BODY = _chunk(1) + _chunk(2) + b"data: [DONE]\n\n"


class Fake(socketserver.ThreadingTCPServer):
    """modes: `trickle` (a token every `interval` s, never [DONE]), `auth` (401 unless the
    Authorization header is `expect_auth`, on every path), `hang` (the chat request is read
    and never answered), `retry_after` (the first `n_429` chat requests get 429 with
    `Retry-After: retry_after`, then normal answers)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str, interval: float = 1.0, expect_auth: str | None = None,
                 retry_after: str = "1", n_429: int = 2) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode, self.interval, self.expect_auth = mode, interval, expect_auth
        self.retry_after, self.n_429 = retry_after, n_429
        self.seen: list[tuple[str, str | None, float]] = []  # (request line, Authorization, t)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "Fake":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()


class _Handler(socketserver.BaseRequestHandler):
    server: Fake

    def handle(self) -> None:
        f = self.request.makefile("rb")
        self.request.settimeout(LIFETIME)
        try:
            while self._one(f):
                pass
        except OSError:
            pass

    def _one(self, f) -> bool:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = f.readline()
            if not line:
                return False
            head += line
        lines = head.decode("latin-1").split("\r\n")
        hdr = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        f.read(int(hdr.get("content-length", 0)))
        srv = self.server
        with srv.lock:
            srv.seen.append((lines[0], hdr.get("authorization"), time.monotonic()))
            n_chat = sum(1 for s in srv.seen if "/chat/completions" in s[0])
        if srv.mode == "auth" and hdr.get("authorization") != srv.expect_auth:
            return self._send(b"401 Unauthorized", b"application/json", b'{"error":"unauthorized"}')
        if lines[0].startswith("GET /v1/models"):
            return self._send(b"200 OK", b"application/json", MODELS)
        if not lines[0].startswith("POST /v1/chat/completions"):
            return self._send(b"404 Not Found", b"text/plain", b"not here")
        if srv.mode == "trickle":
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
            n = 0
            while not srv.stop.wait(srv.interval) and n < LIFETIME / srv.interval:
                n += 1
                c = _chunk(n)
                self.request.sendall(b"%x\r\n%s\r\n" % (len(c), c))
            return False
        if srv.mode == "hang":
            srv.stop.wait(LIFETIME)
            return False
        if srv.mode == "retry_after" and n_chat <= srv.n_429:
            return self._send(b"429 Too Many Requests", b"application/json",
                              b'{"error":"rate limited"}',
                              b"Retry-After: " + srv.retry_after.encode() + b"\r\n")
        return self._send(b"200 OK", b"text/event-stream", OK_BODY)

    def _send(self, status: bytes, ctype: bytes, body: bytes, extra: bytes = b"") -> bool:
        self.request.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\n"
                             + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return True


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("tr"), think=0.0, out=40)


def bench(out: Path, url: str, trace: Path, *args: str, timeout: float = 60,
          env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "bench.py"), "--output-dir", str(out), "--no-progress",
           "--trace", str(trace), "--base-url", url, "--scrape-interval", "0", "--no-cache-salt",
           *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env)


def results(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    recs = [orjson.loads(ln) for ln in (out / "requests.jsonl").read_bytes().splitlines()]
    counted = (summary["completed"] + summary["failed"] + summary["cancelled"]
               + summary["warmup_requests"])
    assert counted == len(recs), (counted, len(recs))
    return summary, recs


def _secret_nowhere(out: Path, p: subprocess.CompletedProcess | str, secret: str) -> None:
    for f in out.iterdir():
        assert secret not in f.read_text(errors="replace"), f
    text = p if isinstance(p, str) else p.stdout + p.stderr
    assert secret not in text


# --- defect 8: a total deadline per request -----------------------------------------------------
def test_trickling_server_is_cut_at_the_request_timeout(tmp_path, trace):
    """A token every 0.2 s for ever: --timeout (silence between reads) never fires, so a
    --max-requests run never ended. --request-timeout 1 fails each request as `timeout` after
    1 s, saying which limit, and the run ends within its bound (2 requests a lane x 1 s)."""
    with Fake("trickle", interval=0.2) as srv:
        t0 = time.monotonic()
        p = bench(tmp_path / "out", srv.url, trace, "--conc", "2", "--duration", "0",
                  "--max-requests", "4", "--timeout", "5", "--request-timeout", "1",
                  "--validate", "warn")
        took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    summary, recs = results(tmp_path / "out")
    assert len(recs) == 4 and all(r["error"] == "timeout" for r in recs)
    assert all(r["error_detail"] == "not complete within 1 s (--request-timeout)" for r in recs)
    assert all(r["chunk_offsets_ns"] for r in recs)  # tokens were flowing: not a silence
    assert all(0.9e9 < r["end_ns"] - r["start_ns"] < 3e9 for r in recs)
    assert took < 20, took  # 2 x 1 s of requests, plus interpreter start-up on a busy machine
    assert summary["failed"] + summary["warmup_failed"] == 4
    assert "timeout=" in p.stdout


# --- defect 11: credentials in the URL -----------------------------------------------------------
BASIC = "Basic " + base64.b64encode(b"alice:Pw0rd/").decode()


def test_url_credentials_go_on_every_request_and_nowhere_else(tmp_path, trace):
    """`http://alice:Pw0rd%2F@host` behind Basic auth: /v1/models, /metrics and the load
    requests all carry it (the load requests did not: every one answered 401). They win over
    $OPENAI_API_KEY, which is only a default; no file or console line holds the password."""
    with Fake("auth", expect_auth=BASIC) as srv:
        url = srv.url.replace("http://", "http://alice:Pw0rd%2F@")
        env = {**os.environ, "OPENAI_API_KEY": "sk-fromtheenv"}
        p = bench(tmp_path / "out", url, trace, "--conc", "2", "--duration", "0",
                  "--max-requests", "6", "--min-samples", "1", "--scrape-interval", "0.5",
                  "--validate", "warn", env=env)
        seen = list(srv.seen)
    assert p.returncode == 0, p.stderr[-2000:]
    summary, recs = results(tmp_path / "out")
    assert len(recs) == 6 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    paths = {line.split()[1] for line, _, _ in seen}
    assert {"/v1/models", "/v1/chat/completions", "/metrics"} <= paths, paths
    assert all(auth == BASIC for _, auth, _ in seen), seen
    _secret_nowhere(tmp_path / "out", p, "Pw0rd")
    assert summary["config"]["base_url"].startswith("http://<redacted>@")


def test_api_key_wins_over_url_credentials(tmp_path, trace):
    """--api-key and a URL with credentials: one Authorization header per request, so the
    explicit key (Bearer) goes on every request, with a warning; aiohttp refused the pair
    before (start-up failed, exit 2)."""
    with Fake("auth", expect_auth="Bearer sk-KEY123") as srv:
        url = srv.url.replace("http://", "http://alice:Pw0rd@")
        p = bench(tmp_path / "out", url, trace, "--conc", "2", "--duration", "0",
                  "--max-requests", "4", "--min-samples", "1", "--api-key", "sk-KEY123",
                  "--validate", "warn")
        seen = list(srv.seen)
    assert p.returncode == 0, p.stderr[-2000:]
    _, recs = results(tmp_path / "out")
    assert len(recs) == 4 and all(r["ok"] for r in recs)
    assert seen and all(auth == "Bearer sk-KEY123" for _, auth, _ in seen), seen
    assert "warning: --api-key is sent (Bearer) on every request" in p.stderr
    _secret_nowhere(tmp_path / "out", p, "Pw0rd")
    _secret_nowhere(tmp_path / "out", p, "sk-KEY123")


# --- defect 15: warm-up requests and Retry-After in the counts -----------------------------------
def test_cancelled_warmup_requests_are_counted(tmp_path, trace):
    """Ctrl-C while every lane's first (warm-up) request hangs: the records say `cancelled`,
    so the summary, the console and the interrupted reason say 2 cancelled, not 0."""
    out = tmp_path / "out"
    with Fake("hang") as srv:
        cmd = [sys.executable, str(REPO / "bench.py"), "--output-dir", str(out), "--no-progress",
               "--trace", str(trace), "--base-url", srv.url, "--scrape-interval", "0",
               "--no-cache-salt", "--conc", "2", "--duration", "60", "--drain-timeout", "0"]
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and p.poll() is None and sum(
                    "chat" in line for line, _, _ in srv.seen) < 2:
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGINT)
            stdout, stderr = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, stderr[-2000:]
    summary, recs = results(out)
    assert [r["error"] for r in recs] == ["cancelled", "cancelled"]
    assert summary["warmup_cancelled"] == 2 and summary["cancelled"] == 0
    assert summary["validation"]["reasons"][0] == (
        "interrupted: stopped by a signal (SIGINT/SIGTERM); 0 requests completed, "
        "2 cancelled in flight (2 of them warm-up)")
    assert "2 warm-up (excluded; 2 cancelled)" in stdout


def test_failed_warmup_requests_are_counted(tmp_path, trace):
    """Every request times out, the warm-up ones included: they show by class, not as
    '0 failed' beside an empty error list."""
    with Fake("hang") as srv:
        p = bench(tmp_path / "out", srv.url, trace, "--conc", "2", "--duration", "0",
                  "--max-requests", "2", "--timeout", "0.5", "--validate", "warn")
    assert p.returncode == 0, p.stderr[-2000:]
    summary, recs = results(tmp_path / "out")
    assert all(r["warmup"] and r["error"] == "timeout" for r in recs) and len(recs) == 2
    assert summary["warmup_failed"] == 2 and summary["warmup_errors"] == {"timeout": 2}
    assert "2 warm-up (excluded; 2 failed: timeout=2)" in p.stdout


def test_retry_after_is_honoured_and_counted(tmp_path, trace):
    """Two 429s with Retry-After: 1: the lane's next request waits 1 s each time (it went
    again 0.2 ms later), the records and the summary say how long."""
    with Fake("retry_after", retry_after="1", n_429=2) as srv:
        p = bench(tmp_path / "out", srv.url, trace, "--conc", "1", "--duration", "0",
                  "--max-requests", "4", "--max-error-rate", "0", "--validate", "warn")
        sent = [t for line, _, t in srv.seen if "chat" in line]
    assert p.returncode == 0, p.stderr[-2000:]
    summary, recs = results(tmp_path / "out")
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert len(gaps) == 3 and gaps[0] >= 0.95 and gaps[1] >= 0.95 and gaps[2] < 0.5, gaps
    assert [r["retry_after_s"] for r in recs] == [1.0, 1.0, None, None]
    assert [r["error"] for r in recs] == ["http_429", "http_429", None, None]
    assert summary["retry_after_s"] == 2.0 and summary["retry_after_responses"] == 2
    assert "2 answer(s) with Retry-After: lanes waited up to 2.0 s in all" in p.stdout
    # the wait is the server's, not the client's: it is not dispatch lag
    assert all(r["dispatch_lag_ms"] < 100 for r in recs)


def test_retry_after_is_capped_and_ends_at_the_stop(tmp_path, trace):
    """Retry-After: 600 is honoured for at most 60 s, and not past the run's stop: a 2 s run
    ends after about 2 s, not 10 minutes."""
    with Fake("retry_after", retry_after="600", n_429=1) as srv:
        t0 = time.monotonic()
        p = bench(tmp_path / "out", srv.url, trace, "--conc", "1", "--duration", "2",
                  "--warmup", "0", "--validate", "warn")
        took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    _, recs = results(tmp_path / "out")
    assert recs[0]["error"] == "http_429" and recs[0]["retry_after_s"] == 60.0
    assert len(recs) == 1  # the lane waited until the stop
    assert took < 20, took


def test_retry_after_header_forms():
    from email.utils import formatdate

    from agentx.client.wire import retry_after_s

    assert retry_after_s(b" 7 ") == 7.0
    assert retry_after_s(b"Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    ahead = retry_after_s(formatdate(time.time() + 30, usegmt=True).encode())
    assert ahead is not None and 28 < ahead <= 30
    assert retry_after_s(b"soon") is None and retry_after_s(b"-5") is None


def test_basic_auth_matches_aiohttp():
    import aiohttp
    from yarl import URL

    from agentx.client.config import ClientConfig, basic_auth, without_credentials

    for url in ("http://alice:Pw0rd%2F@h:1", "http://tok3n@h", "http://al%C3%A9:p%40ss@h/x"):
        assert basic_auth(url)["Authorization"] == aiohttp.BasicAuth.from_url(URL(url)).encode()
        assert "@" not in without_credentials(url)
    assert basic_auth("http://h:1") == {} and without_credentials("http://h:1") == "http://h:1"
    # the API key, when there is one, is the one Authorization the load requests carry
    assert ClientConfig("http://a:b@h", api_key="k").url_auth() == {}
