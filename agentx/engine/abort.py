"""Error-rate abort: stop a run whose server has stopped answering instead of sending into it
for the rest of --duration.

The failure share is taken over the last `window` finished requests of one engine (one client
process); requests cancelled by our own stop are not counted. It is judged only once the
window holds MIN_JUDGED requests (or `window`, if smaller), so two unlucky early requests do
not end a run; a dead server fails every request at once, so that takes a few seconds.
"""
from __future__ import annotations

from collections import Counter, deque

MIN_JUDGED = 10


class ErrorWindow:
    def __init__(self, max_rate: float, window: int) -> None:
        self.max_rate = max_rate
        self._last: deque[str | None] = deque(maxlen=max(1, window))  # error class or None

    def note(self, ok: bool, error: str | None) -> str | None:
        """Count one finished request; the abort reason once the share is exceeded."""
        if self.max_rate <= 0 or error == "cancelled":
            return None
        last = self._last
        last.append(None if ok else (error or "unknown"))
        if len(last) < min(MIN_JUDGED, last.maxlen or 1):
            return None
        failed = [e for e in last if e is not None]
        rate = len(failed) / len(last)
        if rate <= self.max_rate:
            return None
        common = Counter(failed).most_common(1)[0][0]
        return (f"aborted: error rate {rate:.0%} over last {len(last)} requests "
                f"(most common: {common})")
