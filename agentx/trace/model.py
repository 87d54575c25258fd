"""In-memory trace model shared by every loader, the generator, the planner and the stats.

A trace is one recorded agentic-coding session: an ordered list of steps, each either a
request (`Turn`) or a child conversation (`Subagent`) that the parent spawned at that point.
Loaders normalise optional fields here so nothing downstream has to guess.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

# Upper bounds every loader enforces, so a corrupt value is a one-line error instead of an
# attempt to allocate billions of block ids. 2^24 tokens is above the longest context any
# served model accepts today (Llama 4 Scout: 10M tokens, Meta's model card); 1e9 s is ~32
# years, far beyond any recorded session time.
MAX_TOKENS = 1 << 24
MAX_SECONDS = 1e9


@dataclass(slots=True)
class Turn:
    """One request of a session.

    in_tokens: whole prompt tokens (system + tools + history + new input).
    out_tokens: tokens the model generated (replayed as max_tokens with ignore_eos).
    hash_ids: one id per `block_size`-token block of the prompt (last may be partial);
        equal ids inside one trace mean identical content.
    think_time: seconds the client waited before sending this request (tool run / user).
        Loaders fill it when missing: t - previous t - previous api_time, else 0.
    """

    in_tokens: int
    out_tokens: int
    hash_ids: list[int]
    t: float = 0.0
    think_time: float = 0.0
    api_time: float | None = None
    input_types: tuple[str, ...] = ()
    kind: str = "n"


@dataclass(slots=True)
class Subagent:
    """A child conversation spawned by the parent; the parent waits for it to finish."""

    agent_id: str
    trace: "Trace"
    t: float = 0.0


Step = Union[Turn, Subagent]


@dataclass(slots=True)
class Trace:
    id: str
    steps: list[Step]
    block_size: int = 64
    system_tokens: int = 0
    tool_tokens: int = 0
    source: str = ""  # file (and member) it came from, for error messages and records
    # "local": hash_ids are comparable only inside this trace (Weka default); "global": across
    # every trace of the set (Mooncake), so a shared cache sees cross-session prefix reuse.
    hash_id_scope: str = "local"
    # when the session began in the source trace, in seconds (Mooncake: its first request's
    # timestamp); --arrivals trace starts each session at it. None: the trace has no clock.
    start_s: float | None = None
    reader: str = ""  # the kind of the trace reader that read it (agentx/trace/readers.py)

    @property
    def turns(self) -> list[Turn]:
        """The parent's own requests, in order (subagents excluded)."""
        return [s for s in self.steps if isinstance(s, Turn)]

    @property
    def subagents(self) -> list[Subagent]:
        return [s for s in self.steps if isinstance(s, Subagent)]


@dataclass(slots=True)
class TraceSet:
    """All sessions of one named trace source (a file, a directory, an archive)."""

    name: str
    traces: list[Trace] = field(default_factory=list)
    block_size: int = 64

    def last_turns(self) -> dict[str, int]:
        """Trace id -> index of its last own turn: a replay that sent it ran to the end
        (per-session results, metrics/sessions.py)."""
        return {t.id: len(t.turns) - 1 for t in self.traces}
