"""Config files (docs/commands.md): `--config FILE` holds the same options as the flags and is
checked as strictly (unknown keys and bad values name the file, line and key), flags override
it, and `--print-config` writes the effective options as YAML that `--config` reads back to
the same options, secrets redacted. One mechanism (agentx.options + agentx.yamlconf) serves
every command with an option model; a real short run against the embedded simulator shows a
file's options reach the run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from agentx.cli import COMMANDS, build_parser, main
from agentx.commands import ab as ab_cmd
from agentx.commands import run as run_cmd
from agentx.options import from_args
from agentx.yamlconf import read_config

RUN_FILE = """\
# a short run on the embedded simulator
conc: 2
max-requests: 4          # the flag's spelling works as a key too
max_think_s: 0
warmup: 0
validate: warn
progress: false
scrape_interval: 0
context_scale: 0.05
labels: {who: config-file}
sim:
  profile: cpu-tiny
  time_scale: 50
"""


def parse(argv: list[str]) -> argparse.Namespace:
    """The namespace `agentx ARGV` runs with, --config read as cli.main reads it."""
    ns = build_parser(argv[0]).parse_args(argv)
    read_config(ns)
    return ns


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def printed(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main([*argv, "--print-config"]) == 0
    return capsys.readouterr().out


def error(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_run_from_a_config_file_with_a_flag_over_it(tmp_path):
    """A real run: the file's options (top level and `sim:`) reach it, --conc overrides the
    file's conc, and summary.json records the merged options."""
    cfg = write(tmp_path, RUN_FILE)
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--conc", "1", "-o", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    c = s["config"]
    assert (c["conc"], c["max_requests"], c["max_think_s"], c["validation"]) == (1, 4, 0.0,
                                                                                 "warn")
    assert c["labels"] == {"who": "config-file"}
    assert c["context_scale"] == 0.05
    assert s["stop_reason"] == "max_requests"
    assert s["completed"] + s["warmup_requests"] == 4
    assert s["target"]["profile"] == "cpu-tiny"  # from the file's `sim:` section


def test_flags_override_the_file_and_defaults_fill_the_rest(tmp_path):
    cfg = write(tmp_path, RUN_FILE)
    ns = parse(["run", "--config", str(cfg), "--max-requests", "9", "--sim-time-scale", "7"])
    c = run_cmd.config_from_args(ns)
    assert (c.conc, c.max_requests, c.warmup_s, c.validation) == (2, 9, 0.0, "warn")
    assert c.timeout_s == 600.0  # not in the file, no flag: the default
    assert run_cmd.sim_from_args(ns).time_scale == 7.0


@pytest.mark.parametrize("argv", [
    ["run", "--conc", "3", "--max-requests", "5", "--slo", "ttft:2000,tpot:50",
     "--label", "a=b", "--extra-body", '{"top_k": 5}', "--sim-spec-k", "2", "--warmup", "auto",
     "--no-cache-salt", "--thinking", "off"],
    ["ab", "--a", "http://127.0.0.1:1", "--b", "tiny-cpu", "--sim", "--repeats", "2",
     "--max-requests", "8", "--sim-time-scale", "20"],
    ["sweep", "tiny-cpu", "--conc", "1,2", "--set", "think_scale=0.1", "--duration", "5"],
    ["calibrate", "--recipe", "tiny-cpu", "--sim", "--k", "1,3", "--thinking", "on"],
    ["serve-sim", "--profile", "cpu-tiny", "--port", "0", "--fail-kinds", "429,reset"],
    ["report", "a", "b", "--slo", "ttft:100"],
    ["recipe", "render", "tiny-cpu", "--host-dram-mib", "4096"],
])
def test_print_config_reads_back_to_the_same_options(argv, tmp_path, capsys):
    """--print-config's YAML, given back with --config, yields the same options (printed
    again: the same text), and it is what the flags alone give."""
    first = printed(argv, capsys)
    doc = yaml.safe_load(first)
    assert isinstance(doc, dict) and doc
    cfg = write(tmp_path, first)
    command = argv[:2] if argv[0] == "recipe" else argv[:1]
    again = printed([*command, "--config", str(cfg)], capsys)
    assert again == first


def test_the_file_gives_the_same_model_as_the_flags(tmp_path, capsys):
    golden = write(tmp_path, "d/eagle3:\n  thinking_on:\n    3: 2.9\n", "golden.yaml")
    argv = ["run", "--conc", "3", "--max-requests", "5", "--slo", "ttft:2000", "--label", "k=v",
            "--golden-al", f"{golden}:d/eagle3:on:3"]
    from_flags = run_cmd.config_from_args(parse(argv))
    cfg = write(tmp_path, printed(argv, capsys))
    from_file = run_cmd.config_from_args(parse(["run", "--config", str(cfg)]))
    assert from_file == from_flags
    ab = ["ab", "--a", "http://127.0.0.1:1", "--b", "http://127.0.0.1:2", "--max-requests", "4",
          "--sim-spec-k", "3"]
    cfg = write(tmp_path, printed(ab, capsys), "ab.yaml")
    assert ab_cmd.config_from_args(parse(["ab", "--config", str(cfg)])) == \
        ab_cmd.config_from_args(parse(ab))


def test_secrets_are_redacted_and_must_be_given_again(tmp_path, capsys):
    out = printed(["run", "--max-requests", "2", "--api-key", "sk-very-secret",
                   "--base-url", "http://user:pw@127.0.0.1:9/v1"], capsys)
    assert "sk-very-secret" not in out and "pw@" not in out
    doc = yaml.safe_load(out)
    assert doc["api_key"] == "<redacted>"
    assert doc["base_url"] == "http://<redacted>@127.0.0.1:9"  # normalised: no /v1
    cfg = write(tmp_path, out)
    lines = {t.split(":")[0]: i for i, t in enumerate(out.splitlines(), 1)}
    err = error(["run", "--config", str(cfg)], capsys)
    assert err == (f"error: {cfg}:{lines['base_url']}: field 'base_url' redacted by "
                   "--print-config: give the value with --base-url (or drop the line for its "
                   "default)")
    err = error(["run", "--config", str(cfg), "--base-url", "http://127.0.0.1:9"], capsys)
    assert err.startswith(f"error: {cfg}:{lines['api_key']}: field 'api_key' redacted by "
                          "--print-config: give the value with --api-key"), err
    # the secret given by its flag (and the URL by its own), the file reads back
    ns = parse(["run", "--config", str(cfg), "--api-key", "sk-2", "--base-url",
                "http://127.0.0.1:9/v1"])
    c = run_cmd.config_from_args(ns)
    assert c.secret_key() == "sk-2" and c.max_requests == 2
    # serve-sim's required key is a secret too
    out = printed(["serve-sim", "--api-key", "sim-secret"], capsys)
    assert "sim-secret" not in out and yaml.safe_load(out)["api_key"] == "<redacted>"


@pytest.mark.parametrize("text,line,field,message", [
    ("conc: 2\nmax_reqests: 5\n", 2, "max_reqests", "unknown option (did you mean "
     "'max_requests'?)"),
    ("conc: two\n", 1, "conc", "input should be a valid integer"),
    ("max_requests: 3\nconc: 0\n", 2, "conc", "input should be greater than or equal to 1"),
    ("max_requests: 3\nsim:\n  spec_k: 99\n", 3, "sim.spec_k", "less than or equal to 16"),
    ("max_requests: 3\nsim:\n  port: 8000\n", 3, "sim.port", "unknown option"),
    ("max_requests: 3\nsim: 3\n", 2, "sim", "must be a mapping of the --sim-* options"),
    ("duration: 5\nduration_s: 3\n", 2, "duration_s", "given twice (also as 'duration')"),
    ("conc: 2\nconc: 3\n", 2, "conc", "key given twice"),
    ("max_requests: 3\nduration_s: 0\nstart_min: 0.9\nstart_max: 0.1\n", 3, "start_min",
     "must be <= start_max"),
    ("config: other.yaml\n", 1, "config", "unknown option"),
])
def test_bad_files_name_file_line_and_key(text, line, field, message, tmp_path, capsys):
    cfg = write(tmp_path, text)
    err = error(["run", "--config", str(cfg)], capsys)
    assert err.startswith(f"error: {cfg}:{line}: field {field!r} "), err
    assert message in err, err


def test_file_level_problems(tmp_path, capsys):
    assert error(["run", "--config", str(tmp_path / "none.yaml")], capsys) == \
        f"error: {tmp_path / 'none.yaml'}: file not found"
    cfg = write(tmp_path, "- conc\n")
    assert "must be a YAML mapping" in error(["run", "--config", str(cfg)], capsys)
    cfg = write(tmp_path, "conc: [1\n")
    assert error(["run", "--config", str(cfg)], capsys).startswith(f"error: {cfg}:2: not valid "
                                                                    "YAML")
    # an empty file is no options: the defaults (and flags)
    cfg = write(tmp_path, "# nothing yet\n")
    assert yaml.safe_load(printed(["run", "--config", str(cfg), "--conc", "5"], capsys))[
        "conc"] == 5


def test_a_flag_over_a_bad_file_value_wins(tmp_path):
    """The flag replaces the file's value before validation: no error for the file's."""
    cfg = write(tmp_path, "conc: 0\nmax_requests: 2\n")
    assert run_cmd.config_from_args(parse(["run", "--config", str(cfg), "--conc", "4"])).conc == 4


def test_positional_argument_from_the_file(tmp_path, capsys):
    """sweep's NAME|PATH may be in the file; given on the line as well, the line wins."""
    from agentx.sweep.config import SweepConfig

    cfg = write(tmp_path, "recipe: tiny-cpu\nconc: [1, 2]\nduration: 5\nset: [think_scale=0.1]\n")
    o = from_args(parse(["sweep", "--config", str(cfg)]), SweepConfig)
    assert (o.recipe, o.conc, o.duration_s, o.run_set) == ("tiny-cpu", [1, 2], 5.0,
                                                           ["think_scale=0.1"])
    o = from_args(parse(["sweep", "other.yaml", "--config", str(cfg)]), SweepConfig)
    assert o.recipe == "other.yaml"
    err = error(["sweep", "--conc", "1"], capsys)
    assert err == ("error: command line: field 'NAME|PATH' the NAME|PATH argument is required "
                   "(or `recipe:` in --config)")


def test_nested_flag_spelled_at_the_top(tmp_path):
    """`sim-spec-k: 2` (the flag without dashes) is the same as `sim: {spec_k: 2}`."""
    cfg = write(tmp_path, "max_requests: 2\nsim-spec-k: 2\n")
    assert run_cmd.sim_from_args(parse(["run", "--config", str(cfg)])).spec_k == 2


def test_every_command_with_an_option_model_takes_a_config_file():
    from test_commands import LEAVES

    with_models = [(n, p) for n, p in LEAVES if n != "recipe list"]
    assert {n.split()[0] for n, _ in with_models} == set(COMMANDS)
    for name, p in with_models:
        flags = {f for a in p._actions for f in a.option_strings}
        assert {"--config", "--print-config"} <= flags, name


def test_ab_sim_is_the_switch_or_the_simulators_options(tmp_path):
    """ab has both `--sim` (serve recipe sides on the simulator) and `--sim-*`: `sim: true`
    is the switch, `sim: {...}` the simulator's options."""
    sides = "a: http://127.0.0.1:1\nb: tiny-cpu\nmax_requests: 4\n"
    cfg = write(tmp_path, sides + "sim: true\n")
    c = ab_cmd.config_from_args(parse(["ab", "--config", str(cfg)]))
    assert c.recipe_sim is True and c.sim.spec_k == 0
    cfg = write(tmp_path, sides + "sim: {spec_k: 3}\n")
    c = ab_cmd.config_from_args(parse(["ab", "--config", str(cfg)]))
    assert c.recipe_sim is False and c.sim.spec_k == 3
