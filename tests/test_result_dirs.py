"""Every output folder has an owner (agentx/rundir.py): each command's folder is a ResultDir
subclass that names its files once, chooses --output-dir or its default folder in one place,
and refuses a folder that holds its result already (A/B: --overwrite, sweep: --resume). Like the
file names, vLLM's metric names are written once (agentx/vllm_names.py): the exporters import them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentx import rundir
from agentx.errors import InputError
from agentx.rundir import ABDir, ReportDir, ResultDir, RunDir, SweepDir

AGENTX = Path(rundir.__file__).parent
FILE_NAME = re.compile(r"^\.?[\w-]+\.(json|jsonl|csv|png|html)$|^\.agentx-\w+$")


def folders() -> list[type[ResultDir]]:
    found, todo = [], [ResultDir]
    while todo:
        c = todo.pop()
        found.append(c)
        todo.extend(c.__subclasses__())
    return found


def file_names() -> set[str]:
    """The file names the folder classes declare (class attributes that are file names)."""
    return {v for c in folders() for v in vars(c).values()
            if isinstance(v, str) and FILE_NAME.match(v)}


def code_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module's code (docstrings and option help texts are prose)."""
    tree = ast.parse(path.read_text())
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            prose.add(id(body[0].value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "opt":
            prose.update(id(a) for a in ast.walk(node) if isinstance(a, ast.Constant))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose]


def test_every_output_file_name_is_written_once():
    """ab.json, ab_cdf.png, sweep.json, runs.csv, the Pareto PNG, report.html, compare.*,
    cliff.*, calibration.json and the run's own files appear as literals in rundir.py only."""
    names = file_names()
    assert {"ab.json", "ab_cdf.png", "sweep.json", "runs.csv", "pareto.png", "report.html",
            "summary.json", "requests.jsonl", "calibration.json", "cliff.json"} <= names
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(names))) + r")(?![\w-])")
    found = [f"{f.relative_to(AGENTX.parent)}:{line}: {m.group(1)} in {text!r}"
             for f in sorted(AGENTX.rglob("*.py")) if f != Path(rundir.__file__)
             for line, text in code_strings(f) for m in pattern.finditer(text)]
    assert not found, "\n".join(found)


def test_vllm_metric_names_are_written_once():
    """No module but vllm_names.py spells a `vllm:` family in its code (report/aiperf_export.py
    and report/inferencex_metrics.py retyped seven)."""
    found = [f"{f.relative_to(AGENTX.parent)}:{line}: {text!r}"
             for f in sorted(AGENTX.rglob("*.py")) if f.name != "vllm_names.py"
             for line, text in code_strings(f) if re.match(r"vllm:[a-z]", text)]
    assert not found, "\n".join(found)


def test_output_dir_or_default_is_chosen_once():
    """`Path(o.output_dir) if o.output_dir else default_...` lives in ResultDir.at only."""
    choice = re.compile(r"\.output_dir\)? if \w+\.output_dir else|\.output_dir or ")
    found = [f"{f.relative_to(AGENTX.parent)}:{n}: {line.strip()}"
             for f in sorted(AGENTX.rglob("*.py"))
             for n, line in enumerate(f.read_text().splitlines(), 1) if choice.search(line)]
    assert not found, "\n".join(found)


def test_default_folders_keep_their_names(tmp_path):
    assert ABDir.at(None, "swe", "c8").path.name.startswith("ab-")
    assert SweepDir.at(None, "r").path.name.startswith("sweep-")
    assert SweepDir.at(None, "r").path.name.endswith("-r")
    assert RunDir.at(None, "swe", "c8").path.parent == rundir.RESULTS
    assert ABDir.at(str(tmp_path)).path == tmp_path
    runs = [tmp_path / "x" / "a", tmp_path / "x" / "b"]
    assert ReportDir.at(None, *runs).path == (tmp_path / "x").resolve()
    assert SweepDir(tmp_path).cell("p0", 8) == tmp_path / "p0" / "c8"
    assert ABDir(tmp_path).side_run("b", 2) == tmp_path / "b" / "2"


@pytest.mark.parametrize("folder, flag", [(ABDir, "--overwrite"), (SweepDir, "--resume")])
def test_a_folder_holding_its_result_is_refused_without_the_flag(tmp_path, folder, flag):
    d = folder(tmp_path)
    d.create()  # empty: accepted
    d.write_json(folder.JSON, {"old": True})
    with pytest.raises(InputError, match=re.escape(f"({folder.JSON}): give {flag}")) as e:
        d.create()
    assert e.value.field == "--output-dir"
    d.create(True)  # the flag lets it go on; what it had stays until rewritten
    assert folder.JSON in d.own_files()
    assert folder(tmp_path).read_json(folder.JSON) == ({"old": True}, "")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="exists and is not a directory"):
        folder(tmp_path / "file").create(True)
