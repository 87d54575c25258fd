"""One declaration per option: strict pydantic models, and the command line derived from them.

Every option of every command is a field of a `StrictModel`, declared once with `opt(...)`:
type, default, bounds, help, and optionally its flag, its old spellings and its argparse group.
`add_arguments` turns a model into argparse flags (the only `add_argument` calls of agentx) and
`from_args` turns the parsed flags back into a validated model, so a new option is one line in
one place. Old spellings stay accepted, hidden, with a one-line deprecation on stderr, so
scripts written against them keep working after a rename.
Every command with an option model also takes `--config FILE` (the same options as YAML, flags
overriding it) and `--print-config`: `add_arguments` records each model it adds as a `Section`
of the parser, agentx.yamlconf reads the file into the namespace, and `values_from_args` lays
the flags over the file's values, remembering which file line each came from for the errors.
Unknown keys are errors (`extra="forbid"`, as inference-perf's `StrictBaseModel`), and every
validation error becomes one `InputError` line naming the source, line and field.
"""
from __future__ import annotations

import argparse
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from .errors import InputError

M = TypeVar("M", bound=BaseModel)
REDACTED = "<redacted>"  # a secret's value where a config is written out
SECTIONS = "option_sections"  # namespace attribute: the parser's option models (Section)
FILE_VALUES = "config_values"  # namespace attribute: --config's values per section prefix


class StrictModel(BaseModel):
    """Unknown keys are errors; assignments are validated too (a field set after construction
    passes the same bounds as one given to the constructor)."""

    # defer_build: the validator is built at the first validation, not at import, so
    # `agentx run --help` does not pay for every model's schema (~50 ms)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


class FieldError(ValueError):
    """Raised by a model validator for a check across fields: names the field to blame, so
    the user sees the option to fix rather than the model's name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def opt(default: Any = None, help: str = "", *, flag: str | None = None,
        short: str | None = None, group: str | None = None, cli: bool = True,
        factory: Any = None, repeat: bool = False, old: tuple[str, ...] = (),
        positional: bool = False, metavar: str | None = None, negatable: bool = True,
        bare: str | None = None, **bounds: Any) -> Any:
    """A field with its help text, optional flag name (default `--field-name`) and short
    alias (`-o`), argparse group and pydantic bounds (`ge`, `gt`, `le`, `lt`, `min_length`,
    ...). `factory` builds a mutable default; `cli=False` keeps a field off the command line;
    `repeat=True` makes the flag repeatable (the field's validator gets the list of values);
    `old` lists former spellings (`"--out"`), still accepted with a deprecation line;
    `positional=True` makes it an argument (a list field takes one or more; it may instead
    come from --config); `negatable=False` gives a bool flag no `--no-` form; `bare` is the
    value of the flag given alone (`--html` -> "", `--html FILE` -> FILE)."""
    extra = {"flag": flag, "short": short, "group": group, "cli": cli, "repeat": repeat,
             "old": list(old), "positional": positional, "metavar": metavar,
             "negatable": negatable, "bare": bare}
    if factory is not None:
        return Field(default_factory=factory, description=help, json_schema_extra=extra, **bounds)
    return Field(default, description=help, json_schema_extra=extra, **bounds)


def _meta(info: Any) -> dict:
    return info.json_schema_extra or {"flag": None, "group": None, "cli": True}


def flag_of(name: str, info: Any, prefix: str = "") -> str:
    return "--" + prefix + (_meta(info).get("flag") or name).replace("_", "-")


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _choices(tp: Any) -> list[str] | None:
    tp = _strip_optional(tp)
    if get_origin(tp) is Literal:
        return [str(a) for a in get_args(tp)]
    return None


def cli_fields(model: type[BaseModel], exclude: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    return [(n, f) for n, f in model.model_fields.items()
            if n not in exclude and _meta(f).get("cli", True)]


class OldSpelling(argparse.Action):
    """A former flag: stores like the new one (hidden from --help) and says the new name on
    stderr, once per use."""

    def __init__(self, option_strings: list[str], dest: str, new: str, const: Any = None,
                 append: bool = False, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0 if const is not None else None,
                         const=const, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kw)
        self.new, self.append = new, append

    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        new = self.new if self.const is not False else "--no-" + self.new[2:]
        print(f"agentx: {option_string} is deprecated, use {new}", file=sys.stderr)
        value = self.const if self.const is not None else values
        if self.append:
            value = [*(getattr(ns, self.dest, None) or []), value]
        setattr(ns, self.dest, value)


class ConfigFile(StrictModel):
    """The two options every command with an option model has (docs/commands.md)."""

    config: str | None = opt(None, "read options from this YAML file (keys: the option "
                             "names, e.g. max_requests or max-requests; flags given override "
                             "it)", metavar="FILE", group="config file")
    print_config: bool = opt(False, "print the effective options (file, flags, defaults) as "
                             "YAML that --config reads back, secrets redacted, and exit",
                             group="config file", negatable=False)


@dataclass(frozen=True)
class Section:
    """One option model of a command: its fields are the file's top-level keys (no prefix)
    or the keys under `key:` (`--sim-*` flags: under `sim:`)."""

    model: type[BaseModel]
    prefix: str = ""
    exclude: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.prefix.rstrip("-").replace("-", "_")

    def fields(self) -> list[tuple[str, Any]]:
        return cli_fields(self.model, self.exclude)


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], *, prefix: str = "",
                  group: str | None = None, exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per field. Values reach `from_args` as given (strings); the model converts
    and bounds them, so argparse never prints its own multi-line usage error for a bad value.
    Flags not given are absent from the namespace, and the model's defaults apply. Each action
    carries `field` = (model, field name), so a test can tell derived flags from hand-written.
    The first model added to a parser also brings --config and --print-config."""
    sections = parser.get_default(SECTIONS)
    if sections is None and model is not ConfigFile:
        sections = []
        parser.set_defaults(**{SECTIONS: sections})
        add_arguments(parser, ConfigFile)
    if model is not ConfigFile:
        sections.append(Section(model, prefix, exclude))
    groups: dict[str, Any] = {}
    for name, f in cli_fields(model, exclude):
        g_name = group or _meta(f).get("group")
        target: Any = parser
        if g_name:
            target = groups.get(g_name) or groups.setdefault(g_name, parser.add_argument_group(g_name))
        for action in _add_field(target, name, f, prefix):
            action.field = (model, name)  # type: ignore[attr-defined]


def _add_field(target: Any, name: str, f: Any, prefix: str) -> list[argparse.Action]:
    meta = _meta(f)
    dest = prefix.replace("-", "_") + name
    flag = flag_of(name, f, prefix)
    help_ = (f.description or "").replace("%", "%%")
    default = f.get_default(call_default_factory=True)
    tp = _strip_optional(f.annotation)
    old = ["--" + prefix + o.removeprefix("--") for o in meta.get("old") or ()]
    if meta.get("positional"):  # optional for argparse: it may come from --config instead
        nargs = "*" if get_origin(tp) in (list, tuple) else "?"
        return [target.add_argument(dest, metavar=meta.get("metavar") or name.upper(),
                                    nargs=nargs, default=argparse.SUPPRESS, help=help_)]
    if tp is bool:
        action = argparse.BooleanOptionalAction if meta.get("negatable", True) else "store_true"
        made = [target.add_argument(flag, dest=dest, action=action,
                                    default=argparse.SUPPRESS,
                                    help=f"{help_} (default: {'on' if default else 'off'})")]
        for o in old:
            made += [target.add_argument(o, dest=dest, action=OldSpelling, new=flag, const=True),
                     target.add_argument("--no-" + o[2:], dest=dest, action=OldSpelling,
                                         new=flag, const=False)]
        return made
    choices = _choices(f.annotation)
    metavar = meta.get("metavar") or ("{" + ",".join(choices) + "}" if choices
                                      else _metavar(tp, meta.get("flag") or name))
    shown = "" if default in (None, {}, [], ()) or isinstance(default, SecretStr) \
        else f" (default: {_show(default)})"
    short = [] if prefix or not meta.get("short") else [meta["short"]]
    repeat = bool(meta.get("repeat"))
    if repeat:
        made = [target.add_argument(*short, flag, dest=dest, default=argparse.SUPPRESS,
                                    action="append", help=help_,
                                    metavar=meta.get("metavar") or name.upper().removesuffix("S"))]
    else:
        alone = {} if meta.get("bare") is None else {"nargs": "?", "const": meta["bare"]}
        made = [target.add_argument(*short, flag, dest=dest, default=argparse.SUPPRESS,
                                    metavar=metavar, help=help_ + shown.replace("%", "%%"),
                                    **alone)]
    for o in old:
        made.append(target.add_argument(o, dest=dest, action=OldSpelling, new=flag,
                                        append=repeat, metavar=metavar))
    return made


def _metavar(tp: Any, name: str) -> str:
    origin = get_origin(tp)
    if origin in (list, tuple):
        return "A,B,..."
    if origin is dict or tp is dict:
        return "JSON"
    return {int: "N", float: "X"}.get(tp, name.upper())


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def _convert(raw: Any, tp: Any, flag: str, source: str) -> Any:
    """The command line's string forms of lists (A,B,...) and mappings (JSON)."""
    if not isinstance(raw, str):
        return raw
    tp = _strip_optional(tp)
    origin = get_origin(tp) or tp
    if origin in (list, tuple):
        return [x.strip() for x in raw.split(",") if x.strip()]
    if origin is dict:
        try:
            v = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InputError(source, f"not valid JSON ({e})", field=flag) from None
        if not isinstance(v, dict):
            raise InputError(source, "must be a JSON object", field=flag)
        return v
    return raw


@dataclass(frozen=True)
class Origin:
    """Where a value read from a config file stands: the file, the line, the key as written."""

    file: str
    line: int | None
    key: str


class Given(dict):
    """A model's field values as given, with the `Origin` of those that came from a config
    file (the others came from flags), so an error names the file line or the flag."""

    def __init__(self, data: Any = (), origins: dict[str, Origin] | None = None) -> None:
        super().__init__(data)
        self.origins: dict[str, Origin] = dict(origins or {})


def values_from_args(ns: argparse.Namespace, model: type[BaseModel], *, prefix: str = "",
                     exclude: tuple[str, ...] = (), source: str = "command line") -> Given:
    """The fields the user gave, converted from their string forms: the --config file's
    values (agentx.yamlconf.read_config put them in the namespace), the flags over them."""
    flags = {}
    for name, f in cli_fields(model, exclude):
        dest = prefix.replace("-", "_") + name
        if hasattr(ns, dest):
            flags[name] = _convert(getattr(ns, dest), f.annotation, flag_of(name, f, prefix),
                                   source)
    filed: Given = (getattr(ns, FILE_VALUES, None) or {}).get(prefix) or Given()
    out = Given(filed, {k: o for k, o in filed.origins.items() if k not in flags})
    fields = dict(cli_fields(model, exclude))
    for name, o in out.origins.items():
        value = out[name]
        if isinstance(value, str) and REDACTED in value:
            raise InputError(o.file, f"redacted by --print-config: give the value with "
                             f"{flag_of(name, fields[name], prefix)} (or drop the line for "
                             "its default)", line=o.line, field=o.key)
        out[name] = _convert(value, fields[name].annotation, o.key, o.file)
    out.update(flags)
    for name, f in fields.items():
        meta = _meta(f)
        if meta.get("positional") and name not in out:
            what = meta.get("metavar") or name.upper()
            raise InputError(source, f"the {what} argument is required (or `{name}:` in "
                             "--config)", field=what)
    return out


def from_args(ns: argparse.Namespace, model: type[M], *, source: str = "command line") -> M:
    """The validated model of a command whose flags all come from `model` (no prefixes)."""
    return build(model, values_from_args(ns, model, source=source), source=source,
                 field_name=flag_namer(model))


def build(model: type[M], data: dict, *, source: str = "command line",
          field_name=None) -> M:
    """Validate `data` into `model`; the first error becomes one InputError line.
    `field_name(loc)` renders a field's location (default: the dotted path)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise input_error(err, source, field_name, given=data) from None


def _origin(given: Any, loc: tuple) -> Origin | None:
    """The config-file origin of the value at `loc` in `given` (nested Givens walked)."""
    for part in loc:
        if isinstance(given, Given) and part in given.origins:
            return given.origins[part]
        given = given.get(part) if isinstance(given, dict) else None
    return None


def input_error(err: ValidationError, source: str, field_name=None,
                line_of=None, given: Any = None) -> InputError:
    """The first pydantic error as our one-line InputError. A `FieldError` raised by a model
    validator names its own field; `line_of(loc)` gives a line number where one is known;
    a value that came from a config file (`given` a `Given`) is named by its file line."""
    errors = err.errors(include_url=False)
    # a misspelt key yields "unknown" and "missing" errors: the unknown key is the one to fix
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(e["loc"])
    ctx_err = (e.get("ctx") or {}).get("error")
    if isinstance(ctx_err, FieldError):
        loc = loc + (ctx_err.field,)
        msg = str(ctx_err)
    elif e["type"] == "extra_forbidden":
        msg = "unknown option" if loc else "unknown key"
    else:
        msg = e["msg"].removeprefix("Value error, ")
        msg = msg[0].lower() + msg[1:] if msg else msg
        if e["type"] not in ("missing",) and "input" in e and not isinstance(e["input"], dict):
            msg += f" (got {e['input']!r})"
    origin = _origin(given, loc) if loc else None
    if origin is not None:
        return InputError(origin.file, msg, field=origin.key, line=origin.line)
    name = field_name(loc) if field_name else ".".join(str(x) for x in loc)
    line = line_of(loc) if line_of else None
    return InputError(source, msg, field=name or None, line=line)


def flag_namer(model: type[BaseModel], nested: dict[str, str] | None = None, prefix: str = ""):
    """Render an error location as the flag the user typed: ('conc',) -> --conc;
    ('sim', 'spec_k') -> --sim-spec-k for a nested model whose flags carry a prefix, or for a
    model whose own flags carry `prefix`."""
    nested = nested or {}
    top = prefix

    def name(loc: tuple) -> str:
        if not loc:
            return ""
        m, prefix, rest = model, top, list(loc)
        while len(rest) > 1 and rest[0] in nested:
            prefix += nested[rest[0]]
            sub = m.model_fields[rest[0]].annotation
            m, rest = _strip_optional(sub), rest[1:]
        f = m.model_fields.get(str(rest[0])) if hasattr(m, "model_fields") else None
        return flag_of(str(rest[0]), f, prefix) if f is not None else \
            "--" + prefix + str(rest[0]).replace("_", "-")

    return name
