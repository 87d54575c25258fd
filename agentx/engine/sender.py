"""Turn a prepared turn into bytes on the wire: server-side or client-side chat template.

- ChatSender: POST /v1/chat/completions with the messages; the server applies its template.
- TokenIdsSender (token-exact, --tokenizer): render the template client-side, check the
  token count equals the intended one (correcting the last user message if the template is
  not linear), POST /v1/completions with the token ids.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..client.http import ClientConfig, HTTPClient, chat_body, completion_body, stream_request
from ..prompt.synth import Conversation, PreparedTurn
from ..records import RequestRecord


@dataclass
class ChatSender:
    session: HTTPClient
    cfg: ClientConfig
    keep_text: bool = False

    @property
    def url(self) -> str:
        return self.cfg.base_url.rstrip("/") + "/v1/chat/completions"

    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord) -> str | None:
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
        tok = conv.model.tokenizer
        kw = {}
        if self.cfg.thinking is not None:
            kw["enable_thinking"] = self.cfg.thinking == "on"
        ids: list[int] = []
        for _ in range(self.max_fix_rounds + 1):
            ids = tok.encode(tok.apply_chat_template(conv.messages, add_generation_prompt=True,
                                                     **kw))
            delta = turn.intended_in - len(ids)
            if delta == 0:
                break
            conv.fix_last_user(delta)
        turn.messages = list(conv.messages)
        return ids

    async def send(self, conv: Conversation, turn: PreparedTurn, rec: RequestRecord) -> str | None:
        ids = self.render_ids(conv, turn)
        rec.isl_intended = turn.intended_in
        headers = {"X-Request-ID": rec.request_id, "X-Session-ID": rec.session_id}
        return await stream_request(
            self.session, self.url, orjson.dumps(completion_body(self.cfg, ids, turn.max_tokens)),
            rec, headers, self.keep_text)
