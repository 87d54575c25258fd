"""Recipes: strict loading, the rendered commands, the DRAM arithmetic and the server lifecycle
(with the simulator standing in for vLLM, so these run in seconds)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agentx.cli import main
from agentx.errors import InputError
from agentx.golden_al import golden_al
from agentx.offload import dram
from agentx.recipe.load import load_recipe, recipe_names, recipes_dir
from agentx.recipe.render import render
from agentx.targets.choice import RecipeChoice
from agentx.targets.open import open_server
from agentx.targets.process import ServerStartError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["minimaxm3-fp8-h200-mtp", "minimaxm3-fp8-h200", "minimaxm3-fp4-b300-mtp",
           "minimaxm3-fp4-b300", "tiny-cpu", "qwen3-8b-dummy-h200"]
TINY_ENV = {"AGENTX_TINY_ASSETS": "/assets", "AGENTX_VLLM_PYTHON": "/venv/bin/python"}


def _render(name: str, point: int = 0, **kw):
    recipe, path = load_recipe(name)
    return render(recipe, point, recipe_dir=path.parent, source=str(path), **kw)


# ------------------------------------------------------------------ DRAM arithmetic

def test_inferencex_h200_dram_example_exactly():
    """H200 TP8, 1,471,356 MiB host, utilization 0.80 -> 1234 GB -> 1149 GiB - 414 GiB page
    cache - 8 x 4 GiB local buffers -> 87 GB per rank (InferenceX's worked example)."""
    b = dram.total_budget(1_471_356, utilization=0.80, gpus_used=8, gpus_per_node=8,
                          cap_mib=2_861_022)
    assert (b.total_gb, b.total_gib) == (1234, 1149)
    assert dram.per_rank_gib(b, ranks=8, page_cache_gib=414, buffer_gib=4) == 87
    text = "\n".join(b.steps)
    assert "GB = 1e9 bytes" in text and "GiB = 2^30 bytes" in text
    assert "1,234 GB" in text and "1,149 GiB" in text and "= 87 GiB" in text


def test_dram_cap_and_share_of_node():
    half = dram.total_budget(1_471_356, utilization=0.80, gpus_used=4, gpus_per_node=8,
                             cap_mib=2_861_022)
    assert half.total_gb == 617  # floor(1234.27 / 2)
    capped = dram.total_budget(4_000_000, utilization=1.0, gpus_used=8, gpus_per_node=8,
                               cap_mib=2_861_022)
    assert capped.total_gb == 2_861_022 * 2**20 // 10**9


def test_budget_per_rank_not_positive_is_refused():
    b = dram.total_budget(1_471_356, utilization=0.80, gpus_used=8, gpus_per_node=8,
                          cap_mib=2_861_022)
    with pytest.raises(dram.BudgetError, match=r"per rank is -?\d+ GiB \(<= 0\)"):
        dram.per_rank_gib(b, ranks=8, page_cache_gib=1117, buffer_gib=4)


def test_host_dram_mib_reads_meminfo(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       1506668544 kB\nMemFree: 1 kB\n")
    assert dram.host_dram_mib(tmp_path / "meminfo") == 1_471_356


# ------------------------------------------------------------------ rendered commands

H200_COMMAND = (
    "vllm serve MiniMaxAI/MiniMax-M3 --served-model-name MiniMax-M3 --host 127.0.0.1 "
    "--port 8000 --tensor-parallel-size 8 --block-size 128 --kv-cache-dtype fp8 "
    "--default-chat-template-kwargs '{\"enable_thinking\":true}' "
    "--speculative-config '{\"method\":\"eagle3\",\"model\":\"Inferact/MiniMax-M3-EAGLE3-GQA\","
    "\"num_speculative_tokens\":3,\"attention_backend\":\"FLASH_ATTN\","
    "\"rejection_sample_method\":\"synthetic\",\"synthetic_acceptance_length\":2.78}' "
    "--kv-transfer-config '{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"kv_both\","
    "\"kv_connector_extra_config\":{\"load_async\":true}}' "
    "--language-model-only --enable-prompt-tokens-details --enable-per-request-metrics")


def test_h200_mtp_command_env_and_mooncake_files(tmp_path):
    r = _render("minimaxm3-fp8-h200-mtp", workdir=tmp_path)
    assert r.command() == H200_COMMAND
    assert shlex.split(r.command()) == r.argv  # pasteable: the shell gives back the argv
    config_path = str(tmp_path / "mooncake_config.json")
    assert r.env == {"MOONCAKE_CONFIG_PATH": config_path, "PYTHONHASHSEED": "0"}
    assert json.loads(r.files[config_path]) == {
        "mode": "embedded", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "127.0.0.1:20000", "global_segment_size": "87GB",
        "local_buffer_size": "4GB", "protocol": "rdma", "device_name": "",
        "enable_offload": False}
    assert r.sidecars == [["mooncake_master", "--port", "20000",
                           "--eviction_high_watermark_ratio=0.80", "--eviction_ratio=0.10"]]
    assert (r.k, r.synthetic_al, r.allocated_dram_gb) == (3, 2.78, 1234)
    script = r.script()
    assert "golden Inferact/MiniMax-M3-EAGLE3-GQA thinking_on K=3" in script
    assert script.rstrip().endswith(H200_COMMAND)
    assert f"export MOONCAKE_CONFIG_PATH={config_path}" in script


def test_h200_baseline_is_the_same_command_without_speculation(tmp_path):
    plain = _render("minimaxm3-fp8-h200", workdir=tmp_path)
    mtp = _render("minimaxm3-fp8-h200-mtp", workdir=tmp_path)
    i = mtp.argv.index("--speculative-config")
    assert plain.argv == mtp.argv[:i] + mtp.argv[i + 2:]
    assert plain.files == mtp.files and plain.env == mtp.env


def b300_command(tp_args: str, k: int, cpu_bytes: int) -> str:
    return (
        f"vllm serve nvidia/MiniMax-M3-NVFP4 --served-model-name MiniMax-M3 --host 127.0.0.1 "
        f"--port 8000 {tp_args} --block-size 128 --kv-cache-dtype fp8 "
        "--default-chat-template-kwargs '{\"enable_thinking\":true}' "
        "--speculative-config '{\"method\":\"eagle3\",\"model\":\"Inferact/MiniMax-M3-EAGLE3-GQA\","
        f"\"num_speculative_tokens\":{k},\"attention_backend\":\"FLASH_ATTN\"}}' "
        "--kv-transfer-config '{\"kv_connector\":\"SimpleCPUOffloadConnector\",\"kv_role\":"
        f"\"kv_both\",\"kv_connector_extra_config\":{{\"cpu_bytes_to_use\":{cpu_bytes},"
        "\"lazy_offload\":true}}' "
        "--language-model-only --enable-prompt-tokens-details --enable-per-request-metrics")


def test_b300_mtp_commands_per_point_k_and_simple_cpu_offload():
    # 1,471,356 MiB host: all 8 GPUs -> 1234 GB; a TP4 point uses half the node -> 617 GB
    r = _render("minimaxm3-fp4-b300-mtp", 0, conc=8, host_dram_mib=1_471_356)
    assert r.command() == b300_command("--tensor-parallel-size 4", 3, 617_000_000_000)
    assert r.env == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"} and not r.files and not r.sidecars
    r = _render("minimaxm3-fp4-b300-mtp", 1, conc=128, host_dram_mib=1_471_356)
    assert r.command() == b300_command("--tensor-parallel-size 8", 2, 1_234_000_000_000)
    r = _render("minimaxm3-fp4-b300-mtp", 3, conc=256, host_dram_mib=1_471_356)
    assert r.command() == b300_command(
        "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel", 1,
        1_234_000_000_000)
    assert "cpu_bytes_to_use: 1,234 GB x 1e9 = 1,234,000,000,000 bytes" in r.script()


def test_b300_k_map_needs_conc_when_k_depends_on_it(capsys):
    assert main(["recipe", "render", "minimaxm3-fp4-b300-mtp", "--point", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give --conc" in err[0]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_renders_every_point_and_conc(name, monkeypatch):
    for k, v in TINY_ENV.items():
        monkeypatch.setenv(k, v)
    recipe, path = load_recipe(name)
    assert recipe.sim_profile and (REPO / "agentx/sim/profiles" / f"{recipe.sim_profile}.yaml").is_file()
    for i, point in enumerate(recipe.points):
        for conc in point.conc:
            r = render(recipe, i, conc=conc, recipe_dir=path.parent, host_dram_mib=1_471_356)
            assert r.argv[-1] and shlex.split(r.command()) == r.argv


def test_tiny_cpu_expands_its_variables(monkeypatch):
    for k, v in TINY_ENV.items():
        monkeypatch.setenv(k, v)
    r = _render("tiny-cpu")
    assert r.argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                          "--model", "/assets/model"]
    assert json.loads(r.argv[r.argv.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/assets/eagle3", "num_speculative_tokens": 3}
    monkeypatch.delenv("AGENTX_TINY_ASSETS")
    with pytest.raises(InputError, match=r"AGENTX_TINY_ASSETS\} is not set"):
        _render("tiny-cpu")


def test_qwen3_dummy_points_hbm_and_simple_cpu():
    hbm = _render("qwen3-8b-dummy-h200", 0)
    cpu = _render("qwen3-8b-dummy-h200", 1)
    assert hbm.argv[:3] == ["vllm", "serve", "./qwen3-8b-dummy/model"]
    for flag, value in (("--load-format", "dummy"), ("--max-model-len", "131072")):
        assert hbm.argv[hbm.argv.index(flag) + 1] == value
    spec = json.loads(hbm.argv[hbm.argv.index("--speculative-config") + 1])
    assert spec["synthetic_acceptance_length"] == 2.5 and spec["num_speculative_tokens"] == 3
    assert "--kv-transfer-config" not in hbm.argv and hbm.kv_offload == "none"
    kv = json.loads(cpu.argv[cpu.argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"] == {"cpu_bytes_to_use": 8 * 2**30, "lazy_offload": True}
    assert cpu.env == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}


def test_recipe_list_names_every_shipped_recipe(capsys):
    assert main(["recipe", "list"]) == 0
    out = capsys.readouterr().out
    assert sorted(recipe_names()) == sorted(SHIPPED)
    assert all(name in out for name in SHIPPED)


def test_render_cli_prints_the_script(capsys):
    assert main(["recipe", "render", "minimaxm3-fp8-h200-mtp", "--workdir", "/run"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(H200_COMMAND)
    assert "cat > /run/mooncake_config.json <<'EOF'" in out
    assert "mooncake_master --port 20000" in out and "export PYTHONHASHSEED=0" in out


# ------------------------------------------------------------------ golden AL

def test_golden_lookup_and_missing_values():
    path = recipes_dir() / "golden" / "minimaxm3_eagle3.yaml"
    assert golden_al(path, "Inferact/MiniMax-M3-EAGLE3-GQA", True, 3) == 2.78
    with pytest.raises(InputError, match="no golden AL for Inferact/MiniMax-M3-EAGLE3-GQA "
                                         "thinking_off K=3"):
        golden_al(path, "Inferact/MiniMax-M3-EAGLE3-GQA", False, 3)
    with pytest.raises(InputError, match="no golden AL for model 'x'"):
        golden_al(path, "x", True, 3)


def test_golden_file_is_validated(tmp_path):
    bad = tmp_path / "g.yaml"
    bad.write_text("m:\n  thinking_on:\n    3: 4.5\n")
    with pytest.raises(InputError, match=r"g.yaml:2: field 'm.thinking_on' K=3: AL 4.5"):
        golden_al(bad, "m", True, 3)


# ------------------------------------------------------------------ strict loading

BASE = """\
model: some/model
precision: fp8
hardware: h200
gpus: 8
speculative:
  draft: some/draft
  k: 3
  synthetic_al: 2.5
kv_offload:
  kind: mooncake
  host_dram_mib: 1471356
  page_cache_reserve_gib: 414
points:
  - {tp: 8, conc: [1, 2]}
run: {trace: swe, duration_s: 60}
"""


@pytest.mark.parametrize("old,new,line,field,msg", [
    ("gpus: 8\n", "gpus: 8\ngpu: 8\n", 5, "gpu", "unknown option"),
    ("gpus: 8\n", "gpus: eight\n", 4, "gpus", "valid integer"),
    ("hardware: h200", "hardware: h100", 3, "hardware", "'h200', 'b300' or 'cpu'"),
    ("  k: 3\n", "  k: 17\n", 7, "speculative.k", "less than or equal to 16"),
    ("  synthetic_al: 2.5", "  synthetic_al: 4.5", 8, "speculative.synthetic_al",
     "4.5 > K+1 = 4"),
    ("{tp: 8, conc", "{tp: 8, dp: 2, conc", 14, "points.0.tp", "tp*dp = 8*2 = 16 > gpus = 8"),
    ("{tp: 8, conc", "{tp: 8, ep: 4, conc", 14, "points.0.ep", "must be 1 or tp*dp = 8"),
    ("conc: [1, 2]", "conc: []", 14, "points.0.conc", "at least 1 item"),
    ("duration_s: 60}", "duration_s: 60, conc: 0}", 15, "run.conc", "greater than or equal to 1"),
    ("duration_s: 60}", "duration_s: 60, trace_file: x}", 15, "run.trace_file", "unknown option"),
    ("duration_s: 60}", "duration_s: 0}", 15, "run.duration_s", "a run must be bounded"),
    ("  kind: mooncake", "  kind: lmcachee", 9, "kv_offload",
     "kind must be one of: none, simple-cpu, mooncake, lmcache"),
    ("  kind: mooncake", "  kind: lmcache\n  local_buffer_gib: 4", 11,
     "kv_offload.lmcache.local_buffer_gib", "unknown option"),
    ("gpus: 8\n", "gpus: 8\ngpus: 4\n", 5, "gpus", "key given twice"),
    ("  k: 3\n", "  k: 3\n  k: 2\n", 8, "speculative.k", "key given twice"),
])
def test_bad_recipe_is_one_line_naming_file_line_and_field(tmp_path, capsys, old, new, line,
                                                           field, msg):
    assert old in BASE
    path = tmp_path / "bad.yaml"
    path.write_text(BASE.replace(old, new, 1))
    assert main(["recipe", "render", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {path}:{line}: field '{field}' "), err[0]
    assert msg in err[0], err[0]


def test_base_recipe_is_valid(tmp_path, capsys):
    path = tmp_path / "ok.yaml"
    path.write_text(BASE)
    assert main(["recipe", "render", str(path)]) == 0
    assert '"global_segment_size": "87GB"' in capsys.readouterr().out


def test_dram_budget_per_rank_not_positive_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "tight.yaml"
    path.write_text(BASE.replace("page_cache_reserve_gib: 414", "page_cache_reserve_gib: 1140"))
    assert main(["recipe", "render", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {path}:12: field 'kv_offload.page_cache_reserve_gib' ")
    assert "DRAM budget per rank is -3 GiB (<= 0)" in err[0]


def test_unknown_recipe_name_and_point(capsys):
    assert main(["recipe", "render", "no-such-recipe"]) == 2
    assert "no such recipe (known: " in capsys.readouterr().err
    assert main(["recipe", "render", "minimaxm3-fp8-h200", "--point", "3"]) == 2
    assert "no point 3 (the recipe has 1: 0..0)" in capsys.readouterr().err


# ------------------------------------------------------------------ lifecycle

def _group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid`, read from /proc (field 5 of /proc/PID/stat)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(d.name))
    return out


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read()


def launch(recipe, point: int = 0, *, sim: bool = False, recipe_dir: Path = Path("."), **kw):
    """The point's running process handle (ServerHandle), opened as every command opens one."""
    server = open_server(RecipeChoice.of(recipe, Path(recipe_dir) / "recipe", sim=sim,
                                         point=point, **kw))
    server.start()
    return server.handle


def test_launch_simulator_stand_in_health_and_stop(tmp_path):
    recipe, path = load_recipe("minimaxm3-fp8-h200-mtp")
    lines: list[str] = []
    with launch(recipe, 0, sim=True, workdir=tmp_path, recipe_dir=path.parent,
                health_timeout_s=60, on_log=lines.append) as server:
        assert _get(server.base_url + "/health")[0] == 200
        models = json.loads(_get(server.base_url + "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["MiniMax-M3"]
        assert server.model == "MiniMax-M3"
        argv = server.proc.args
        assert argv[argv.index("--synthetic-al") + 1] == "2.78"
        assert argv[argv.index("--kv-offload") + 1] == "mooncake"
        assert _group_members(server.pgid)
        pgid = server.pgid
    assert not server.running and _group_members(pgid) == []


def _fake_recipe(tmp_path: Path, code: str, timeout: float = 30) -> Path:
    path = tmp_path / "fake.yaml"
    path.write_text(f"command: [{sys.executable}, -c, {json.dumps(code)}, serve]\n"
                    "model: m\nprecision: bf16\nhardware: cpu\ngpus: 1\n"
                    f"points: [{{conc: [1]}}]\nhealth_timeout_s: {timeout}\n")
    return path


def test_server_that_exits_is_reported_with_its_log(tmp_path):
    recipe, _ = load_recipe(str(_fake_recipe(tmp_path, "import sys; print('boom'); sys.exit(3)")))
    with pytest.raises(ServerStartError, match=r"exited with code 3") as info:
        launch(recipe, workdir=tmp_path / "w")
    assert "boom" in info.value.tail


def test_server_without_health_is_stopped_after_the_timeout(tmp_path):
    token = f"agentx-test-{os.getpid()}-{time.monotonic_ns()}"  # marks our two processes
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)  # {token}']); print('child up', flush=True); "
            f"time.sleep(60)  # {token}")
    recipe, _ = load_recipe(str(_fake_recipe(tmp_path, code, timeout=3)))
    lines: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="did not answer within 3 s") as info:
        launch(recipe, workdir=tmp_path / "w", on_log=lines.append)
    assert time.monotonic() - t0 < 30
    assert "child up" in lines and "child up" in info.value.tail
    assert _pids_running(token) == []  # the server and the child it forked are both gone


def _pids_running(needle: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `needle`, from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in cmd and state != "Z":
                out.append(int(d.name))
    return out


def test_agentx_serve_cli_stops_the_group_on_sigint(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentx.cli", "serve", "tiny-cpu", "--sim", "--port", "0",
         "--workdir", str(tmp_path), "--quiet"],
        stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "ready:" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "agentx serve exited early"
        assert "ready: http://127.0.0.1:" in line and "model tiny" in line
        url = line.split()[1]
        assert _get(url + "/health")[0] == 200
        port = url.rsplit(":", 1)[1]
        [server] = _pids_running(f"agentx.sim --host 127.0.0.1 --port {port} ")
        assert _group_members(server) == [server]  # its own group, led by the server
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert _group_members(server) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_qwen3_dummy_model_dir_is_qwen3_8b_shaped(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    from agentx.recipe.dummy import build

    out = build(tmp_path / "q")
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"]) == (36, 4096, 32, 8, 128)
    assert cfg["max_position_embeddings"] == 131072 and cfg["rope_scaling"]["factor"] == 4.0
    tok = Tokenizer.from_file(str(out / "model" / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["vocab_size"]
    text = "def main(argv):\n    return 0\n<think>"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    draft = json.loads((out / "eagle3" / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert draft["draft_vocab_size"] == cfg["vocab_size"] and draft["target_hidden_size"] == 4096
