"""Acceptance against real vLLM: every `--speculative-config` and `--kv-transfer-config` that
the shipped recipes render (all points, all concurrencies) is accepted by vLLM's own argument
parser and config classes, the Mooncake config file by vLLM's Mooncake config loader, and
deliberately wrong keys are rejected (see tests/vllm_env/check_recipe_configs.py for what
can be checked without a GPU or a model download). Then `agentx serve tiny-cpu` runs the real
CPU server: /health answers and stopping leaves no process of its group."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentx.recipe.dummy import build as build_dummy
from agentx.recipe.load import load_recipe, recipe_names
from agentx.recipe.render import render

pytestmark = pytest.mark.vllm

CHECKER = Path(__file__).resolve().parent / "vllm_env" / "check_recipe_configs.py"
HOST_MIB = 1_471_356  # the B300 recipes read host DRAM at render time: pin it


def _server_args(argv: list[str], launcher_len: int) -> list[str]:
    """The arguments after the launcher, with the model as --model (the API server's form)."""
    rest = argv[launcher_len:]
    return ["--model", *rest] if rest[0] != "--model" else rest


def _cases(tmp_path: Path, assets) -> list[dict]:
    cases, seen = [], set()
    dummy = build_dummy(tmp_path / "qwen3-8b-dummy")  # real Qwen3-8B-shaped configs, no weights
    env = {"AGENTX_TINY_ASSETS": str(assets.root), "AGENTX_QWEN3_DUMMY": str(dummy)}
    for name in recipe_names():
        recipe, path = load_recipe(name)
        for i, point in enumerate(recipe.points):
            for conc in point.conc:
                wd = tmp_path / f"{name}-{i}-{conc}"
                r = render(recipe, i, conc=conc, recipe_dir=path.parent, workdir=wd,
                           environ=env, host_dram_mib=HOST_MIB)
                key = (r.command().split(" --port ")[1].split(" ", 1)[1],
                       tuple(r.files.values()))
                if key in seen:
                    continue
                seen.add(key)
                case = {"id": f"{name} point {i} conc {conc}", "draft": str(assets.eagle3_dir),
                        "target": str(assets.model_dir), "mooncake_config": None,
                        "segment_bytes": None,
                        "args": _server_args(r.argv, len(recipe.command))}
                for file, content in r.files.items():  # the Mooncake config
                    wd.mkdir(parents=True, exist_ok=True)
                    Path(file).write_text(content)
                    case["mooncake_config"] = file
                    case["segment_bytes"] = r.offload_bytes // point.gpus  # one rank's
                cases.append(case)
    return cases


def _mutate(case: dict, flag: str, change) -> list[str]:
    args = list(case["args"])
    i = args.index(flag) + 1
    args[i] = json.dumps(change(json.loads(args[i])))
    return args


def _wrong(cases: list[dict], tmp_path: Path) -> dict[str, tuple[dict, str]]:
    """Deliberately wrong variants of real cases, each with the message vLLM must give."""
    mc = next(c for c in cases if c["mooncake_config"] and "--speculative-config" in c["args"])
    simple = next(c for c in cases if "SimpleCPUOffloadConnector" in " ".join(c["args"]))
    lmc = next(c for c in cases if "LMCacheConnectorV1" in " ".join(c["args"]))
    bad_file = tmp_path / "bad_mooncake.json"
    bad_file.write_text(Path(mc["mooncake_config"]).read_text().replace('GB"', ' GiB"', 1))

    def spec_key(d):
        d["num_speculative_token"] = d.pop("num_speculative_tokens")
        return d

    def al_too_high(d):
        d["synthetic_acceptance_length"] = d["num_speculative_tokens"] + 1.5
        return d

    def kv_key(d):
        d["kv_conector"] = d.pop("kv_connector")
        return d

    def v0_name(d):
        d["kv_connector"] = "LMCacheConnector"
        return d

    def extra_key(d):
        d["kv_connector_extra_config"]["cpu_byte_to_use"] = \
            d["kv_connector_extra_config"].pop("cpu_bytes_to_use")
        return d

    return {
        "wrong speculative key": ({**mc, "args": _mutate(mc, "--speculative-config", spec_key)},
                                  "num_speculative_token"),
        "synthetic AL > K+1": ({**mc, "args": _mutate(mc, "--speculative-config", al_too_high)},
                               "synthetic_acceptance_length must be in [1, 4]"),
        "wrong kv-transfer key": ({**mc, "args": _mutate(mc, "--kv-transfer-config", kv_key)},
                                  "kv_conector"),
        "LMCache's vLLM 0.x connector name": (
            {**lmc, "args": _mutate(lmc, "--kv-transfer-config", v0_name)},
            "unknown kv_connector 'LMCacheConnector'"),
        "wrong connector extra key": (
            {**simple, "args": _mutate(simple, "--kv-transfer-config", extra_key)},
            "cpu_byte_to_use"),
        "wrong mooncake size unit": ({**mc, "mooncake_config": str(bad_file)}, "Invalid format"),
    }


def test_every_rendered_config_is_accepted_by_vllm(tmp_path, vllm_python, vllm_assets):
    cases = _cases(tmp_path, vllm_assets)
    names = {c["id"].split(" point")[0] for c in cases}
    assert names == set(recipe_names())
    connectors = " ".join(" ".join(c["args"]) for c in cases)
    for name in ("SimpleCPUOffloadConnector", "MooncakeStoreConnector", "LMCacheConnectorV1"):
        assert name in connectors  # every connector of agentx.offload is checked
    wrong = _wrong(cases, tmp_path)
    all_cases = cases + [{**c, "id": f"WRONG {label}"} for label, (c, _) in wrong.items()]
    (tmp_path / "cases.json").write_text(json.dumps(all_cases))
    proc = subprocess.run([str(vllm_python), str(CHECKER), str(tmp_path / "cases.json"),
                           str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    rejected = {k: v["error"] for k, v in results.items() if not k.startswith("WRONG")
                and not v["ok"]}
    assert rejected == {}
    for label, (_, message) in wrong.items():
        res = results[f"WRONG {label}"]
        assert not res["ok"] and message in res["error"], (label, res)


def test_agentx_serve_tiny_cpu_real_vllm(tmp_path, vllm_python, vllm_assets, vllm_servers):
    """`agentx serve tiny-cpu` as a user runs it: ready line, /health, Ctrl-C, group gone."""
    import os
    import signal
    import sys
    import time
    import urllib.request

    from test_recipe import _group_members, _pids_running

    vllm_servers.stop()  # one vLLM at a time on this machine
    env = {**os.environ, "AGENTX_TINY_ASSETS": str(vllm_assets.root),
           "AGENTX_VLLM_PYTHON": str(vllm_python)}
    proc = subprocess.Popen([sys.executable, "-m", "agentx.cli", "serve", "tiny-cpu", "--port",
                             "0", "--workdir", str(tmp_path), "--quiet"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line, deadline = "", time.monotonic() + 600
        while "ready:" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "agentx serve exited early"
        assert "ready: http://127.0.0.1:" in line and "model tiny" in line, line
        url = line.split()[1]
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["tiny"]
        [server] = _pids_running(f"--port {url.rsplit(':', 1)[1]} --tensor-parallel-size")
        assert len(_group_members(server)) >= 2  # the API server and its engine core
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        assert _group_members(server) == []
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "server.log").read_text().lower()
    assert "speculative" in log and "eagle3" in (tmp_path / "command.sh").read_text()
