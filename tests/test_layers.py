"""agentx's import graph keeps its layers (docs/architecture.md): the import-linter contract in
pyproject.toml (`lint-imports` checks the same) and, with grimp, no import cycle between
agentx's top-level packages and modules, nor between any two of its modules. A failure names
the offending import chain."""
from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]

LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


# The simulator (server side) and the client side are independent: neither imports the other,
# even indirectly, and both stand on this shared base, which imports nothing but itself.
SIM = "agentx.sim"
SHARED_BASE = {"agentx.errors", "agentx.aio", "agentx.options", "agentx.yamlconf",
               "agentx.child_process", "agentx.offload", "agentx.vllm_names", "agentx.tokens",
               "agentx.distribution", "agentx.rundir", "agentx.urls", "agentx.shipped_data"}
# the parts that bring the two sides together (a target is a simulator or a URL; a recipe
# renders vLLM's or the simulator's arguments); every other part is on the client side
ABOVE_BOTH = {"agentx.__main__", "agentx.cli", "agentx.commands", "agentx.ab", "agentx.sweep",
              "agentx.calibrate", "agentx.run", "agentx.targets", "agentx.recipe"}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # imports under `if TYPE_CHECKING:` do not run; the contract ignores them too
    return grimp.build_graph("agentx", exclude_type_checking_imports=True, cache_dir=None)


@pytest.fixture(scope="module")
def graph_typed() -> grimp.ImportGraph:
    """With the imports under `if TYPE_CHECKING:`: a type-only circle is a circle for a reader."""
    return grimp.build_graph("agentx", exclude_type_checking_imports=False, cache_dir=None)


def test_layers_contract_is_kept():
    r = subprocess.run([sys.executable, "-c", LINT], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        pytest.fail(r.stdout[r.stdout.find("Broken contracts"):] + r.stderr, pytrace=False)


def test_every_top_level_part_has_a_layer(graph):
    """A module or package outside the contract could import anything: each gets a line."""
    text = (REPO / "pyproject.toml").read_text()
    contract = text[text.index("[tool.importlinter]"):]
    named = set(re.findall(r"agentx\.\w+", contract[:contract.index("\n]\n")]))
    assert sorted(graph.find_children("agentx") - named) == []


def contract_layers() -> list[set[str]]:
    """The first contract's layers, top first, each a set of sibling parts."""
    text = (REPO / "pyproject.toml").read_text()
    contract = text[text.index("layers = [", text.index("[tool.importlinter]")):]
    lines = re.findall(r'^\s*"([^"]+)",$', contract[:contract.index("\n]\n")], re.M)
    return [set(re.split(r"\s*[|:]\s*", line)) for line in lines]


def package_edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Top-level part -> the top-level parts it imports."""
    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    edges: dict[str, set[str]] = defaultdict(set)
    for m in graph.modules:
        for i in graph.find_modules_directly_imported_by(m):
            if m != "agentx" and i != "agentx" and top(m) != top(i):
                edges[top(m)].add(top(i))
    return edges


# entry points sit on top by convention: the CLI imports a command's module by name when dispatched
ENTRY = {"agentx.__main__", "agentx.cli"}


def test_each_part_sits_as_low_as_its_imports_allow(graph):
    """The layers are a graph, not a needless line: a part whose imports all lie two or more
    layers down could sit lower, beside the parts it does not import. Each part (entry points
    aside) imports something in the layer right below its own."""
    layers = contract_layers()
    edges = package_edges(graph)
    at = {part: n for n, layer in enumerate(layers) for part in layer}
    loose = []
    for n, layer in enumerate(layers[:-1]):
        for part in sorted(layer - ENTRY):
            if not edges[part] & layers[n + 1]:
                nearest = min((at[i] for i in edges[part] if i in at), default=len(layers))
                loose.append(f"{part}: all its imports lie in layer {nearest} or lower; it may "
                             f"sit at layer {nearest - 1}, not {n} (0 = top)")
    assert not loose, "\n".join(loose)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def explain(graph: grimp.ImportGraph, comp: list[str], as_packages: bool) -> str:
    """Each import of a cycle as its shortest module chain."""
    lines = []
    for a in comp:
        for b in comp:
            if a != b:
                chain = graph.find_shortest_chain(a, b, as_packages=as_packages)
                if chain and (not as_packages or len(chain) > 1):
                    lines.append(f"  {a} -> {b}: {' -> '.join(chain)}")
    return f"cycle {' <-> '.join(comp)}\n" + "\n".join(lines)


def test_no_cycle_between_top_level_packages(graph):
    tops = sorted(graph.find_children("agentx"))
    edges = package_edges(graph)
    found = cycles({t: edges[t] for t in tops})
    assert not found, "\n".join(explain(graph, c, True) for c in found)


def test_no_cycle_between_modules(graph_typed):
    """No import circle anywhere, inside a package (sim/ included) or between two, counting the
    imports made only for type checking and those inside functions."""
    g = graph_typed
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    found = cycles(edges)
    assert not found, "\n".join(explain(g, c, False) for c in found)


def test_simulator_and_client_side_are_independent(graph):
    """An independence contract on a shared base (as import-linter's `independence`, which
    cannot say "a package against a group"): the simulator reaches no part outside itself and
    the shared base, no client-side part reaches the simulator, and the base reaches nothing
    above it. A failure names the import chain."""
    tops = graph.find_children("agentx")
    assert SIM in tops and SHARED_BASE <= tops and ABOVE_BOTH <= tops
    client = tops - SHARED_BASE - ABOVE_BOTH - {SIM}
    pairs = [(SIM, p) for p in tops - SHARED_BASE - {SIM}]
    pairs += [(p, SIM) for p in client]
    pairs += [(b, p) for b in SHARED_BASE for p in tops - SHARED_BASE]
    broken = []
    for a, b in sorted(pairs):
        chain = graph.find_shortest_chain(a, b, as_packages=True)
        if chain:
            broken.append(f"{a} must not import {b}: {' -> '.join(chain)}")
    assert not broken, "\n".join(broken)
