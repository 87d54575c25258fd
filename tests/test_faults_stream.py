"""How the client reads what a server sends (issue 20, defects 4, 7 and 14): a lying `usage`,
responses too large to hold, and answers that are not what they claim. Each case is a fake
HTTP/1.1 server on 127.0.0.1 (a raw asyncio server, bytes exactly as written here) and agentx's
own client (`stream_request`), or the real CLI for the run as a whole; classes and limits:
docs/reliability.md."""
from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from agentx.client.assemble import assemble
from agentx.client.facts import StreamFacts
from agentx.client.http import ClientConfig, make_session, stream_request
from agentx.client.http1 import MAX_ERROR_BODY, RequestBody, Response
from agentx.client.sse import MAX_EVENT, StreamDecoder
from agentx.metrics.summary import summarize
from agentx.records import OSL_ALLOWANCE, RequestRecord
from agentx.report.rebuild import load_run
from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS, ISL = 20, 3000


# --- the fake server ---------------------------------------------------------------------------
def chunk(ct: object, content: str = "w ", pt: object = ISL) -> bytes:
    """vLLM's token chunk with continuous usage (the client's byte-search path)."""
    return b"data: " + orjson.dumps(
        {"id": "x", "object": "chat.completion.chunk", "model": "raw",
         "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                      "finish_reason": None}],
         "usage": {"prompt_tokens": pt, "total_tokens": 0, "completion_tokens": ct}}) + b"\n\n"


def final(ct: object = MAX_TOKENS, pt: object = ISL, cached: object = None,
          metrics: dict | None = None) -> bytes:
    usage: dict = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": 0}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    ev: dict = {"id": "x", "choices": [], "usage": usage}
    if metrics:
        ev["metrics"] = metrics
    return b"data: " + orjson.dumps(ev) + b"\n\n"


def stream(n: int = MAX_TOKENS, **final_kw: object) -> bytes:
    return b"".join(chunk(i) for i in range(1, n + 1)) + final(**final_kw) + b"data: [DONE]\n\n"


def head(status: str = "200 OK", ctype: str = "text/event-stream", length: int | None = None,
         ) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Connection: close"
    return f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{framing}\r\n\r\n".encode()


def sse(body: bytes) -> bytes:
    return head(length=len(body)) + body


MODELS = b'{"object":"list","data":[{"id":"raw","object":"model","max_model_len":100000}]}'


class Fake:
    """A raw HTTP/1.1 server on 127.0.0.1: the answer to the n-th (from 0) POST
    /v1/chat/completions is `answer(n)`, bytes or an async function of (server, writer);
    GET /v1/models lists one model, anything else is a 404. `sent` counts what it wrote,
    `cut` says a client closed the connection while it was still writing."""

    def __init__(self, answer, models_delay: float = 0.0, metrics: bytes | None = None) -> None:
        self.answer = answer
        self.models_delay = models_delay  # seconds before /v1/models answers (a slow start)
        self.metrics = metrics  # GET /metrics's page (None: a 404)
        self.scrapes = 0
        self.port = 0
        self.conns: set[asyncio.StreamWriter] = set()
        self.requests = 0
        self.sent = 0
        self.cut = False

    async def __aenter__(self) -> "Fake":
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def restart(self, down_s: float) -> None:
        """Stop listening and drop every connection for `down_s` seconds, then listen on
        the same port again (a server restart: connects are refused meanwhile)."""
        self.server.close()
        for w in list(self.conns):
            w.transport.abort()
        await asyncio.sleep(down_s)
        await self.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.conns.add(w)
        try:
            while True:
                h = await r.readuntil(b"\r\n\r\n")
                n = next((int(x.split(b":")[1]) for x in h.split(b"\r\n")
                          if x.lower().startswith(b"content-length:")), 0)
                await r.readexactly(n)
                if h.startswith(b"GET /v1/models"):
                    await asyncio.sleep(self.models_delay)
                    w.write(head(ctype="application/json", length=len(MODELS)) + MODELS)
                    continue
                if h.startswith(b"GET /metrics") and self.metrics is not None:
                    self.scrapes += 1
                    w.write(head(ctype="text/plain", length=len(self.metrics)))
                    for i in range(0, len(self.metrics), 1 << 20):
                        w.write(self.metrics[i:i + (1 << 20)])
                        await w.drain()
                    continue
                if not h.startswith(b"POST /v1/chat/completions"):
                    w.write(head("404 Not Found", "text/plain", 0))
                    continue
                a = self.answer(self.requests)
                self.requests += 1
                if isinstance(a, bytes):
                    w.write(a)
                    self.sent += len(a)
                else:
                    await a(self, w)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.cut = True
        finally:
            self.conns.discard(w)
            w.close()


@contextlib.contextmanager
def in_thread(answer, models_delay: float = 0.0, metrics: bytes | None = None):
    """A Fake served by its own event loop in a thread (for a CLI run in a subprocess)."""
    loop = asyncio.new_event_loop()
    fake = loop.run_until_complete(Fake(answer, models_delay, metrics).__aenter__())
    fake.loop = loop
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        yield fake
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
        loop.run_until_complete(fake.__aexit__())
        loop.close()


async def ask(answer, max_tokens: int = MAX_TOKENS, isl: int = ISL, timeout_s: float = 5.0,
              fake: Fake | None = None) -> RequestRecord:
    """One request through agentx's client to a fake server answering `answer`."""
    async with (fake or Fake(answer)) as srv:
        async with make_session(ClientConfig(srv.url, timeout_s=timeout_s)) as s:
            rec = RequestRecord("r1", "s1", 0, 0, False, isl_intended=isl,
                                osl_intended=max_tokens)
            await stream_request(s, srv.url + "/v1/chat/completions", b"{}", rec, {})
    orjson.dumps(rec)  # whatever the server said, the record can be written
    return rec


# --- defect 4: a server's usage is checked before it is believed ---------------------------------
BAD_USAGE = {
    "huge in a chunk": chunk(1) + chunk(10**18) + final(10**18) + b"data: [DONE]\n\n",
    "negative": b"".join(chunk(-i) for i in range(1, 5)) + final(-4) + b"data: [DONE]\n\n",
    "NaN string in a chunk": chunk(1) + chunk("NaN") + final("NaN") + b"data: [DONE]\n\n",
    "string in the final usage": stream(ct=str(MAX_TOKENS)),
    "float in the final usage": stream(ct=MAX_TOKENS + 0.5),
    "boolean prompt tokens": stream(pt=True),
    "usage is a string": stream()[:-len(final() + b"data: [DONE]\n\n")]
    + b'data: {"choices":[],"usage":"lots"}\n\ndata: [DONE]\n\n',
    "count goes down": chunk(1) + chunk(5) + chunk(3) + final(3) + b"data: [DONE]\n\n",
    "20000 tokens for max_tokens 20": stream(ct=20000),
    "cached beyond the prompt": stream(cached=ISL + 1),
    "prompt absurdly beyond the intended": stream(pt=10**7),
}


@pytest.mark.parametrize("body", BAD_USAGE.values(), ids=BAD_USAGE.keys())
async def test_impossible_usage_is_bad_usage(body):
    rec = await ask(lambda n: sse(body))
    assert not rec.ok and rec.error == "bad_usage", (rec.error, rec.error_detail)
    assert rec.error_detail.startswith("usage")
    for v in (rec.isl, rec.osl, rec.cached_tokens):  # the server's numbers are not kept
        assert v is None or 0 <= v <= 2 * ISL + 1000
    assert all(type(k) is int and 0 <= k <= MAX_TOKENS for k in rec.chunk_tokens)


async def test_usage_at_its_bounds_is_believed():
    """max_tokens + OSL_ALLOWANCE completion tokens (a speculative step not trimmed), a prompt
    at 2x the intended + 1000, everything cached: possible, so ok."""
    top = MAX_TOKENS + OSL_ALLOWANCE
    rec = await ask(lambda n: sse(stream(top, ct=top, pt=2 * ISL + 1000, cached=2 * ISL + 1000)))
    assert rec.ok, rec.error_detail
    assert (rec.osl, rec.isl, rec.cached_tokens) == (top, 2 * ISL + 1000, 2 * ISL + 1000)
    rec = await ask(lambda n: sse(stream(top + 1, ct=top + 1)))
    assert rec.error == "bad_usage" and f"> max_tokens {MAX_TOKENS} + {OSL_ALLOWANCE}" \
        in rec.error_detail


async def test_bad_per_request_metrics_are_dropped_not_believed():
    """vLLM's optional per-request `metrics`: a value that is not a number is not kept, and
    costs the request nothing."""
    m = {"time_to_first_token_ms": "NaN", "queue_time_ms": -3,
         "speculative_decoding": {"num_accepted_draft_tokens": 1.5, "num_spec_steps": 7}}
    rec = await ask(lambda n: sse(stream(metrics=m)))
    assert rec.ok and rec.osl == MAX_TOKENS
    assert (rec.server_ttft_ms, rec.server_queue_ms, rec.spec_accepted, rec.spec_steps) == \
        (None, None, None, 7)


async def test_event_of_the_wrong_shape_is_malformed():
    body = (b'data: {"choices":{"0":1}}\n\n' + b'data: {"choices":[{"delta":{"content":7}}]}\n\n'
            + stream())
    rec = await ask(lambda n: sse(body))
    assert rec.error == "malformed" and "unexpected event shape" in rec.error_detail


def _ok_record(i: int) -> dict:
    rec = RequestRecord(f"r{i}", "s", i % 2, i, False, isl_intended=ISL, osl_intended=MAX_TOKENS)
    f = StreamFacts(start_ns=1_000_000, end_ns=9_000_000, status=200, first_chunk_ns=2_000_000,
                    last_chunk_ns=8_000_000, first_content_ns=2_000_000,
                    chunk_offsets_ns=[1_000_000 + 300_000 * k for k in range(MAX_TOKENS)],
                    chunk_tokens=[1] * MAX_TOKENS, isl=ISL, osl=MAX_TOKENS)
    assemble(rec, f)
    return orjson.loads(rec.to_json())


def test_summary_and_report_survive_impossible_numbers_in_records(tmp_path):
    """Records an earlier version wrote from a lying server (ok, with 10^18 or negative
    tokens): the summary and `agentx report` count them as bad_usage failures, out of every
    distribution and of throughput, instead of dying (MemoryError) or reporting negative tok/s."""
    recs = [_ok_record(i) for i in range(6)]
    recs[1].update(osl=10**18, osl_counted=10**18, chunk_tokens=[1] * 19 + [10**18 - 19])
    recs[2].update(osl=-20)
    recs[3].update(isl="NaN", cached_tokens=[1])
    s = summarize(recs, window_s=1.0)
    assert s["completed"] == 3 and s["failed"] == 3 and s["errors"] == {"bad_usage": 3}
    assert s["throughput"]["output_tok_s"] == 3 * MAX_TOKENS
    run = tmp_path / "run"
    run.mkdir()
    (run / "requests.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    loaded = load_run(run)  # what `agentx report` does with a run that left no summary
    assert loaded.summary["errors"] == {"bad_usage": 3} and loaded.summary["rebuilt"]


def test_run_goes_on_past_bad_usage(tmp_path):
    """Through the CLI: a third of the answers lie; the run reaches its end, each lie is one
    bad_usage failure (no traceback, no lane bug) and the rest are measured."""
    out = tmp_path / "out"
    with in_thread(lambda n: sse(stream(ct=-5 if n % 3 == 2 else MAX_TOKENS))) as srv:
        p = subprocess.run(
            [sys.executable, str(REPO / "bench.py"), "--trace",
             str(write_trace(tmp_path / "tr", think=0.0, out=MAX_TOKENS)), "--conc", "2",
             "--duration", "0", "--max-requests", "12", "--warmup", "0", "--no-progress",
             "--base-url", srv.url, "--output-dir", str(out), "--scrape-interval", "0",
             "--no-cache-salt", "--validate", "warn", "--min-samples", "1"],
            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    summary = json.loads((out / "summary.json").read_text())
    recs = [orjson.loads(ln) for ln in (out / "requests.jsonl").read_bytes().splitlines()]
    assert summary["stop_reason"] == "max_requests" and len(recs) == 12
    assert Counter(r["error"] for r in recs) == {None: 8, "bad_usage": 4}
    measured = Counter(r["error"] for r in recs if not r["warmup"])  # not the lanes' primes
    assert summary["errors"] == {"bad_usage": measured["bad_usage"]}
    assert summary["completed"] == measured[None] > 0
    assert summary["throughput"]["output_tok_s"] > 0


# --- defect 7: what a response may make the client hold ------------------------------------------
async def test_body_without_event_boundary_is_oversized_and_dropped():
    """A 200 MB body that never ends an event: the request fails `oversized` once an event
    passes MAX_EVENT (16 MiB) and the connection is closed, instead of holding and re-scanning
    the whole body until the timeout."""
    total = 200 << 20

    async def endless(srv: Fake, w: asyncio.StreamWriter) -> None:
        w.write(head(length=total))
        block = b"x" * (1 << 20)
        for _ in range(total >> 20):
            w.write(block)
            srv.sent += len(block)
            await w.drain()

    t0 = time.monotonic()
    fake = Fake(lambda n: endless)
    rec = await ask(None, fake=fake)
    assert rec.error == "oversized" and "16 MiB" in rec.error_detail
    assert time.monotonic() - t0 < 5
    assert fake.sent < 64 << 20  # the client hung up long before the 200 MB were written


def test_decoding_is_linear_in_the_event_size():
    """A 12 MiB event in 4 KiB reads: each read's bytes are scanned once (the decoder used to
    join and re-scan all held bytes per read: seconds for one event, the loop blocked)."""
    f = StreamFacts()
    dec = StreamDecoder(f)
    big = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"a" * (12 << 20) + b'"}}]}\n\n'
    t0 = time.process_time()
    for i in range(0, len(big), 4096):
        dec.feed(big[i:i + 4096], 1)
    took = time.process_time() - t0
    assert f.error is None and f.chunk_tokens == [1]
    assert took < 1.0, took  # ~0.05 s linear; the quadratic join took minutes at 4 KiB reads


def test_event_beyond_the_cap_is_oversized():
    dec = StreamDecoder(StreamFacts())
    piece = b"data: " + b"a" * (1 << 20)
    with pytest.raises(Exception) as e:
        for _ in range((MAX_EVENT >> 20) + 2):
            dec.feed(piece, 1)
    assert getattr(e.value, "kind", None) == "oversized"


async def test_huge_error_body_keeps_only_its_start():
    """HTTP 500 with a 100 MB body: the first 64 KiB are kept (the detail shows its start), the
    rest is not read: the connection is closed."""
    total = 100 << 20

    async def big_500(srv: Fake, w: asyncio.StreamWriter) -> None:
        w.write(head("500 Internal Server Error", "text/plain", total))
        block = b"engine died " * (1 << 16)
        for _ in range(total // len(block)):
            w.write(block)
            srv.sent += len(block)
            await w.drain()

    fake = Fake(lambda n: big_500)
    rec = await ask(None, fake=fake)
    assert rec.error == "http_500" and rec.error_detail.startswith("engine died engine died")
    assert fake.sent < 32 << 20


def test_error_body_held_is_bounded():
    loop = asyncio.new_event_loop()
    try:
        resp = Response(StreamDecoder(StreamFacts()), loop.create_future(), RequestBody(b""))
        resp.feed(b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n", 1)
        piece = b"z" * 50_000
        for _ in range(10):
            resp.feed(b"%x\r\n%s\r\n" % (len(piece), piece), 1)
        assert sum(map(len, resp.err_body)) == MAX_ERROR_BODY
        assert resp.done.done() and not resp.keep_alive  # ended there: the caller closes it
    finally:
        loop.close()


# --- defect 14: answers that are not what they claim ---------------------------------------------
async def test_html_page_with_200_is_malformed():
    page = b"<html><body><form action=/login>Sign in</form></body></html>"
    rec = await ask(lambda n: head(ctype="text/html; charset=utf-8", length=len(page)) + page)
    assert rec.error == "malformed" and "text/html" in rec.error_detail
    assert "Sign in" in rec.error_detail


async def test_json_answer_is_not_streamed():
    """--extra-body '{"stream": false}': a whole JSON completion instead of a stream."""
    j = orjson.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": ISL, "completion_tokens": MAX_TOKENS, "total_tokens": 0}})
    rec = await ask(lambda n: head(ctype="application/json", length=len(j)) + j)
    assert rec.error == "not_streamed" and "--extra-body" in rec.error_detail
    assert rec.osl is None


async def test_thousands_of_interim_heads_then_the_answer():
    """3,000 `100 Continue` heads before the real one (any number of 1xx is valid HTTP): read
    in a loop, not by recursion (RecursionError, classed reset, before)."""
    rec = await ask(lambda n: b"HTTP/1.1 100 Continue\r\n\r\n" * 3000 + sse(stream()))
    assert rec.ok and rec.osl == MAX_TOKENS, rec.error_detail


@pytest.mark.parametrize("eol", [b"\r", b"\r\n"], ids=["CR", "CRLF"])
async def test_cr_line_ends_are_lines(eol):
    """Lines may end with CR alone (the SSE spec): every request was `incomplete` before."""
    body = stream().replace(b"\n", eol)

    async def bytewise(srv: Fake, w: asyncio.StreamWriter) -> None:
        w.write(head(length=len(body)))  # in small writes: CRLFs split across reads
        for i in range(0, len(body), 5):
            w.write(body[i:i + 5])
            await w.drain()
            await asyncio.sleep(0)

    rec = await ask(None, fake=Fake(lambda n: bytewise))
    assert rec.ok and rec.osl == MAX_TOKENS and sum(rec.chunk_tokens) == MAX_TOKENS


async def test_tokens_after_done_are_not_counted():
    body = stream() + b"".join(chunk(MAX_TOKENS + i) for i in range(1, 50))
    rec = await ask(lambda n: sse(body))
    assert rec.ok and rec.osl_counted == MAX_TOKENS and len(rec.chunk_offsets_ns) == MAX_TOKENS


def test_extra_body_max_tokens_is_what_the_answer_is_judged_by(tmp_path):
    """--extra-body '{"max_tokens": 48}' over a trace asking 4: the body sends 48, the record's
    osl_intended is 48, and the simulator's 48-token answers are no lie (`agentx calibrate`
    sets its --max-tokens this way)."""
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench.py"), "--trace",
         str(write_trace(tmp_path / "tr", think=0.0, out=4)), "--conc", "2", "--duration", "0",
         "--max-requests", "6", "--no-progress", "--output-dir", str(out),
         "--extra-body", '{"max_tokens": 48}', "--sim-profile", "cpu-tiny",
         "--sim-time-scale", "20", "--validate", "warn"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [orjson.loads(ln) for ln in (out / "requests.jsonl").read_bytes().splitlines()]
    assert len(recs) == 6 and all(r["ok"] and r["osl_intended"] == 48 for r in recs), recs[0]
    assert all(r["osl"] == 48 for r in recs)


# --- a connection closed under the client between its check and its write -------------------
@pytest.mark.parametrize("size", [2, 300_000], ids=["one-write", "sliced"])
def test_a_write_to_a_connection_closed_under_us_is_stale_not_a_runtime_error(size):
    """uvloop (the client's loop) raises RuntimeError on a write to a closed transport (asyncio's
    loop drops such writes); seen in CI when the server was killed: one failed request classed
    "RuntimeError" beside 13 `connect` and one `reset`. It is a connection that died before any
    response byte: `Stale` (the client resends once on a reused connection, else records
    `reset`)."""
    import uvloop

    from agentx.client.http1 import Stale
    from agentx.client.wire import _Conn

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, conn = await asyncio.get_running_loop().create_connection(_Conn, "127.0.0.1", port)
        conn.transport.abort()  # the server went away while the connection sat in the pool
        await asyncio.sleep(0)  # its connection_lost runs; the client then writes to it
        with pytest.raises(Stale):
            await conn.send(b"POST / HTTP/1.1\r\n\r\n", RequestBody(b"x" * size), 5.0,
                            time.perf_counter_ns() + 5 * 10**9)
        server.close()

    uvloop.run(main())
