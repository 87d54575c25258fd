"""Turn a prepared turn into bytes on the wire: server-side or client-side chat template.

A sender works in two calls: `prepare` makes what the request needs before its send time
(the engine calls it while the lane's think time runs, so the build is not dispatch lag),
`send` writes it and reads the response.

- ChatSender: POST /v1/chat/completions with the messages; the server applies its template.
  The body is serialised at send: it is a copy of the whole history (~0.7 MB at 150k
  tokens) that a lane would otherwise hold through its think time.
- TokenIdsSender (token-exact, --tokenizer): POST /v1/completions with the token ids of the
  client-side chat template. With a linear template (prompt/exact.py) the ids of what a turn
  adds are built from the template's pieces and appended to the session's (kept as JSON
  fragments, so the body is those fragments: no re-tokenising, no re-serialising), a few
  messages per loop step. Otherwise, or for a message the template rewrites, the whole
  template is rendered and tokenised in a worker thread, the count checked against the
  intended one and the last user message corrected if the template is not linear.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from ..aio import Steps, run_steps, run_steps_async
from ..client.http import ClientConfig, HTTPClient, chat_body, completion_body, stream_request
from ..prompt.exact import NotIncremental, SessionIds
from ..prompt.synth import Conversation, PreparedTurn
from ..records import RequestRecord

_PROMPT = b'"prompt":[]'


@dataclass
class ChatSender:
    session: HTTPClient
    cfg: ClientConfig
    keep_text: bool = False

    @property
    def url(self) -> str:
        return self.cfg.base_url.rstrip("/") + "/v1/chat/completions"

    async def prepare(self, conv: Conversation, turn: PreparedTurn) -> None:
        """Nothing ahead of time (see the module docstring)."""

    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord,
                   prepared: Any = None) -> str | None:
        conv.materialize()  # no-op unless the conversation was built for token ids
        # the body goes straight in (no local name) so it is freed once the response starts
        headers = {"X-Request-ID": rec.request_id, "X-Session-ID": rec.session_id}
        return await stream_request(
            self.session, self.url, orjson.dumps(chat_body(self.cfg, turn.messages,
                                                           turn.max_tokens)),
            rec, headers, self.keep_text)


@dataclass
class TokenIdsSender:
    session: HTTPClient
    cfg: ClientConfig
    keep_text: bool = False
    max_fix_rounds: int = 3

    @property
    def url(self) -> str:
        return self.cfg.base_url.rstrip("/") + "/v1/completions"

    def render_ids(self, conv: Conversation, turn: PreparedTurn) -> list[int]:
        """Full render + tokenisation (a template that is not linear); ~5 us per token."""
        tok = conv.model.tokenizer
        kw = {}
        if self.cfg.thinking is not None:
            kw["enable_thinking"] = self.cfg.thinking == "on"
        ids: list[int] = []
        for _ in range(self.max_fix_rounds + 1):
            conv.materialize()
            ids = tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                                     **kw))
            delta = turn.intended_in - len(ids)
            if delta == 0:
                break
            conv.fix_last_user(delta)
        turn.messages = list(conv.messages)
        return ids

    def prompt_steps(self, conv: Conversation, turn: PreparedTurn) -> Steps[list[bytes] | None]:
        """The prompt's ids as JSON fragments, built from the session's kept ids plus what this
        turn adds; None when the template cannot be built incrementally for this turn."""
        pieces = conv.model.pieces
        if pieces is None:
            return None
        if not isinstance(conv.wire, SessionIds):
            conv.wire = SessionIds()
        wire: SessionIds = conv.wire
        bs = conv.trace.block_size
        try:
            for _ in range(self.max_fix_rounds + 1):
                yield from wire.sync(conv.messages, conv.content_specs, pieces, bs)
                delta = turn.intended_in - (wire.total + len(pieces.gen))
                if delta == 0:
                    break
                conv.fix_last_user(delta)  # literal content (live history) counted differently
        except NotIncremental:
            conv.wire = None
            return None
        turn.messages = list(conv.messages)
        return wire.prompt_parts(pieces.gen)

    def prompt_parts(self, conv: Conversation, turn: PreparedTurn) -> list[bytes] | None:
        """`prompt_steps` at once."""
        return run_steps(self.prompt_steps(conv, turn))

    def body(self, prompt: list[bytes], max_tokens: int) -> list[bytes]:
        """completion_body with `prompt` spliced in as fragments (no copy of the ids)."""
        frame = orjson.dumps(completion_body(self.cfg, [], max_tokens))
        i = frame.find(_PROMPT)
        if i < 0:  # --extra-body replaced the prompt: the server gets what the user asked for
            return [frame]
        return [frame[:i + len(_PROMPT) - 1], *prompt, frame[i + len(_PROMPT) - 1:]]

    async def build(self, conv: Conversation, turn: PreparedTurn) -> list[bytes]:
        """The request body, as fragments (which share the session's kept ids: a lane holding
        it through its think time holds little more than its history)."""
        parts = await run_steps_async(self.prompt_steps(conv, turn))
        if parts is None:  # rare and slow: off the event loop, so other lanes keep their timing
            parts = [orjson.dumps(await asyncio.to_thread(self.render_ids, conv, turn))[1:-1]]
        return self.body(parts, turn.max_tokens)

    async def prepare(self, conv: Conversation, turn: PreparedTurn) -> list[bytes]:
        return await self.build(conv, turn)

    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord,
                   prepared: list[bytes] | None = None) -> str | None:
        headers = {"X-Request-ID": rec.request_id, "X-Session-ID": rec.session_id}
        body = prepared if prepared is not None else await self.build(conv, turn)
        return await stream_request(self.session, self.url, body, rec, headers, self.keep_text)
