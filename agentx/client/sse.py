"""Incremental Server-Sent-Events splitter for OpenAI-style streams.

Bytes are fed as they arrive (the caller timestamps each read before calling `feed`); each
complete `data:` event comes back as its raw payload bytes, so JSON parsing happens once per
event and never on partial data. Comments and other SSE fields are skipped.
"""
from __future__ import annotations

DONE = b"[DONE]"


class SSESplitter:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Return the payloads of the events completed by `data` (possibly none)."""
        buf = self._buf + data if self._buf else data
        if b"\n\n" not in buf and b"\r\n\r\n" not in buf:
            self._buf = buf
            return []
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()  # the unfinished tail (b"" when data ended an event)
        out = []
        for ev in events:
            payload = _data_of(ev)
            if payload is not None:
                out.append(payload)
        return out

    @property
    def pending(self) -> bytes:
        return self._buf


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data: "):
        if b"\n" not in event:
            return event[6:]
    elif event.startswith(b"data:") and b"\n" not in event:
        return event[5:].lstrip()
    lines = [ln for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None  # comment / keep-alive / other field
    return b"\n".join(ln[5:].lstrip() if not ln.startswith(b"data: ") else ln[6:] for ln in lines)
