#!/usr/bin/env python3
"""The config's walk: how far a command's config object travels through agentx (issue 31).

Static analysis (ast, nothing imported or run). It starts at a command's entry function
(`agentx.commands.run.main` for `agentx run`, `agentx.commands.ab.main` for `agentx ab`) and
follows every call that receives the config object, or an object it was passed into:

- tracked ("tainted") values: in a walked function, a parameter that received a tracked value
  or whose annotation names a tracked class; a name assigned a tracked value, the
  `model_copy` of one, or the result of a call whose return annotation names a tracked class.
  The tracked classes start as the command's config (`RunConfig`; `ABConfig` for ab) and grow:
  a class constructed with a tracked value as an argument becomes tracked (at aff7c4a,
  `DriveSpec(run=cfg)` made every `DriveSpec` parameter a carrier of the config).
- a counted call: a call site inside a walked function, resolved (through the module's
  imports, its own functions and classes, `self.` methods, `Class.method`, methods of a
  tracked value's class) to a function, method or class defined in agentx, with a tracked
  value as an argument (bare, not one of its fields: `f(cfg)` counts, `f(cfg.conc)` does not;
  a method called on the config itself, `cfg.arrival_mode()`, is the config answering, not
  the config travelling, and counts only when it returns a tracked class, e.g.
  `ABConfig.side_config` -> `RunConfig`). The callee is then walked in turn (a class: its
  `__init__`, when it defines one). Each call site counts once, however many paths reach it.
- files: the distinct files holding a counted call's caller or callee.
- beside them (not in the acceptance figures): the calls, in walked functions, given one of
  the tracked value's fields (`load_traces(cfg.trace)`), and the files counting those too:
  where the config's contents spread, not the object itself.
- climbs back: in walk order (depth first, source order), a call whose callee's module sits
  in a higher layer than the previous counted call's callee (layers: the import-linter
  contract in pyproject.toml, which tests/test_layers.py runs). A static call never goes up
  the import graph; the reader following the config does each time the walk comes back up
  from a deep helper to a higher module that hands it on again.

The issue's figures (48 calls / 27 files / 15 climbs for run) came from an earlier walk whose
exact rules were not kept; these rules are this tool's, and before/after figures in the notes
are both measured with it.

    python bench/config_walk.py [--list] [run|ab ...]
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "agentx"

ENTRIES = {"run": ("agentx.commands.run", "main", {"RunConfig"}),
           "ab": ("agentx.commands.ab", "main", {"ABConfig", "RunConfig"})}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layers() -> list[list[str]]:
    """The contract's layers, highest first, each a list of module prefixes."""
    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index("layers = [", text.index("[tool.importlinter]")):]
    block = block[:block.index("\n]")]
    return [[p.strip() for p in line.split("|")]
            for line in re.findall(r'"([^"]+)"', block)]


def layer_of(module: str, table: list[list[str]]) -> int:
    for i, row in enumerate(table):
        if any(module == p or module.startswith(p + ".") for p in row):
            return i
    return len(table)


@dataclass
class Func:
    module: str
    qual: str  # name or Class.name
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    names: dict[str, str] = field(default_factory=dict)  # local name -> qualified target
    funcs: dict[str, Func] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def resolve_from(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def load() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for path in sorted(PKG.rglob("*.py")):
        name = module_name(path)
        m = Module(name, path, ast.parse(path.read_text(), str(path)))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(m.tree):  # imports anywhere, the lazy ones in functions too
            if isinstance(node, ast.ImportFrom):
                src = resolve_from(name, is_pkg, node.level, node.module)
                for a in node.names:
                    m.names[a.asname or a.name] = f"{src}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    m.names[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                m.funcs[node.name] = Func(name, node.name, node)
            elif isinstance(node, ast.ClassDef):
                m.classes[node.name] = node
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        q = f"{node.name}.{sub.name}"
                        m.funcs[q] = Func(name, q, sub, node.name)
        mods[name] = m
    return mods


class Walker:
    def __init__(self, mods: dict[str, Module], tracked: set[str]) -> None:
        self.mods, self.tracked = mods, set(tracked)
        self.table = layers()
        self.calls: list[tuple[str, int, str, str]] = []  # caller module, line, callee mod, q
        self.parts: list[tuple[str, int, str, str]] = []  # calls given a field of it
        self.seen_sites: set[tuple[str, int, int]] = set()
        self.seen_walks: set[tuple[str, str, frozenset]] = set()
        self.class_index: dict[str, list[tuple[str, str]]] = {}
        self.configs = set(tracked)  # the config classes themselves (not carriers)
        self.carrier_attrs: dict[str, set[str]] = {}
        for m in mods.values():
            for c in m.classes:
                self.class_index.setdefault(c, []).append((m.name, c))

    # --- resolution -------------------------------------------------------------------
    def lookup(self, qualified: str) -> tuple[str, str] | None:
        """`agentx.x.y.f` -> (module, qual) when defined in agentx (following re-exports)."""
        for _ in range(5):
            parts = qualified.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                mod, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
                if mod in self.mods:
                    m = self.mods[mod]
                    if rest in m.funcs or rest in m.classes:
                        return mod, rest
                    head = rest.split(".")[0]
                    if head in m.names:  # re-exported name
                        qualified = m.names[head] + rest[len(head):]
                        break
                    return None
            else:
                return None
        return None

    def class_of(self, module: str, name: str) -> tuple[str, str] | None:
        m = self.mods[module]
        if name in m.classes:
            return module, name
        if name in m.names:
            return self.lookup(m.names[name])
        return None

    def annotation_classes(self, ann: ast.AST | None) -> set[str]:
        if ann is None:
            return set()
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return set()
        return {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)} | \
               {n.attr for n in ast.walk(ann) if isinstance(n, ast.Attribute)}

    def resolve(self, fn: Func, call: ast.Call, env: dict[str, str | None]
                ) -> tuple[str, str, bool] | None:
        """(module, qual, receiver is tracked) of the callee when defined in agentx."""
        m = self.mods[fn.module]
        f = call.func
        if isinstance(f, ast.Name):
            if f.id in m.funcs or f.id in m.classes:
                return fn.module, f.id, False
            if f.id in m.names:
                hit = self.lookup(m.names[f.id])
                return (*hit, False) if hit else None
            return None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base, attr = f.value.id, f.attr
            if base in ("self", "cls") and fn.cls:
                q = f"{fn.cls}.{attr}"
                if q in m.funcs:
                    return fn.module, q, base in env
            if base in env:  # a method of a tracked value's class
                cls = env[base]
                for c in ([cls] if cls else sorted(self.tracked)):
                    for mod, cname in self.class_index.get(c, []):
                        hit = self.method(mod, cname, attr)
                        if hit:
                            return (*hit, True)
                return None
            if base in m.classes:
                q = f"{base}.{attr}"
                return (fn.module, q, False) if q in m.funcs else None
            if base in m.names:
                hit = self.lookup(f"{m.names[base]}.{attr}")
                return (*hit, False) if hit else None
        return None

    def method(self, mod: str, cname: str, attr: str, depth: int = 0
               ) -> tuple[str, str] | None:
        """A method of class `cname`, or of one of its agentx bases."""
        m = self.mods[mod]
        if f"{cname}.{attr}" in m.funcs:
            return mod, f"{cname}.{attr}"
        if depth > 5:
            return None
        for b in m.classes[cname].bases:
            name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) \
                else None
            hit = self.class_of(mod, name) if name else None
            if hit:
                found = self.method(*hit, attr, depth + 1)
                if found:
                    return found
        return None

    # --- the walk ---------------------------------------------------------------------
    def tracked_expr(self, fn: Func, e: ast.AST, env: dict[str, str | None]) -> bool:
        if isinstance(e, ast.Name):
            return e.id in env
        if isinstance(e, ast.Starred):
            return self.tracked_expr(fn, e.value, env)
        if isinstance(e, ast.Subscript):  # specs[0]: a tracked list's element
            return self.tracked_expr(fn, e.value, env)
        if isinstance(e, (ast.List, ast.Tuple)):
            return any(self.tracked_expr(fn, x, env) for x in e.elts)
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and \
                e.value.id in env:  # spec.run: a carrier's field that holds the config
            cls = env[e.value.id] or (fn.cls if e.value.id == "self" else None)
            return cls is not None and e.attr in self.carried(cls)
        if isinstance(e, ast.Call):  # config_from_args(args): returns the config
            hit = self.resolve(fn, e, env)
            return bool(hit and self.returns(*hit[:2]))
        return False

    def element_class(self, fn: Func, e: ast.AST, env: dict[str, str | None]) -> str | None:
        return env.get(e.id) if isinstance(e, ast.Name) else None

    def carried(self, cls: str) -> set[str]:
        """The fields of a carrier class that hold a tracked value: annotated with a tracked
        class, or assigned one in its __init__."""
        out = set(self.carrier_attrs.get(cls, ()))
        for mod, cname in self.class_index.get(cls, []):
            for node in self.mods[mod].classes[cname].body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                        self.annotation_classes(node.annotation) & self.tracked:
                    out.add(node.target.id)
        return out

    def walk(self, module: str, qual: str, received: frozenset = frozenset()) -> None:
        key = (module, qual, received)
        if key in self.seen_walks:
            return
        self.seen_walks.add(key)
        m = self.mods[module]
        if qual in m.classes:  # a constructor: its __init__, when it has one
            qual = f"{qual}.__init__"
            if qual not in m.funcs:
                return
        fn = m.funcs[qual]
        env: dict[str, str | None] = {}
        args = fn.node.args
        params = args.posonlyargs + args.args + args.kwonlyargs
        if "self" in received and fn.cls:
            env["self"] = fn.cls
        for p in params:
            hit = self.annotation_classes(p.annotation) & self.tracked
            if p.arg in received or hit:
                env[p.arg] = next(iter(sorted(hit)), None)
        self.body(fn, env)

    def body(self, fn: Func, env: dict[str, str | None]) -> None:
        """Assignments first (to a fixed point: a call can make its result's class a
        carrier), then the calls in source order, each walked depth first."""
        calls = sorted((n for n in ast.walk(fn.node) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for _ in range(4):
            before = (dict(env), set(self.tracked))
            for node in ast.walk(fn.node):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    self.assign(fn, node, env)
                elif isinstance(node, (ast.comprehension, ast.For, ast.AsyncFor)) and \
                        isinstance(node.target, ast.Name) and \
                        self.tracked_expr(fn, node.iter, env):
                    env.setdefault(node.target.id, self.element_class(fn, node.iter, env))
            for call in calls:
                self.call(fn, call, env)
            if (env, self.tracked) == before:
                break

    def assign(self, fn: Func, node: ast.Assign | ast.AnnAssign,
               env: dict[str, str | None]) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        v = node.value
        if fn.cls and v is not None and self.tracked_expr(fn, v, env):
            for t in targets:  # self.specs = specs: the object now carries the config
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                        t.value.id == "self":
                    self.carrier_attrs.setdefault(fn.cls, set()).add(t.attr)
        if not names or v is None:
            return
        cls = None
        if isinstance(node, ast.AnnAssign):
            hit = self.annotation_classes(node.annotation) & self.tracked
            cls = next(iter(hit), None)
        tracked = cls is not None or self.tracked_expr(fn, v, env)
        if isinstance(v, ast.Call):
            f = v.func
            if isinstance(f, ast.Attribute) and f.attr == "model_copy" and \
                    self.tracked_expr(fn, f.value, env):
                tracked = True
            hit = self.resolve(fn, v, env)
            if hit:
                ret = self.returns(*hit[:2])
                if ret:
                    tracked, cls = True, ret
        if isinstance(v, (ast.ListComp, ast.List)):  # [Share(run=cfg) for ...]
            elts = [v.elt] if isinstance(v, ast.ListComp) else v.elts
            for e in elts:
                if isinstance(e, ast.Call) and any(self.tracked_expr(fn, a, env)
                                                   for a in self.call_args(e)):
                    tracked = True
        if tracked:
            for n in names:
                env[n] = cls

    def returns(self, module: str, qual: str) -> str | None:
        m = self.mods[module]
        if qual in m.classes:
            return qual if qual in self.tracked else None
        hit = self.annotation_classes(m.funcs[qual].node.returns) & self.tracked
        return next(iter(sorted(hit)), None)

    @staticmethod
    def call_args(call: ast.Call) -> list[ast.AST]:
        return list(call.args) + [k.value for k in call.keywords]

    def call(self, fn: Func, call: ast.Call, env: dict[str, str | None]) -> None:
        kw = {k.arg: k.value for k in call.keywords}
        if isinstance(kw.get("target"), ast.Name) and isinstance(kw.get("args"), ast.Tuple):
            # Process(target=f, args=(spec, ...)) / Thread(...): f is called with them
            call = ast.Call(kw["target"], kw["args"].elts, [], lineno=call.lineno,
                            col_offset=call.col_offset)
        hit = self.resolve(fn, call, env)
        if hit is None:
            return
        mod, qual, on_tracked = hit
        passed = [a for a in self.call_args(call) if self.tracked_expr(fn, a, env)]
        if not passed and not on_tracked and any(
                isinstance(n, ast.Name) and n.id in env
                for a in self.call_args(call) for n in ast.walk(a)):
            site = (fn.module, call.lineno, call.col_offset)  # a part of it: f(cfg.conc)
            if site not in self.seen_sites:
                self.seen_sites.add(site)
                self.parts.append((fn.module, call.lineno, mod, qual))
            return
        receiver = call.func.value.id if on_tracked else None  # type: ignore[attr-defined]
        carrier = on_tracked and env.get(receiver) is not None and \
            env[receiver] not in self.configs
        if not passed and not carrier and not (on_tracked and self.returns(mod, qual)):
            return
        site = (fn.module, call.lineno, call.col_offset)
        if site not in self.seen_sites:
            self.seen_sites.add(site)
            self.calls.append((fn.module, call.lineno, mod, qual))
        m = self.mods[mod]
        if qual in m.classes:  # the object the config is passed into carries it on
            self.tracked.add(qual)
        received = self.bind(fn, mod, qual, call, env)
        if carrier:
            received |= {"self"}
        self.walk(mod, qual, received)

    def bind(self, fn: Func, mod: str, qual: str, call: ast.Call,
             env: dict[str, str | None]) -> frozenset:
        """The callee's parameters that receive a tracked value."""
        m = self.mods[mod]
        q = f"{qual}.__init__" if qual in m.classes else qual
        if q not in m.funcs:
            return frozenset()
        a = m.funcs[q].node.args
        pos = [p.arg for p in a.posonlyargs + a.args]
        if pos and pos[0] in ("self", "cls") and (m.funcs[q].cls is not None):
            pos = pos[1:]
        got = set()
        for i, e in enumerate(call.args):
            if self.tracked_expr(fn, e, env) and i < len(pos):
                got.add(pos[i])
        for k in call.keywords:
            if k.arg and self.tracked_expr(fn, k.value, env):
                got.add(k.arg)
        return frozenset(got)

    # --- figures ----------------------------------------------------------------------
    def figures(self) -> dict:
        files = set()
        climbs = 0
        prev = None
        for caller, _, callee, _ in self.calls:
            files.add(self.mods[caller].path)
            files.add(self.mods[callee].path)
            lay = layer_of(callee, self.table)
            if prev is not None and lay < prev:
                climbs += 1
            prev = lay
        part_files = files | {self.mods[m].path for c, _, m, _ in self.parts for m in (c, m)}
        return {"calls": len(self.calls), "files": len(files), "climbs": climbs,
                "part_calls": len(self.parts), "part_files": len(part_files)}


def walk(command: str) -> Walker:
    module, func, tracked = ENTRIES[command]
    w = Walker(load(), tracked)
    w.walk(module, func)
    return w


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("commands", nargs="*", help="run, ab (default: both)")
    ap.add_argument("--list", action="store_true", help="print every counted call")
    a = ap.parse_args()
    for cmd in a.commands or list(ENTRIES):
        if cmd not in ENTRIES:
            ap.error(f"unknown command {cmd!r}: one of {', '.join(ENTRIES)}")
        w = walk(cmd)
        f = w.figures()
        print(f"agentx {cmd}: {f['calls']} calls, {f['files']} files, {f['climbs']} climbs back"
              f" (and {f['part_calls']} calls given one of its fields; "
              f"{f['part_files']} files in all)")
        if a.list:
            for caller, line, callee, qual in w.calls:
                print(f"  {caller}:{line} -> {callee}.{qual} "
                      f"(layer {layer_of(caller, w.table)} -> {layer_of(callee, w.table)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
