"""agentx.targets, the one way to get a server: each kind (url, vllm, sim, embedded) against a
real simulator, served or embedded (no mocks); a recipe point "on vLLM" is a stand-in command
that execs the simulator with the port vLLM's flags give it, so the render -> launch ->
/health -> stop path is the real one. Every test checks that stop leaves no process behind."""
from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from agentx.errors import InputError
from agentx.golden_al import GoldenPin
from agentx.recipe.load import load_recipe
from agentx.targets.base import read_version
from agentx.targets.choice import RecipeChoice, UrlChoice
from agentx.targets.embedded import EmbeddedSim
from agentx.targets.open import open_server
from agentx.targets.process import ServerStartError

REPO = Path(__file__).resolve().parents[1]
FAST = {"profile": "cpu-tiny", "time_scale": 20.0}
# `vllm serve ... --port P --served-model-name M`: serve the simulator on P as M instead
FAKE_VLLM = ("import os, sys; a = sys.argv; p = a[a.index('--port') + 1]; "
             "m = a[a.index('--served-model-name') + 1]; "
             "os.execv(sys.executable, [sys.executable, '-m', 'agentx.sim', '--host', "
             "'127.0.0.1', '--port', p, '--profile', 'cpu-tiny', '--model-name', m])")


def _models(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    """Every pid has exited (zombies count as gone: nothing runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _tree(pid: int) -> list[int]:
    return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]


def _recipe(tmp_path: Path, code: str, extra: str = "", timeout: float = 60) -> Path:
    path = tmp_path / "fake.yaml"
    path.write_text(f"command: [{sys.executable}, -c, {json.dumps(code)}, serve]\n"
                    "model: org/fake-model\nserved_model_name: fake\nprecision: bf16\n"
                    f"hardware: cpu\ngpus: 1\nsim_profile: cpu-tiny\n{extra}"
                    f"health_timeout_s: {timeout}\n")
    return path


def test_embedded_simulator_target(tmp_path):
    server = EmbeddedSim(FAST)
    with server as t:
        pids = _tree(server.proc._proc.pid)
        assert (t.kind, t.profile, t.model) == ("embedded", "cpu-tiny", None)
        assert t.url.startswith("http://127.0.0.1:") and _models(t.url) == ["agentx-sim"]
        assert t.builtin_tokens and t.local_cores == 1
        assert t.options["profile"] == "cpu-tiny" and "api_key" not in t.options
        ident = t.identity("agentx-sim", read_version(t.url))
        assert ident == {"kind": "embedded", "simulator": True, "profile": "cpu-tiny", "url": None,
                         "model": "agentx-sim", "server_version": ident["server_version"],
                         "gpus": 1}  # the simulator says its TP in /version
    assert _gone(pids)


def test_embedded_simulator_refuses_a_golden_pin_of_another_k(tmp_path):
    pin = GoldenPin(file="x.yaml", model="d", thinking="on", k=3, al=2.5)
    with pytest.raises(InputError, match="K=3 but --sim-spec-k is 2"):
        EmbeddedSim({**FAST, "spec_k": 2}, pin=pin)


def test_recipe_point_on_the_simulator_and_the_same_server_as_a_url(tmp_path):
    recipe, path = load_recipe("tiny-cpu")
    server = open_server(RecipeChoice.of(recipe, path, sim=True, workdir=tmp_path / "srv",
                                         sim_overrides={"time_scale": 20.0},
                                         health_timeout_s=60))
    with server as t:
        pids = _tree(server.handle.pgid)
        assert (t.kind, t.model, t.profile, t.offload_tokens) == ("sim", "tiny", "cpu-tiny",
                                                                  None)
        assert _models(t.url) == ["tiny"]
        assert t.log_dir == (tmp_path / "srv").resolve()
        assert (t.log_dir / "server.log").exists()
        # the same server given by its URL: nothing launched, the simulator named by /version
        with open_server(UrlChoice(t.url + "/")) as u:
            assert (u.kind, u.url, u.model, u.offload_tokens) == ("url", t.url, None, None)
            ident = u.identity("tiny", read_version(u.url))
            assert (ident["kind"], ident["simulator"], ident["profile"], ident["url"]) == \
                ("url", True, "cpu-tiny", t.url)
    assert _gone(pids)
    assert server.exit_code() is None  # stopped by us, not died


def test_recipe_point_launched_as_vllm_gives_its_offload_tier(tmp_path):
    """kind vllm: the rendered command runs (here the stand-in), model = served name, and the
    offload tier in tokens is the rendered tier's bytes over cpu-tiny's 4,096 bytes a token."""
    from agentx.recipe.render import render

    recipe, path = load_recipe(str(_recipe(
        tmp_path, FAKE_VLLM, "points: [{conc: [1], kv_offload: simple-cpu}]\n")))
    bytes_ = render(recipe, 0, workdir=tmp_path / "r", recipe_dir=path.parent).offload_bytes
    server = open_server(RecipeChoice.of(recipe, path, sim=False, workdir=tmp_path / "srv"))
    with server as t:
        pids = _tree(server.handle.pgid)
        assert (t.kind, t.model, t.connector) == ("vllm", "fake", "simple-cpu")
        assert bytes_ and t.offload_tokens == bytes_ // 4096
        assert _models(t.url) == ["fake"]
        assert (t.log_dir / "command.sh").exists()
    assert _gone(pids)


def test_health_wait_timeout_is_one_line_and_leaves_no_process(tmp_path):
    token = f"agentx-targets-{time.monotonic_ns()}"  # marks the server's process
    recipe, path = load_recipe(str(_recipe(
        tmp_path, f"import time; print('up', flush=True); time.sleep(600)  # {token}",
        "points: [{conc: [1]}]\n")))
    server = open_server(RecipeChoice.of(recipe, path, sim=False, workdir=tmp_path / "srv",
                                         health_timeout_s=1.5))
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.start()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("/health did not answer within 1.5 s (log ")
    assert "up" in info.value.tail and time.monotonic() - t0 < 30
    assert not [p for p in psutil.process_iter(["cmdline"])
                if token in " ".join(p.info["cmdline"] or [])]


def _server_classes() -> set[str]:
    """The classes of agentx/targets/ that are a Server (its subclasses, by their bases)."""
    import ast

    found = {"Server"}
    for path in sorted((REPO / "agentx" / "targets").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", None) in found for b in node.bases):
                found.add(node.name)
    return found - {"Server"}


def test_one_call_opens_every_kind_of_server():
    """Every place that gets a server (run, sweep, ab, calibrate, serve, cliff) goes through
    targets.open.open_server: the server classes are constructed in that one function."""
    import ast

    classes = _server_classes()
    assert {"UrlServer", "RecipeServer", "EmbeddedSim"} <= classes
    sites = set()
    for path in sorted((REPO / "agentx").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for call in ast.walk(fn):
                f = call.func if isinstance(call, ast.Call) else None  # Cls(...), Cls.make(...)
                if f is not None and (getattr(f, "id", None) in classes or getattr(
                        getattr(f, "value", None), "id", None) in classes):
                    sites.add(f"{path.relative_to(REPO)}:{fn.name}")
    assert sites == {"agentx/targets/open.py:open_server"}


def test_a_target_record_of_either_vocabulary_reads():
    """summary.json's `target.kind` is the targets' kind (url, vllm, sim, embedded) and
    `simulator` says what it is; a record written before (`kind: simulator | server`)
    still reads as it did."""
    from agentx.report.target import is_simulator, target_text

    old = {"kind": "simulator", "profile": "cpu-tiny", "url": None}
    new = {"kind": "embedded", "simulator": True, "profile": "cpu-tiny", "url": None}
    served = {"kind": "url", "simulator": False, "model": "m", "url": "http://h:8000",
              "server_version": "0.32.0"}
    assert is_simulator(old) and is_simulator(new) and not is_simulator(served)
    assert target_text({"target": old}) == target_text({"target": new}) == \
        "simulator cpu-tiny"
    assert target_text({"target": served}) == "m at http://h:8000 (vLLM 0.32.0)"
    assert not is_simulator({"kind": "server", "model": "m"})
