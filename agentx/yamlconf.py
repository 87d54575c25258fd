"""Strict YAML files: load a YAML document into a StrictModel, errors naming file, line and field.

Profiles now, recipes next: a user's YAML either validates completely or fails with one line
such as `error: recipes/x.yaml:12: field 'engine.block_size' input should be ...`. The line
comes from the YAML node of the offending key or value (the composed node tree keeps the marks
that yaml.safe_load drops).

Every YAML agentx reads (recipes, simulator profiles, golden AL files, `--set` values) goes
through `Loader`, which refuses aliases (`*name`): a few lines of nested aliases (a "billion
laughs") describe a tree of billions of nodes, and walking it (the duplicate-key check, the
line finder, validation) would never end. No agentx file needs them; write the value out.
"""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError
from .options import input_error

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
