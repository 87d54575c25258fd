"""The trace-reader registry: one class per trace format, with a `kind`, as the KV-offload
connectors are (agentx/offload). A reader says whether a file is its format (by its first
record or its document) and turns it into sessions of the trace model; `load.parse_blob` asks
them in order. Adding a format = one module with its parser + one class here + its entry in
READERS. docs/traces.md documents each format's mapping to sessions, turns, think times and
shared prefixes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .aiperf import is_aiperf_row, parse_aiperf
from .bailian import is_bailian_row, parse_bailian
from .model import Trace
from .mooncake import parse_mooncake
from .otel import is_otel_doc, parse_otel
from .weka import traces_from_json


def _is_mooncake_row(first: Any) -> bool:
    return "input_length" in first and "requests" not in first


def _any_document(doc: Any) -> bool:
    return True  # the native format: every JSON document no other reader claims


class Reader:
    """One trace format. `lines`: a JSONL format (`sniff` sees the first record, `read` gets
    the file's bytes), else one JSON document per file (`sniff` and `read` get the document)."""

    kind: ClassVar[str]
    description: ClassVar[str]
    read_by: ClassVar[str]  # the tools that read (or write) the format
    lines: ClassVar[bool]
    sniff: ClassVar[Callable[[Any], bool]]
    read: ClassVar[Callable[[Any, str, str], list[Trace]]]

    @classmethod
    def claims(cls, first: Any) -> bool:
        """Whether a file whose first record (or document) is `first` is this format."""
        return (isinstance(first, Mapping) or not cls.lines) and cls.sniff(first)

    @classmethod
    def parse(cls, data: bytes, doc: Any, source: str, name: str) -> list[Trace]:
        """Sessions of one decompressed file (`doc`: its decoded JSON, for a document format)."""
        return cls.read(data if cls.lines else doc, source, name)


class AIPerfMultiTurn(Reader):
    kind, lines = "aiperf-mooncake", True
    description = "AIPerf mooncake_trace rows with session_id (multi-turn), delay, messages"
    read_by = "AIPerf (--custom-dataset-type mooncake_trace)"
    sniff, read = staticmethod(is_aiperf_row), staticmethod(parse_aiperf)


class Bailian(Reader):
    kind, lines = "bailian", True
    description = "Alibaba Bailian usage traces: chat_id / parent_chat_id chains, 16-token blocks"
    read_by = "AIPerf (--custom-dataset-type bailian_trace)"
    sniff, read = staticmethod(is_bailian_row), staticmethod(parse_bailian)


class Mooncake(Reader):
    kind, lines = "mooncake", True
    description = "Mooncake FAST'25 request rows; sessions rebuilt from prefix reuse"
    read_by = "Mooncake, AIPerf (mooncake_trace), SGLang bench_serving (mooncake)"
    sniff, read = staticmethod(_is_mooncake_row), staticmethod(parse_mooncake)


class OTelGenAI(Reader):
    kind, lines = "otel-genai", False
    description = "OpenTelemetry GenAI spans (a `spans` list), one LLM call per span"
    read_by = "inference-perf (otel_trace_replay)"
    sniff, read = staticmethod(is_otel_doc), staticmethod(parse_otel)


class Weka(Reader):
    kind, lines = "weka", False
    description = "agentx / kv-cache-tester session JSON (requests, subagents, think times)"
    read_by = "agentx, kv-cache-tester, AIPerf (weka_trace), inference-perf (weka)"
    sniff, read = staticmethod(_any_document), staticmethod(traces_from_json)


# asked in this order: the specific before the general (a multi-turn AIPerf row is a Mooncake
# row with a session_id; Weka takes any JSON document left)
READERS: tuple[type[Reader], ...] = (AIPerfMultiTurn, Bailian, Mooncake, OTelGenAI, Weka)
BY_KIND: dict[str, type[Reader]] = {r.kind: r for r in READERS}
KINDS: tuple[str, ...] = tuple(BY_KIND)


def for_record(first: Any) -> type[Reader] | None:
    """The JSONL reader whose format the first record is, or None."""
    return next((r for r in READERS if r.lines and r.claims(first)), None)


def for_document(doc: Any) -> type[Reader]:
    """The document reader of a decoded JSON file (Weka when no other claims it)."""
    return next(r for r in READERS if not r.lines and r.claims(doc))
