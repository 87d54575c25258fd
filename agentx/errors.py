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
