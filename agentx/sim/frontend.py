"""vLLM's API server in front of the engine, modelled as one shared resource.

Before the engine core sees a request, vLLM's API-server process parses it, renders the chat
template and tokenises the whole conversation; that work runs on one Python process (its event
loop plus a tokenizer thread, sharing the interpreter lock). Requests in it therefore share its
CPU: modelled as a processor-sharing queue with `servers` units of capacity. Each request needs
`fixed_s + per_token_s x prompt tokens` of work; with n requests inside, each progresses at
min(1, servers / n) of real time. So waiting grows with load and bursts. `servers = 0` means
unlimited capacity (every request held exactly its own work, independently: the model before
2026-12-02).

`ordered`: requests leave in the order they arrived, as measured on vLLM 0.24 (the engine core's
`add` of 179 requests against their send times, tests/data/h200-runs-6: no request overtook an
earlier one by more than 0.1 ms). A request whose work is done waits, no longer sharing the
capacity, until every earlier one has left. Without it (the model of 2026-12-02) a short request
sent after a long cold one leaves first, and the engine, first come first served, serves a cold
burst shortest first.

`reads` (with `ordered`): a long prompt's request body does not arrive in one read. The server's
first read takes what the socket buffered (about `first_read_tokens` of prompt, as agentx sends
token ids), each later read `read_tokens` more, and between two reads the event loop serves every
request already waiting, so at each later read the request goes to the back of the line while its
work goes on. Measured in the cold bursts of all 20 probed 32-lane runs (32 prompts sent within
4 ms, tests/data/h200-runs-6 to -9, h100-runs*): the engine core received them in send order except
the long ones, a 127k-token prompt sent 21st always last, 60k and 63k ones just before it, and
prompts of 24.6k tokens and more behind every shorter one sent after them (23.9k and less never;
26-27k in some runs only: the body's bytes, not its tokens, decide). A request alone in the server
takes its reads at once.

`FrontEnd` is pure bookkeeping on a caller's clock (seconds); the served simulator drives it from
its event loop (`ServedFrontEnd`), the replay (sim_calibration/replay.py) from its virtual clock.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class _Job:
    item: object
    left: float  # seconds of work still to do at full rate
    seq: int = 0  # place in the leaving order: arrival, or a later turn (`reads`)
    reads: int = 0  # reads of its body still to come, each a turn at the back of the line


@dataclass
class FrontEnd:
    fixed_s: float
    per_token_s: float
    servers: float = 0.0  # capacity shared by the requests inside (0 = unlimited)
    ordered: bool = False  # leave in arrival order (a finished request waits for earlier ones)
    # with `ordered`: prompt tokens whose body the first read takes whole, and each later read
    # (0: every body in one read)
    first_read_tokens: int = 0
    read_tokens: int = 0
    now: float = 0.0
    jobs: list[_Job] = field(default_factory=list)  # still being worked on
    held: list[_Job] = field(default_factory=list)  # done, waiting for an earlier arrival to leave
    arrived: int = 0

    def work(self, prompt_tokens: int) -> float:
        """Seconds of front-end work one request of this prompt size needs."""
        return self.fixed_s + self.per_token_s * prompt_tokens

    def reads(self, prompt_tokens: int) -> int:
        """Reads a request of this prompt size needs after the first (`ordered` only)."""
        first = self.first_read_tokens
        if not self.ordered or not first or prompt_tokens <= first:
            return 0
        return -(-(prompt_tokens - first) // (self.read_tokens or first))

    def _rate(self) -> float:
        n = len(self.jobs)
        return 1.0 if not self.servers or n <= self.servers else self.servers / n

    def add(self, now: float, item: object, work: float, reads: int = 0) -> list[tuple[float, object]]:
        """`item` enters at `now` needing `work` seconds and `reads` more reads of its body;
        returns what left up to `now` (as `advance`), which the caller must hand on."""
        out = self.advance(now)
        self.jobs.append(_Job(item, max(0.0, work), self.arrived, reads))
        self.arrived += 1
        if self.ordered:
            self._leave(now, out)
        return out

    def next_finish(self) -> float | None:
        """When the next request's work is done, if none arrives before (with `ordered`, it may
        stay held: `advance` to then returns what really left)."""
        if not self.jobs:
            return None
        return self.now + min(j.left for j in self.jobs) / self._rate()

    def advance(self, now: float) -> list[tuple[float, object]]:
        """Run the shared processor up to `now`; (time, item) of those that left, in order."""
        out: list = []
        while self.jobs:
            rate = self._rate()
            first = min(j.left for j in self.jobs)
            t_done = self.now + first / rate
            if t_done > now:
                break
            for j in self.jobs:
                j.left -= first
            self.now = t_done
            done = [j for j in self.jobs if j.left <= 1e-12]
            self.jobs = [j for j in self.jobs if j.left > 1e-12]
            if not self.ordered:
                out.extend((t_done, j.item) for j in done)
                continue
            self.held += done
            self._leave(t_done, out)
        if now > self.now:
            step = (now - self.now) * self._rate()
            for j in self.jobs:
                j.left -= step
            self.now = now
        return out

    def _leave(self, t: float, out: list) -> None:
        """`ordered`: the first in line leaves at `t` if its work is done. If a read of its body
        is still to come, it takes that read and goes to the back of the line, behind every
        request in the server; its work goes on meanwhile."""
        while self.jobs or self.held:
            head = min((*self.jobs, *self.held), key=lambda j: j.seq)
            if head.reads:
                head.reads -= 1
                head.seq = self.arrived
                self.arrived += 1
            elif head in self.held:
                self.held.remove(head)
                out.append((t, head.item))
            else:
                return


class ServedFrontEnd:
    """`FrontEnd` on the event loop's clock: `await hold(work)` returns when the request leaves.

    Work is in modelled seconds and divided by `time_scale`; one timer is armed for the next
    departure and re-armed on every arrival (an arrival slows everybody down)."""

    def __init__(self, fe: FrontEnd, time_scale: float) -> None:
        self.fe = fe
        self.scale = time_scale
        self._timer: asyncio.TimerHandle | None = None

    async def hold(self, work: float, already: float = 0.0, reads: int = 0) -> None:
        """Wait until this request's `work` (modelled seconds) is done; `already`: real seconds
        it has been in the server (its own parsing), credited at full rate; `reads`: the later
        reads of its body (`FrontEnd.reads`)."""
        if not self.fe.servers and not self.fe.ordered:  # unlimited: an independent hold
            left = work / self.scale - already
            if left > 0:
                await asyncio.sleep(left)
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._release(self.fe.add(loop.time(), fut, work / self.scale - already, reads))
        self._arm(loop)
        await fut

    @staticmethod
    def _release(done: list) -> None:
        for _, fut in done:
            if not fut.done():
                fut.set_result(None)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        t = self.fe.next_finish()
        if t is not None:
            self._timer = loop.call_at(t, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        # at least up to the departure this timer was armed for: a loop timer may fire up to the
        # clock's resolution before its deadline (asyncio runs every timer due before time() +
        # resolution), and advancing only to loop.time() would then release nothing and re-arm for
        # the same deadline, spinning until the clock caught up
        self._release(self.fe.advance(max(loop.time(), self.fe.next_finish() or 0.0)))
        self._arm(loop)
