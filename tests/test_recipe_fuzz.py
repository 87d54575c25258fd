"""Property-based fuzzing of the recipe loader (agentx/recipe/load.py through agentx/yamlconf):
whatever the file holds, loading succeeds or raises InputError whose message is one line
naming the file (and, when a value is wrong, the field); `agentx recipe render` on bad files
exits 2 with one stderr line and no traceback."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentx.errors import InputError
from agentx.recipe.load import load_recipe

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "recipes" / "tiny-cpu.yaml").read_text())
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(["", "~", "0x1F", "1e400", "-.inf", "${X}", "a\nb", "é"]))
values = st.recursive(scalars, lambda v: st.one_of(st.lists(v, max_size=3),
                                                   st.dictionaries(st.text(max_size=6), v,
                                                                   max_size=3)),
                      max_leaves=8)


def paths(doc, prefix=()):
    """Every key path in a nested document (dict keys and list indices)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from paths(v, prefix + (k,))


ALL_PATHS = list(paths(BASE))


@st.composite
def mutated(draw) -> str:
    """The shipped tiny-cpu recipe with a few keys replaced, deleted or added."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            action = draw(st.sampled_from(["set", "del", "add"]))
            if action == "set":
                parent[path[-1]] = draw(values)
            elif action == "del":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
        except (KeyError, IndexError, TypeError):  # an earlier mutation removed the path
            continue
    return yaml.safe_dump(doc, allow_unicode=True)


def check(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    try:
        load_recipe(str(path))
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg and "\r" not in msg, msg
        assert msg.startswith(f"error: {path}"), msg
        unparsed = e.message.startswith(("not UTF-8", "not valid YAML"))
        assert unparsed or e.field or e.line is not None, msg  # where to look in the file


@FUZZ
@given(text=mutated())
def test_mutated_recipe_loads_or_fails_in_one_line(tmp_path, text):
    check(tmp_path, text.encode())


@FUZZ
@given(doc=values)
def test_any_yaml_structure_loads_or_fails_in_one_line(tmp_path, doc):
    check(tmp_path, yaml.safe_dump(doc, allow_unicode=True).encode())


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.text(alphabet=":-[]{}&*!|>'\"%@`#,? \n\tab1", max_size=80)
                      .map(str.encode)))
def test_any_bytes_load_or_fail_in_one_line(tmp_path, data):
    check(tmp_path, data)


def test_adversarial_yaml_fails_in_one_line(tmp_path):
    """What random generation rarely reaches: nesting past the recursion limit, an integer
    past int()'s digit limit, an impossible date, a Python tag, an unhashable key."""
    recipe = (REPO / "recipes" / "tiny-cpu.yaml").read_bytes()
    for data in (b"points: " + b"[" * 5000 + b"]" * 5000,
                 recipe.replace(b"gpus: 1", b"gpus: " + b"9" * 5000),
                 recipe.replace(b"gpus: 1", b"gpus: 2024-13-45"),
                 b"gpus: !!python/object:os.system ls\n", b"? [a, b]\n: 1\n"):
        check(tmp_path, data)


def test_render_cli_on_bad_files_exits_2_with_one_line(tmp_path):
    bad = {
        "binary.yaml": b"\xff\xfe\x00garbage",
        "syntax.yaml": b"points: [tp: 1\nmodel: x",
        "list.yaml": b"- just\n- a list\n",
        "unknown.yaml": (REPO / "recipes" / "tiny-cpu.yaml").read_bytes() + b"\nbogus_key: 1\n",
        "type.yaml": (REPO / "recipes" / "tiny-cpu.yaml").read_bytes()
        .replace(b"gpus: 1", b"gpus: many"),
    }
    for name, data in bad.items():
        path = tmp_path / name
        path.write_bytes(data)
        p = subprocess.run([sys.executable, "-m", "agentx.cli", "recipe", "render", str(path)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (name, p.returncode, p.stderr)
        assert lines[0].startswith(f"error: {path}"), (name, lines)
