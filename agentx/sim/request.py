"""One request inside the simulated engine, and the hand-off of its output to the HTTP handler.

The step loop appends (tokens, finish_reason) events; the handler coroutine awaits them and
writes chunks. One future per wait keeps the per-step cost to a list append and at most one
`set_result`, which is what lets one core drive hundreds of streams.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

WAITING, LOADING, RUNNING, FINISHED = 0, 1, 2, 3


@dataclass(eq=False, slots=True)
class SimRequest:
    rid: str
    prompt_len: int
    max_tokens: int
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full prompt blocks
    ignore_eos: bool = True
    eos_at: int | None = None  # output length at which a sampled EOS stops it (no ignore_eos)
    session: str | None = None
    arrival_ns: int = 0  # perf_counter_ns at arrival
    received_ns: int = 0  # perf_counter_ns when its first bytes were read off the socket (rxstamp)
    arrival_wall_ns: int = 0  # time_ns at arrival
    queued_ns: int = 0  # when the engine core queued it (after the front end): vLLM's QUEUED event

    # engine state
    state: int = WAITING
    num_computed: int = 0  # prompt (+ preempted output) tokens whose KV exists
    num_out: int = 0
    blocks: list[int] = field(default_factory=list)
    cached_device: int = 0
    cached_host: int = 0
    created_cache: int = 0  # prompt tokens of newly cached full blocks
    load_until: float = 0.0  # sim time at which a host->GPU load finishes
    load_seq: int = 0  # schedule that started it (loads paced by steps: sim/sched.py)
    load_seen: int = -1  # schedule before which a step's poll saw it finished (-1: not yet)
    tier_pin: list[int] = field(default_factory=list)  # offload-tier hits pinned for its load
    preemptions: int = 0
    ran_seq: int = -1  # the schedule whose step last ran it (sim/sched.py `_preempt`)
    own_hashes: bool = False  # block_hashes is this request's own list (`_cache_output` grows it)
    counted: bool = False  # prefix-cache stats recorded (first lookup only)
    # tokens hit (GPU + tier) at its latest admission before its first token: what vLLM 0.24
    # reports as cached for a request preempted mid-prefill (0.32, as served: the first admission's)
    hit_last_admission: int = 0
    hit_last_tier: int = 0  # of those, the tokens loaded from the offload tier
    scheduled_ns: int = 0  # first time the scheduler took it (queue time ends)
    first_token_ns: int = 0
    last_token_ns: int = 0
    finish: str | None = None
    aborted: bool = False
    logged: bool = False  # truth-log record written

    # hand-off to the HTTP handler
    events: list = field(default_factory=list)  # (n_tokens, finish_reason | None)
    waiter: asyncio.Future | None = None

    @property
    def target_len(self) -> int:
        """Tokens whose KV must exist before this request can emit its next token."""
        return self.prompt_len + self.num_out

    def push(self, n: int, finish: str | None) -> None:
        self.events.append((n, finish))
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next_events(self) -> list:
        """Wait for at least one event, then take all pending ones."""
        if not self.events:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        ev, self.events = self.events, []
        return ev
