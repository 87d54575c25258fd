"""User-facing input errors: one line naming file, line/record and field; exit code 2."""
from __future__ import annotations


class InputError(Exception):
    """Bad user input (trace, config, flag). The CLI prints str(err) alone and exits 2."""

    exit_code = 2

    def __init__(self, source: str, message: str, *, line: int | str | None = None,
                 field: str | None = None) -> None:
        self.source, self.line, self.field, self.message = source, line, field, message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
        fld = f" field {self.field!r}" if self.field else ""  # repr: a key may hold a newline
        line = f"error: {where}:{fld} {self.message}".replace(":  ", ": ")
        return line.replace("\r", "\\r").replace("\n", "\\n")  # one line, always


class OutputError(InputError):
    """A result file could not be written (disk full, read-only, quota): one line naming the
    file and the system's reason, exit 2. What was written before stays on disk, whole."""

    MARK = ": cannot write: "  # a worker's stop reason carries the message to the parent

    def __init__(self, path: str, reason: OSError | str, kept: str = "") -> None:
        if isinstance(reason, OSError):
            reason = reason.strerror or str(reason)
        self.path, self.reason, self.kept = str(path), reason, kept
        super().__init__(str(path), f"{self.MARK[2:]}{reason}" + (f"; {kept}" if kept else ""))

    @classmethod
    def found_in(cls, text: str) -> "OutputError | None":
        """The OutputError whose message `text` (a stop reason, a worker's error) quotes."""
        head, mark, tail = text.partition(cls.MARK)
        if not mark or "error: " not in head:
            return None
        reason, _, kept = tail.partition("; ")
        return cls(head.rpartition("error: ")[2], reason, kept)


class RunLost(Exception):
    """The run could not go on and left no summary (every worker process lost): one line,
    exit 4 (as an abort); the records written so far are on disk."""

    exit_code = 4
