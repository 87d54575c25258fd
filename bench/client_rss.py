#!/usr/bin/env python3
"""Client memory at scale: RSS of `agentx run` with 1024 lanes of ~150k-token sessions.

What a lane holds is its session's history (the messages it resends every turn) and, while a
request is in flight, that request's body; blocks are slices of one shared tape (no per-block
cache), so RSS ~ lanes x (history + body) + a constant. The bench runs the real engine
(`agentx run`, one process) against a sink server that reads each body, sends the response
headers, holds the request for `--hold` s (so all lanes are in flight at once: the worst
case) and streams a short answer; it samples the client's RSS with psutil. Lanes start
90-100% into sessions that grow to `--tokens` tokens, so every lane's history is near full
size from its first request. The sink reports a KV pool on /metrics as vLLM does, which
bounds the client's model of the server's prefix cache (agentx.prefix_cache).

    python bench/client_rss.py                    # 1024 lanes, 150k tokens, ~2-3 minutes
    python bench/client_rss.py --lanes 128 --duration 20
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# ---------------------------------------------------------------- sink server
def _chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _sink(port: int, hold_s: float, out_tokens: int, pool_tokens: int) -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await r.readuntil(b"\r\n\r\n")
                line = req.split(b"\r\n", 1)[0]
                n = 0
                for h in req.split(b"\r\n")[1:]:
                    if h.lower().startswith(b"content-length:"):
                        n = int(h.split(b":", 1)[1])
                while n:  # read and drop the body
                    n -= len(await r.read(min(n, 1 << 20)))
                if line.startswith(b"GET /metrics"):  # the KV pool, as vLLM reports it
                    body = (b'vllm:cache_config_info{block_size="64",engine="0",'
                            b'num_gpu_blocks="%d"} 1.0\n' % (pool_tokens // 64))
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                if line.startswith(b"GET /v1/models"):
                    body = b'{"object":"list","data":[{"id":"sink","max_model_len":1048576}]}'
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                if not line.startswith(b"POST /v1/chat/completions"):
                    w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                w.write(head)  # headers at once, tokens after the hold (as vLLM does)
                await asyncio.sleep(hold_s)
                parts = []
                for i in range(1, out_tokens + 1):
                    parts.append(_chunk(b'{"choices":[{"index":0,"delta":{"content":" x"},'
                                        b'"finish_reason":%s}],"usage":{"prompt_tokens":1,'
                                        b'"completion_tokens":%d}}'
                                        % (b'"length"' if i == out_tokens else b"null", i)))
                parts.append(_chunk(b"[DONE]") + b"0\r\n\r\n")
                w.write(b"".join(parts))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------- workload
def write_trace(path: Path, tokens: int, turns: int, out: int, sessions: int) -> Path:
    """Sessions growing linearly to `tokens` prompt tokens; hash_ids extend turn by turn."""
    path.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        reqs, ids, nxt = [], [], 1
        for i in range(turns):
            n = tokens * (i + 1) // turns
            keep = ids[: min(len(ids) - 1, n // 64)] if ids else []
            new = list(range(nxt, nxt + -(-n // 64) - len(keep)))
            nxt += len(new)
            ids = keep + new
            reqs.append({"t": float(i), "type": "n", "in": n, "out": out, "hash_ids": ids,
                         "think_time": 0.0, "input_types": []})
        doc = {"id": f"rss_{s:03d}", "block_size": 64, "system_tokens": 2800,
               "tool_tokens": 12300, "requests": reqs}
        (path / f"rss_{s:03d}.json").write_text(json.dumps(doc))
    return path


def pinned(cpus: str | None, cmd: list[str]) -> list[str]:
    return (["taskset", "-c", cpus] + cmd) if cpus and shutil.which("taskset") else cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lanes", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=150_000, help="session length (prompt tokens)")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--hold", type=float, default=5.0, help="seconds the sink holds a request")
    p.add_argument("--sink-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--sample", type=float, default=0.5, help="RSS sampling period (s)")
    p.add_argument("--pool-tokens", type=int, default=3_000_000,
                   help="KV pool the sink reports on /metrics (an 8-GPU node's order); the "
                        "client's cache model is bounded by it, as against a real vLLM")
    p.add_argument("--keep", action="store_true", help="keep the work dir (records, logs)")
    p.add_argument("--sink", type=int, default=None, help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    if args.sink is not None:
        try:
            import uvloop

            uvloop.run(_sink(args.sink, args.hold, 8, args.pool_tokens))
        except ImportError:
            asyncio.run(_sink(args.sink, args.hold, 8, args.pool_tokens))
        return 0
    work = Path(tempfile.mkdtemp(prefix="agentx-rss-"))
    trace = write_trace(work / "trace", args.tokens, args.turns, 8, 64)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = subprocess.Popen(pinned(args.sink_cpus, [PY, __file__, "--sink", str(port),
                                                    "--hold", str(args.hold),
                                                    "--pool-tokens", str(args.pool_tokens)]))
    deadline = time.monotonic() + 30
    while True:  # wait until the sink accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or sink.poll() is not None:
                print("sink server did not start")
                return 1
            time.sleep(0.2)
    cmd = pinned(args.client_cpus, [
        PY, "-m", "agentx", "run", "--base-url", f"http://127.0.0.1:{port}",
        "--trace", str(trace), "--conc", str(args.lanes), "--duration", str(args.duration),
        "--start-min", "0.9", "--start-max", "1.0", "--no-progress", "--scrape-interval", "5",
        "--validate", "off", "--output-dir", str(work / "out"), "--drain-timeout", "30"])
    t0 = time.monotonic()
    log = open(work / "client.log", "wb")
    client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    proc = psutil.Process(client.pid)
    samples: list[tuple[float, float]] = []
    try:
        while client.poll() is None:
            try:
                rss = sum(pp.memory_info().rss for pp in [proc, *proc.children(recursive=True)])
                samples.append((time.monotonic() - t0, rss / 1e6))
            except psutil.Error:
                pass
            time.sleep(args.sample)
    finally:
        sink.terminate()
        sink.wait()
    if client.returncode != 0:
        print(f"client failed ({client.returncode}); log: {work / 'client.log'}")
        return 1
    summary = json.loads((work / "out" / "summary.json").read_text())
    recs = [json.loads(line) for line in open(work / "out" / "requests.jsonl")]
    isl = sorted(r["isl_intended"] for r in recs)
    peak = max(v for _, v in samples)
    print(f"lanes {args.lanes}, sessions up to {args.tokens:,} tokens, hold {args.hold:g} s, "
          f"think 0 (all lanes in flight)")
    print(f"requests {len(recs)} ({summary['completed']} measured, "
          f"{summary['warmup_requests']} warm-up, {summary['failed']} failed), prompt tokens p50 "
          f"{isl[len(isl) // 2]:,} max {isl[-1]:,}; max in flight "
          f"{summary['client']['max_in_flight']}")
    print(f"client RSS peak {peak:,.0f} MB ({peak / args.lanes:.2f} MB per lane); "
          f"wall {samples[-1][0]:.0f} s")
    step = max(1, len(samples) // (40 if args.keep else 12))
    print("RSS over time (s: MB): " + ", ".join(f"{t:.0f}: {v:,.0f}" for t, v in samples[::step]))
    errors = summary.get("errors") or {}
    if errors:
        print("errors: " + ", ".join(f"{k}={v}" for k, v in errors.items()))
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
