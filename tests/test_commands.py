"""The command line on top (agentx/cli.py, agentx/commands/): every flag of every subcommand
is derived from an option model, one concept has one flag everywhere, old spellings still
work with a one-line deprecation, and `agentx --help` imports no subcommand."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from agentx.cli import COMMANDS, build_parser, main
from agentx.options import cli_fields

REPO = Path(__file__).resolve().parents[1]


def leaf_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(`cmd sub`, parser) of every subcommand, sub-subcommands (recipe render) included."""
    out = []

    def walk(name: str, p: argparse.ArgumentParser) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append((name, p))
        for a in subs:
            for sub_name, sp in a.choices.items():
                walk(f"{name} {sub_name}".strip(), sp)

    for command in COMMANDS:
        top = build_parser(command)
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        walk(command, sub.choices[command])
    return out


LEAVES = leaf_parsers()


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def visible(a: argparse.Action) -> list[str]:
    return [] if a.help == argparse.SUPPRESS else list(a.option_strings)


def test_every_subcommand_is_listed_and_has_flags():
    names = {n.split()[0] for n, _ in LEAVES}
    assert names == set(COMMANDS)
    assert {"recipe list", "recipe render", "trace stats", "trace gen"} <= {n for n, _ in LEAVES}


@pytest.mark.parametrize("name,parser", LEAVES, ids=[n for n, _ in LEAVES])
def test_every_flag_comes_from_an_option_model(name, parser):
    """Each argument (flags and positionals) was added by options.add_arguments for a model
    field, and --help shows each field's flag once."""
    for a in parser._actions:
        if a.dest == "help" or isinstance(a, argparse._SubParsersAction):
            continue
        model, field = getattr(a, "field", (None, None))
        assert model is not None, f"{name}: {a.option_strings or a.dest} is hand-written"
        assert field in dict(cli_fields(model)), (name, field)
    shown = [f for a in options(parser) for f in visible(a)]
    assert len(shown) == len(set(shown)), name


def test_no_hand_written_argument_outside_options():
    """argparse arguments are declared in one place: agentx/options.py derives them."""
    for path in (REPO / "agentx").rglob("*.py"):
        if path.name != "options.py":
            assert ".add_argument(" not in path.read_text(), path


# concept -> (dests that express it, its flags): one flag per concept in every subcommand
CONCEPTS = [
    ("where results go", {"output_dir"}, ["-o", "--output-dir"]),
    ("seconds to wait for /health", {"health_timeout_s"}, ["--health-timeout"]),
    ("serve on the simulator instead of vLLM", {"sim", "recipe_sim"}, ["--sim", "--no-sim"]),
    ("the simulator's speed-up", {"sim_time_scale"}, ["--sim-time-scale"]),
]


@pytest.mark.parametrize("concept,dests,flags", CONCEPTS, ids=[c for c, _, _ in CONCEPTS])
def test_one_concept_one_flag(concept, dests, flags):
    users = []
    for name, p in LEAVES:
        for a in options(p):
            if a.dest in dests and visible(a):
                assert visible(a) == flags, (concept, name, visible(a))
                users.append(name)
    assert len(users) >= 2, (concept, users)


def test_same_option_same_flag_everywhere():
    """An option reaching the same field name in several commands is spelt alike in all."""
    seen: dict[str, tuple[str, list[str]]] = {}
    for name, p in LEAVES:
        for a in options(p):
            if visible(a):
                first = seen.setdefault(a.dest, (name, visible(a)))
                assert first[1] == visible(a), (a.dest, first, name, visible(a))


def test_retired_spellings_are_hidden():
    for name, p in LEAVES:
        for a in options(p):
            assert not set(visible(a)) & {"--out", "--recipe-sim"}, name
            if "--timeout" in visible(a):  # a run's per-read timeout, never the /health wait
                assert a.dest == "timeout_s", name
            if "-o" in visible(a):
                assert "--output-dir" in visible(a), name


@pytest.mark.parametrize("argv,dest,value,new", [
    (["report", "d1", "d2", "--out", "x"], "output_dir", "x", "--output-dir"),
    (["serve", "tiny-cpu", "--timeout", "5"], "health_timeout_s", "5", "--health-timeout"),
    (["sweep", "tiny-cpu", "--timeout", "5"], "health_timeout_s", "5", "--health-timeout"),
    (["ab", "--a", "tiny-cpu", "--b", "tiny-cpu", "--recipe-sim"], "recipe_sim", True, "--sim"),
    (["ab", "--a", "u", "--b", "v", "--no-recipe-sim"], "recipe_sim", False, "--no-sim"),
    (["trace", "gen", "--out", "f.tar.xz"], "output_file", "f.tar.xz", "--output-file"),
    (["calibrate", "--recipe", "tiny-cpu", "--out", "g"], "out", "g", "--golden-name"),
])
def test_old_spellings_still_work_and_warn(argv, dest, value, new, capsys):
    ns = build_parser(argv[0]).parse_args(argv)
    assert getattr(ns, dest) == value
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"is deprecated, use {new}"), err


def test_old_spelling_end_to_end(tmp_path, capsys):
    out = tmp_path / "mini.tar.xz"
    assert main(["trace", "gen", "--seed", "5", "--sessions", "2", "--out", str(out)]) == 0
    assert out.exists()
    assert "agentx: --out is deprecated, use --output-file" in capsys.readouterr().err


def test_model_errors_name_the_new_flag(capsys):
    assert main(["sweep", "tiny-cpu", "--warmup", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--warmup" in err and "auto" in err
    assert main(["sweep", "tiny-cpu", "--set", "novalue"]) == 2
    assert "--set" in capsys.readouterr().err


def test_sweep_warmup_takes_auto():
    from agentx.options import from_args
    from agentx.sweep.config import SweepConfig

    ns = build_parser("sweep").parse_args(["sweep", "tiny-cpu", "--warmup", "auto",
                                           "--duration", "3", "--set", "think_scale=0.1"])
    o = from_args(ns, SweepConfig)
    assert o.overrides() == {"warmup_s": "auto", "duration_s": 3.0, "think_scale": 0.1}


def test_run_sim_flags_are_the_embedded_targets():
    """commands/run.py reads the --sim-* flags off SimConfig (so --help does not import the
    target); they must be the embedded target's options."""
    from agentx.commands import run
    from agentx.targets.embedded import FLAG_PREFIX, NOT_OPTIONS, EmbeddedSimOptions

    assert (run.SIM_PREFIX, tuple(run.SIM_EXCLUDED)) == (FLAG_PREFIX, tuple(NOT_OPTIONS))
    run_flags = {a.dest for a in options(dict(LEAVES)["run"])}
    assert {run.SIM_PREFIX.replace("-", "_") + n
            for n, _ in cli_fields(EmbeddedSimOptions, NOT_OPTIONS)} <= run_flags


def _modules_after(*argv: str) -> set[str]:
    code = ("import sys\nfrom agentx.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith(('agentx.', 'aiohttp', "
            "'numpy'))),"
            " file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    return set(p.stderr.split())


def test_top_help_imports_no_subcommand():
    mods = _modules_after("--help")
    assert not {m for m in mods if m.startswith("agentx.commands.")}, mods
    run_mods = _modules_after("run", "--help")
    assert {m for m in run_mods if m.startswith("agentx.commands.")} == {"agentx.commands.run"}
    # the HTTP client, the targets and numpy are imported when a run starts, not for --help
    assert not {m for m in run_mods if m.startswith(("aiohttp", "agentx.targets", "numpy"))}, \
        run_mods


def test_python_dash_m_entry_points():
    for module in ("agentx", "agentx.sim"):
        p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                           text=True, cwd=REPO, timeout=60)
        assert p.returncode == 0 and "usage: agentx" in p.stdout, (module, p.stderr)
