"""Small things users hit (issue 22 item 9): `agentx calibrate` leaves the source tree alone
(its golden file goes under the output directory), `recipe render` says where the DRAM budget's
host figure came from and how to give the GPU host's, the tiny-cpu recipe's error says how to
build its assets, and the distribution has a name of its own on the package index."""
from __future__ import annotations

import json
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

from agentx.cli import main
from agentx.golden_al import load_golden
from agentx.offload.dram import host_dram_mib
from agentx.recipe.load import recipes_dir

REPO = Path(__file__).resolve().parents[1]
TINY_KEY = "${AGENTX_TINY_ASSETS}/eagle3"  # tiny-cpu's golden key: its draft, as written


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_calibrate_writes_its_golden_file_under_the_output_dir(tmp_path, capsys):
    """No --golden: <output-dir>/golden/<recipe>.yaml; the shipped recipes are untouched, and
    the last note says which file the recipe reads and how to pin these values."""
    before = _tree(recipes_dir())
    out = tmp_path / "cal"
    code = main(["calibrate", "--recipe", "tiny-cpu", "--sim", "--sim-time-scale", "50",
                 "--max-tokens", "16", "--k", "1", "--thinking", "on", "--requests", "3",
                 "-o", str(out)])
    assert code == 0
    golden = out / "golden" / "tiny-cpu.yaml"
    res = json.loads((out / "calibration.json").read_text())
    assert res["golden_file"] == str(golden)
    assert set(load_golden(golden)[TINY_KEY].thinking_on) == {1}
    assert _tree(recipes_dir()) == before
    said = capsys.readouterr().out
    assert f"note: written to {golden}; recipe tiny-cpu reads " in said
    assert "merge into it with --golden " in said


def test_calibrate_golden_name_and_explicit_path(tmp_path):
    from agentx.calibrate.config import CalibrateConfig
    from agentx.calibrate.flow import golden_path

    cfg = CalibrateConfig(recipe="tiny-cpu", out="mine")
    assert golden_path(cfg, "tiny-cpu", tmp_path) == tmp_path / "golden" / "mine.yaml"
    cfg = CalibrateConfig(recipe="tiny-cpu", golden=str(tmp_path / "g.yaml"))
    assert golden_path(cfg, "tiny-cpu", tmp_path / "o") == tmp_path / "g.yaml"
    cfg = CalibrateConfig(url=["1=http://127.0.0.1:1"])
    assert golden_path(cfg, "org/Draft Model", tmp_path) == \
        tmp_path / "golden" / "org_Draft_Model.yaml"


def _render(argv: list[str], capsys) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["recipe", "render", *argv]) == 0
    got = capsys.readouterr()
    return got.out, got.err


def _host_line(script: str) -> str:
    return next(x for x in script.splitlines() if x.startswith("#   host DRAM: "))


def test_render_says_when_the_budget_is_this_machines_memory(capsys):
    """minimaxm3-fp4-b300 says host_dram_mib: auto: the budget is this machine's MemTotal,
    said in the script and on stderr, with the flag that gives the GPU host's."""
    script, err = _render(["minimaxm3-fp4-b300"], capsys)
    line = _host_line(script)
    assert line.startswith(f"#   host DRAM: {host_dram_mib():,} MiB")
    assert "from THIS machine's MemTotal" in line and "--host-dram-mib" in line
    assert err.strip() == ("agentx recipe render: note: the DRAM budget above is this "
                           "machine's memory, not the GPU host's: give --host-dram-mib MIB "
                           "(`free -m` on that host)")
    script, err = _render(["minimaxm3-fp4-b300", "--host-dram-mib", "2000000"], capsys)
    assert _host_line(script) == "#   host DRAM: 2,000,000 MiB (cap 2,861,022 MiB); from " \
                                 "--host-dram-mib"
    assert err == ""
    script, err = _render(["minimaxm3-fp8-h200"], capsys)
    assert _host_line(script).endswith("; from the recipe's kv_offload.host_dram_mib")
    assert err == ""


BUILD = "python tests/vllm_env/build_assets.py"


def test_tiny_cpu_unset_assets_say_how_to_build_them(monkeypatch, capsys):
    monkeypatch.delenv("AGENTX_TINY_ASSETS", raising=False)
    assert main(["recipe", "render", "tiny-cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {recipes_dir() / 'tiny-cpu.yaml'}: ${{AGENTX_TINY_ASSETS}} "
                          "is not set: the tiny model's assets: build them")
    assert f"`{BUILD}`" in err and "export AGENTX_TINY_ASSETS=DIR" in err
    assert "\n" not in err
    assert (REPO / BUILD.split()[1]).is_file()  # the command names a real script


def test_tiny_cpu_missing_assets_fail_before_launching(monkeypatch, tmp_path, capsys):
    """Set but naming nothing: `serve` says so with the same help, before any server starts
    (no command.sh, no server log)."""
    missing = tmp_path / "no-assets"
    monkeypatch.setenv("AGENTX_TINY_ASSETS", str(missing))
    work = tmp_path / "serve"
    assert main(["serve", "tiny-cpu", "--port", "0", "--workdir", str(work), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"${{AGENTX_TINY_ASSETS}} is {missing}, which does not exist: " in err
    assert f"`{BUILD}`" in err
    assert not list(work.rglob("*.log"))


def test_distribution_name_is_free_and_the_command_stays_agentx():
    """`agentx` on the package index is another project (0.0.1..0.0.27): ours is
    agentx-bench, import and command agentx; no install hint names the other project."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "agentx-bench"
    assert meta["scripts"] == {"agentx": "agentx.cli:main"}
    hint = re.compile(r"\bagentx\[")  # `pip install agentx[ray]` would fetch the other one
    for path in [*(REPO / "agentx").rglob("*.py"), *(REPO / "docs").glob("*.md"),
                 *(REPO / "recipes").glob("*"), REPO / "README.md"]:
        if path.is_file():
            assert not hint.search(path.read_text()), path


def test_every_extra_an_install_hint_names_exists():
    """`pip install 'agentx-bench[X]'` in a message or a doc names an extra pyproject has."""
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    named = {m for path in [*(REPO / "agentx").rglob("*.py"), *(REPO / "docs").glob("*.md"),
                            *(REPO / "recipes").glob("*.*")]
             for m in re.findall(r"agentx-bench\[(\w+)\]", path.read_text())}
    assert {"hf", "ray"} <= named
    assert named <= extras, named - extras
