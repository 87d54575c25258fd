"""The option schema: each option declared once (agentx/config.py, agentx/sim/config.py) and
the command lines derived from it. These tests walk the schema itself, so a new option is
covered without restating it here."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import SecretStr, ValidationError

from agentx.cli import build_parser
from agentx.commands.run import SIM_EXCLUDED, SIM_PREFIX, config_from_args, sim_from_args
from agentx.commands.serve_sim import config_from_args as sim_config_from_args
from agentx.config import RunConfig
from agentx.errors import InputError
from agentx.options import _strip_optional, cli_fields, flag_of
from agentx.sim.config import SimConfig


def _other_value(name: str, info: Any) -> tuple[str | None, Any]:
    """A valid non-default value for a field and its command-line spelling."""
    tp = _strip_optional(info.annotation)
    default = info.get_default(call_default_factory=True)
    lo = next((m.ge for m in info.metadata if hasattr(m, "ge") and m.ge is not None), None)
    if name == "golden_al":  # FILE:MODEL:MODE:K of a shipped golden file (agentx/recipe/golden.py)
        from agentx.golden_al import GoldenPin
        from agentx.recipe.load import recipes_dir

        text = f"{recipes_dir()}/golden/minimaxm3_eagle3.yaml:Inferact/MiniMax-M3-EAGLE3:on:3"
        return text, GoldenPin.model_validate(text)
    if name == "labels":  # KEY=VALUE (repeatable flag: agentx/config.py _labels)
        return "team=perf", {"team": "perf"}
    if name == "slo":  # its own NAME:MS,... string form (agentx/metrics/goodput.py)
        return "ttft:500,e2el:2000", {"ttft": 500.0, "e2el": 2000.0}
    if get_origin(tp) is Literal:
        v = next(c for c in get_args(tp) if c != default)
        return str(v), v
    if tp is bool:
        return None, not default
    if tp is int:
        v = (default or lo or 0) + 1
        return str(v), v
    if tp is float:
        v = 0.5 if default in (None, 0.0, 1.0) else default / 2
        if lo is not None and v < lo:
            v = lo + 0.5
        return str(v), v
    if get_origin(tp) in (list, tuple):
        v = [0.5] if get_args(tp)[0] is float else list(get_args(get_args(tp)[0]))[:2]
        return ",".join(map(str, v)), (tuple(v) if get_origin(tp) is tuple else v)
    if tp is dict:
        return '{"k": 1}', {"k": 1}
    if tp is SecretStr:
        return "sk-x", "sk-x"
    if get_origin(tp) in (typing.Union,):  # workers: int | "auto"
        return "3", 3
    if name.endswith("url"):
        return "http://127.0.0.1:9", "http://127.0.0.1:9"
    return f"x-{name}", f"x-{name}"


def _argv_for(model, prefix: str, exclude=()) -> list[tuple[list[str], str, Any]]:
    out = []
    for name, info in cli_fields(model, exclude):
        text, value = _other_value(name, info)
        flag = flag_of(name, info, prefix)
        if text is None:  # bool: --x / --no-x
            argv = [flag if value else "--no-" + flag[2:]]
        else:
            argv = [flag, text]
        out.append((argv, name, value))
    return out


def _parse_run(*argv: str) -> RunConfig:
    ns = build_parser("run").parse_args(["run", *argv])
    sim_from_args(ns)  # the --sim-* flags are checked too, as `agentx run` does
    return config_from_args(ns)


def _parse_sim(*argv: str) -> SimConfig:
    return sim_from_args(build_parser("run").parse_args(["run", *argv]))


@pytest.mark.parametrize("argv,name,value", _argv_for(RunConfig, ""))
def test_every_run_flag_reaches_its_field(argv, name, value):
    extra = ["--max-requests", "5"] if name == "duration_s" else []
    cfg = _parse_run(*argv, *extra)
    got = getattr(cfg, name)
    if isinstance(got, SecretStr):
        got = got.get_secret_value()
    assert got == value


@pytest.mark.parametrize("argv,name,value", _argv_for(SimConfig, SIM_PREFIX, SIM_EXCLUDED))
def test_every_sim_flag_reaches_the_embedded_simulator(argv, name, value):
    extra = {"synthetic_al": ["--sim-spec-k", "3"], "synthetic_rates": ["--sim-spec-k", "1"],
             "fixed_ttft_ms": ["--sim-fixed-itl-ms", "1"],
             "fixed_itl_ms": ["--sim-fixed-ttft-ms", "1"]}.get(name, [])
    if name == "spec_k":
        extra = []
    assert getattr(_parse_sim(*argv, *extra), name) == value


@pytest.mark.parametrize("argv,name,value", _argv_for(SimConfig, ""))
def test_every_serve_sim_flag_reaches_its_field(argv, name, value):
    extra = {"synthetic_al": ["--spec-k", "3"], "synthetic_rates": ["--spec-k", "1"],
             "fixed_ttft_ms": ["--fixed-itl-ms", "1"], "fixed_itl_ms": ["--fixed-ttft-ms", "1"]
             }.get(name, [])
    ns = build_parser("serve-sim").parse_args(["serve-sim", *argv, *extra])
    assert getattr(sim_config_from_args(ns), name) == value


def test_help_lists_each_field_once():
    text = build_parser("run")._subparsers._group_actions[0].choices["run"].format_help()
    for name, info in cli_fields(RunConfig):
        assert text.count(flag_of(name, info) + " ") + text.count(flag_of(name, info) + "\n") \
            >= 1, name
    flags = [a.option_strings for a in
             build_parser("run")._subparsers._group_actions[0].choices["run"]._actions]
    seen = [f for fs in flags for f in fs]
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("argv,flag,words", [
    (["--conc", "0"], "--conc", "greater than or equal to 1"),
    (["--timeout", "-1"], "--timeout", "greater than 0"),
    (["--thinking", "maybe"], "--thinking", "'on' or 'off'"),
    (["--extra-body", "[1]"], "--extra-body", "JSON object"),
    (["--extra-body", "{nope"], "--extra-body", "not valid JSON"),
    (["--start-min", "0.9"], "--start-min", "start_max"),
    (["--duration", "0"], "--duration", "bounded"),
    (["--sim-spec-k", "2", "--sim-synthetic-al", "5"], "--sim-synthetic-al", "spec_k+1"),
    (["--sim-fail-kinds", "429,boom"], "--sim-fail-kinds", "boom"),
    (["--sim-time-scale", "0"], "--sim-time-scale", "greater than 0"),
    (["--workers", "0"], "--workers", ">= 1"),
])
def test_bad_values_are_one_line_naming_the_flag(argv, flag, words):
    with pytest.raises(InputError) as e:
        _parse_run(*argv)
    msg = str(e.value)
    assert "\n" not in msg and f"'{flag}'" in msg and words in msg, msg


def test_cli_exit_code_and_single_line():
    p = subprocess.run([sys.executable, "-m", "agentx.cli", "run", "--gpus", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "'--gpus'" in p.stderr


def test_unknown_keys_are_errors():
    with pytest.raises(Exception, match="extra|unknown"):
        RunConfig(conc=2, colour="blue")
    with pytest.raises(Exception, match="extra|unknown"):
        SimConfig(spec_kk=3)
    cfg = RunConfig()
    with pytest.raises(ValidationError):
        cfg.conc = -1  # assignments are validated too


def test_secret_never_in_public_config_and_env_fallback(monkeypatch):
    cfg = RunConfig(api_key="sk-secret")
    assert "sk-secret" not in repr(cfg) and "sk-secret" not in str(cfg.public())
    assert cfg.public()["api_key"] == "<redacted>" and cfg.secret_key() == "sk-secret"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert RunConfig().secret_key() == "sk-env" and RunConfig().public()["api_key"] is None


def test_typed_config_travels_to_workers():
    cfg = _parse_run("--conc", "3", "--extra-body", '{"a": 1}')
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.extra_body == {"a": 1}
    sim = _parse_sim("--sim-spec-k", "2")
    assert pickle.loads(pickle.dumps(sim)) == sim and sim.spec_k == 2
    assert RunConfig.model_validate(cfg.public() | {"api_key": None}) == cfg


def test_sim_config_env_independent():
    # the schema has no hidden dependence on the environment
    assert os.environ.get("AGENTX_NOPE") is None
    assert SimConfig().model_dump() == SimConfig.model_validate({}).model_dump()


@pytest.mark.parametrize("text,line,field,words", [
    ("name: x\nhardware:\n  gpu: g\n  hbm_gib: 1\n  hbm_tbps: one\n", 5, "hardware.hbm_tbps",
     "valid number"),
    ("name: x\nhardware: {gpu: g, hbm_gib: 1, hbm_tbps: 1, peak_tflops: 1, nvlink_gbps: 1,\n"
     "  host_gbps: 1}\nmodel:\n  name: m\n  colour: red\n", 6, "model.colour", "unknown"),
    ("name: [x\n", 2, None, "not valid YAML"),
    ("- a\n- b\n", 1, None, "mapping"),
])
def test_yaml_errors_name_file_line_and_field(tmp_path, text, line, field, words):
    from agentx.sim.profile import load_profile

    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_profile(str(f))
    assert (e.value.source, e.value.line) == (str(f), line)
    assert e.value.field == field and words in e.value.message, str(e.value)


def test_shipped_profiles_load_strictly():
    from agentx.sim.profile import load_profile, shipped

    assert {"cpu-tiny", "h200-minimaxm3-fp8"} <= set(shipped())
    for name in shipped():
        p = load_profile(name)
        assert p.name == name and p.hardware.hbm_gib > 0 and p.model.layers > 0


@pytest.mark.parametrize("given,expected", [
    ("http://h:8000", "http://h:8000"), ("http://h:8000/", "http://h:8000"),
    ("http://h:8000/v1", "http://h:8000"), ("https://h/prefix/v1/", "https://h/prefix"),
])
def test_base_url_normalised(given, expected):
    assert RunConfig(base_url=given).base_url == expected


@pytest.mark.parametrize("bad", ["notaurl", "ftp://h", "http://", "http://h:99999"])
def test_bad_base_url_is_one_line(bad):
    with pytest.raises(InputError) as e:
        _parse_run("--base-url", bad)
    assert "'--base-url'" in str(e.value) and "URL" in str(e.value) or "port" in str(e.value)


def test_credentials_in_base_url_never_recorded():
    from agentx.urls import redact_url, scrub

    cfg = RunConfig(base_url="http://user:sk-123@h:8000/v1")
    assert cfg.base_url == "http://user:sk-123@h:8000"  # still used to connect
    assert "sk-123" not in str(cfg.public()) and "user" not in str(cfg.public())
    assert redact_url(cfg.base_url) == "http://<redacted>@h:8000"
    assert scrub("401 url=http://user:sk-123@h:8000/v1/models", cfg.base_url).count("sk-123") == 0
