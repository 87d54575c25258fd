"""Strict YAML files: load a YAML document into a StrictModel, errors naming file, line and field.

Profiles now, recipes next: a user's YAML either validates completely or fails with one line
such as `error: recipes/x.yaml:12: field 'engine.block_size' input should be ...`. The line
comes from the YAML node of the offending key or value (the composed node tree keeps the marks
that yaml.safe_load drops).

Every YAML agentx reads (recipes, simulator profiles, golden AL files, `--set` values) goes
through `Loader`, which refuses aliases (`*name`): a few lines of nested aliases (a "billion
laughs") describe a tree of billions of nodes, and walking it (the duplicate-key check, the
line finder, validation) would never end. No agentx file needs them; write the value out.

`--config FILE` and `--print-config` of every command are here too (`read_config`,
`print_config`): the file holds the command's options as the flags do (docs/commands.md).
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from .errors import InputError
from .options import (
    FILE_VALUES,
    REDACTED,
    SECTIONS,
    Given,
    Origin,
    Section,
    build,
    flag_namer,
    flag_of,
    input_error,
    values_from_args,
)

M = TypeVar("M", bound=BaseModel)


class Loader(yaml.SafeLoader):
    """yaml.SafeLoader without aliases: `*name` is a ComposerError at its line."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases are not accepted (*{event.anchor}): write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


def compose(text: str) -> yaml.Node | None:
    """The node tree of one YAML document (marks kept), aliases refused."""
    return yaml.compose(text, Loader=Loader)


def _parse(text: str, source: str) -> tuple[yaml.Node | None, object]:
    """(node tree, Python value) of one YAML document; any problem is one InputError."""
    try:
        loader = Loader(text)  # reads the stream already: may raise
        try:
            root = loader.get_single_node()
            return root, (loader.construct_document(root) if root is not None else None)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = getattr(e, "problem", None) or " ".join(str(e).split())  # one line
        raise InputError(source, f"not valid YAML ({why})",
                         line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise InputError(source, "not valid YAML (nested too deeply)") from None
    except ValueError as e:  # a bad date (2024-13-01), an int of more digits than int() takes
        why = "a number with too many digits" if "digits" in str(e) else str(e)
        raise InputError(source, f"not valid YAML ({why})") from None


def load_value(text: str, source: str) -> object:
    """A YAML scalar or structure from a command-line value (`--set KEY=VALUE`)."""
    return _parse(text, source)[1]


def _line_finder(root: yaml.Node | None):
    def line_of(loc: tuple) -> int | None:
        node, line = root, None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                hit = next(((k, v) for k, v in node.value if k.value == str(part)), None)
                if hit is None:  # not a key of the file: a union's tag (kv_offload.<kind>.x)
                    continue
                line = hit[0].start_mark.line + 1
                node = hit[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                    and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        if line is None and root is not None:
            line = root.start_mark.line + 1
        return line

    return line_of


def load_model(text: str, model: type[M], source: str) -> M:
    """Parse `text` (YAML) from `source` into `model`; any problem is one InputError."""
    root, data = _parse(text, source)
    if not isinstance(data, dict):
        raise InputError(source, "must be a YAML mapping", line=1)
    _no_duplicate_keys(root, source)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise input_error(err, source, line_of=_line_finder(root)) from None


def _no_duplicate_keys(root: yaml.Node | None, source: str) -> None:
    """YAML lets a repeated key silently replace the first; in a config that hides a typo."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                name = str(k.value)
                where = f"{path}.{name}" if path else name
                if name in seen:
                    raise InputError(source, "key given twice (the second would silently replace "
                                     "the first)", line=k.start_mark.line + 1, field=where)
                seen.add(name)
                stack.append((v, where))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, f"{path}.{i}") for i, v in enumerate(node.value))


def read_text(path: str | Path) -> str:
    """A UTF-8 text file; unreadable or not UTF-8 is one InputError naming it."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(p), "file not found") from None
    except UnicodeDecodeError as e:
        raise InputError(str(p), f"not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise InputError(str(p), f"cannot read ({e.__class__.__name__}: {e})") from None


def load_file(path: str | Path, model: type[M]) -> M:
    return load_model(read_text(path), model, str(path))


def _spellings(section: Section) -> dict[str, str]:
    """Accepted key -> field name: the field's name and its flag without dashes, `-` and `_`
    alike (`max_think_s`, `max_think`, `max-think`)."""
    out: dict[str, str] = {}
    for name, f in section.fields():
        out[name] = name
        out[flag_of(name, f)[2:].replace("-", "_")] = name
    return out


def _key_line(root: yaml.Node | None, path: tuple) -> int | None:
    return _line_finder(root)(path)


def read_config(ns: argparse.Namespace) -> None:
    """Read `--config FILE` into the namespace: per section (by flag prefix) a `Given` of the
    file's values with their lines, for `values_from_args` to lay the flags over. Unknown
    keys and a key given twice (in two spellings) are errors at their line."""
    path = getattr(ns, "config", None)
    sections: list[Section] = getattr(ns, SECTIONS, None) or []
    if not path or not sections:
        return
    root, data = _parse(read_text(path), path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(path, "must be a YAML mapping of options", line=1)
    _no_duplicate_keys(root, path)
    out = {s.prefix: Given() for s in sections}
    top = [s for s in sections if not s.prefix]
    nested = {s.key: s for s in sections if s.prefix}
    for key, value in data.items():
        key = str(key)
        if key in nested and (isinstance(value, dict) or not _find(top, key)):
            if not isinstance(value, dict):
                raise InputError(path, f"must be a mapping of the --{nested[key].prefix}* "
                                 "options", line=_key_line(root, (key,)), field=key)
            s = nested[key]
            for sub, v in value.items():
                _take(out, s, _spellings(s), str(sub), v, path, root, (key, str(sub)))
            continue
        hit = _find(top, key)
        if hit is None:  # `sim_spec_k`: a nested section's flag spelled out at the top
            hit = next(((s, k[len(s.key) + 1:]) for s in nested.values()
                        for k in [key.replace("-", "_")] if k.startswith(s.key + "_")
                        and k[len(s.key) + 1:] in _spellings(s)), None)
        if hit is None:
            raise InputError(path, "unknown option" + _did_you_mean(key, sections),
                             line=_key_line(root, (key,)), field=key)
        _take(out, hit[0], _spellings(hit[0]), hit[1], value, path, root, (key,))
    setattr(ns, FILE_VALUES, out)


def _find(sections: list[Section], key: str) -> tuple[Section, str] | None:
    k = key.replace("-", "_")
    return next(((s, key) for s in sections if k in _spellings(s)), None)


def _take(out: dict, s: Section, names: dict[str, str], key: str, value: object, path: str,
          root: yaml.Node | None, where: tuple) -> None:
    line = _key_line(root, where)
    name = names.get(key.replace("-", "_"))
    if name is None:
        raise InputError(path, "unknown option" + _did_you_mean(key, [s]), line=line,
                         field=".".join(where))
    given: Given = out[s.prefix]
    if name in given:
        raise InputError(path, f"given twice (also as {given.origins[name].key!r})",
                         line=line, field=".".join(where))
    given[name] = value
    given.origins[name] = Origin(path, line, ".".join(where))


def _did_you_mean(key: str, sections: list[Section]) -> str:
    names = [n for s in sections for n in _spellings(s)]
    close = difflib.get_close_matches(key.replace("-", "_"), names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def effective_config(ns: argparse.Namespace) -> dict:
    """The options a command would run with (file, flags, defaults), validated section by
    section, as plain data by field name; secrets and URL credentials redacted."""
    doc: dict[str, Any] = {}
    for s in getattr(ns, SECTIONS, None) or []:
        data = values_from_args(ns, s.model, prefix=s.prefix, exclude=s.exclude)
        m = build(s.model, data, field_name=flag_namer(s.model, prefix=s.prefix))
        dumped = m.model_dump(mode="json")
        part = {}
        for name, _ in s.fields():
            v = getattr(m, name)
            secret = isinstance(v, SecretStr) or (name.endswith("api_key") and v is not None)
            part[name] = REDACTED if secret else _redact_url(dumped[name])
        if s.prefix:
            doc[s.key] = part
        else:
            doc.update(part)
    return doc


def _redact_url(v: object) -> object:
    """`scheme://user:pass@host/...` -> `scheme://<redacted>@host/...` (as urls.redact_url)."""
    if isinstance(v, str):
        return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", rf"\1{REDACTED}@", v)
    return v


def config_flags(ns: argparse.Namespace) -> int | None:
    """`--config FILE` and `--print-config`, which `options.add_arguments` gives every parser:
    the file's options go under the flags; with --print-config the effective options are
    printed and its exit code returned (the caller returns it and runs nothing)."""
    read_config(ns)  # no --config: nothing to read
    return print_config(ns) if getattr(ns, "print_config", False) else None


def print_config(ns: argparse.Namespace) -> int:
    """`--print-config`: the effective options as YAML on stdout, which `--config` reads
    back (a redacted secret then has to be given by its flag)."""
    doc = effective_config(ns)
    command = " ".join(str(v) for k, v in sorted(vars(ns).items(), key=lambda kv: len(kv[0]))
                       if k == "command" or k.endswith("_command"))
    sys.stdout.write(f"# agentx {command}: effective options (config file, flags, defaults); "
                     "run it with --config FILE\n")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None,
                                    allow_unicode=True, width=100))
    return 0
