"""`serve-sim` standalone: options parse into SimConfig, bad input is one line + exit 2, the server
listens on loopback and stops cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agentx.cli import build_parser
from agentx.commands.serve_sim import config_from_args

REPO = Path(__file__).resolve().parents[1]


def parse(*argv: str):
    return config_from_args(build_parser("serve-sim").parse_args(["serve-sim", *argv]))


def test_serve_sim_flags_reach_the_config():
    """A few flags of each kind through the real `serve-sim` parser (the full schema round
    trip is tests/test_options.py)."""
    cfg = parse("--profile", "cpu-tiny", "--tp", "2", "--synthetic-rates", "0.9,0.7,0.5,0.2",
                "--spec-k", "4", "--kv-offload", "mooncake", "--fail-kinds", "429,reset,stall",
                "--no-default-thinking")
    assert (cfg.profile, cfg.tp, cfg.spec_k, cfg.kv_offload) == ("cpu-tiny", 2, 4, "mooncake")
    assert cfg.synthetic_rates == [0.9, 0.7, 0.5, 0.2] and cfg.synthetic_al is None
    assert cfg.fail_kinds == ("429", "reset", "stall") and cfg.default_thinking is False
    assert parse().host == "127.0.0.1" and parse().profile == "h200-minimaxm3-fp8"


def run_module(*argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "agentx.sim", *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_bad_input_is_one_line_and_exit_2():
    for argv, field in ((["--profile", "nope"], "profile"),
                        (["--spec-k", "3", "--synthetic-al", "5"], "synthetic_al"),
                        (["--fail-kinds", "429,boom"], "fail_kinds"),
                        (["--spec-k", "2", "--synthetic-rates", "0.2,0.5"], "synthetic_rates")):
        p = run_module(*argv)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and field.replace("_", "-") in lines[0], err


def test_standalone_serves_and_stops_on_sigterm():
    p = run_module("--port", "0", "--profile", "cpu-tiny", "--time-scale", "50")
    try:
        port = None
        for _ in range(20):
            line = p.stderr.readline()
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port is not None
        base = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(base + "/health", timeout=5).status == 200
        req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 3, "ignore_eos": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        body = json.load(urllib.request.urlopen(req, timeout=10))
        assert body["usage"]["completion_tokens"] == 3
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
    assert p.returncode == 0


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_sim_process_serves_and_dies_with_its_parent():
    """`agentx run`'s simulator process (start_in_process) must not outlive a client that
    was killed outright: its stdin, the lifeline, closes and it stops."""
    code = ("import time; from agentx.sim.config import SimConfig; "
            "from agentx.targets.embedded import start_in_process; "
            "s = start_in_process(SimConfig(profile='cpu-tiny')); "
            "print(s.port, s._proc.pid, flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    try:
        port, child = map(int, p.stdout.readline().split())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"]
        assert _running(child)
    finally:
        p.kill()
        p.wait()
    deadline = time.time() + 10
    while _running(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _running(child)


def test_port_in_use_and_bad_host_are_one_line_naming_the_flag():
    busy = run_module("--port", "0", "--profile", "cpu-tiny")
    try:
        port = None
        for _ in range(20):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", busy.stderr.readline())
            if m:
                port = m.group(1)
                break
        assert port
        for argv, flag in ((["--port", port], "--port"), (["--host", "no-such-host.invalid"], "--host"),
                           (["--host", "192.0.2.1"], "--host")):  # TEST-NET-1: not this machine's
            p = run_module(*argv, "--profile", "cpu-tiny")
            _, err = p.communicate(timeout=30)
            lines = err.strip().splitlines()
            assert p.returncode == 2 and len(lines) == 1, (argv, err)
            assert lines[0].startswith("error: serve-sim: field") and flag in lines[0], err
    finally:
        busy.send_signal(signal.SIGTERM)
        busy.wait(timeout=10)


def test_non_loopback_host_without_api_key_warns():
    for argv, warned in ((["--host", "0.0.0.0"], True), (["--host", "0.0.0.0", "--api-key", "k"], False)):
        p = run_module("--port", "0", "--profile", "cpu-tiny", *argv)
        try:
            seen = []
            for _ in range(20):
                seen.append(p.stderr.readline())
                if "listening on http" in seen[-1]:
                    break
            assert "listening on http://0.0.0.0:" in seen[-1]
            assert any("warning" in x and "--api-key" in x for x in seen) == warned, seen
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=10)
