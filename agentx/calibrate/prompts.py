"""A user's prompts instead of the trace: a JSONL file, one chat request per line (`messages`
and optionally `max_tokens`, sampling keys), sent one at a time through agentx's own
streaming client, with /metrics scraped before and after."""
from __future__ import annotations

import secrets
from pathlib import Path

import orjson

from .. import aio
from ..client.http import ClientConfig, chat_body, first_model, make_session, stream_request
from ..errors import InputError
from ..records import RecordWriter, RequestRecord, read_records
from ..rundir import RunDir
from ..scrape.process import ScraperProcess

DEFAULT_MAX_TOKENS = 256


def load_prompts(path: str) -> list[dict]:
    """The requests of the file; a bad line is one error naming its line."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.__class__.__name__})", field="--prompts") \
            from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            req = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise InputError(path, f"not valid JSON ({e})", line=i) from None
        msgs = req.get("messages") if isinstance(req, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise InputError(path, "needs a non-empty `messages` list", line=i, field="messages")
        out.append(req)
    if not out:
        raise InputError(path, "no requests in the file", field="--prompts")
    return out


def send_prompts(w, url: str, model: str | None, thinking: str,
                 out: Path) -> tuple[dict, list[dict]]:
    """(spec_decode block of the /metrics deltas, request records)."""
    return aio.run(_send(w, url, model, thinking, out))


async def _send(w, url: str, model: str | None, thinking: str,
                out: Path) -> tuple[dict, list[dict]]:
    reqs = load_prompts(w.prompts)
    out.mkdir(parents=True, exist_ok=True)
    ccfg = ClientConfig(base_url=url, thinking=thinking, extra_body=dict(w.extra_body),
                        cache_salt=secrets.token_hex(8))
    scraper = ScraperProcess(url + "/metrics", interval_s=3600.0)
    async with make_session(ccfg) as session:
        ccfg.model = model or (await first_model(session, url))[0]
        await scraper.start()
        writer = RecordWriter(out / RunDir.REQUESTS)
        try:
            for i in range(w.requests):
                req = dict(reqs[i % len(reqs)])
                body = chat_body(ccfg, req.pop("messages"),
                                 int(req.pop("max_tokens", DEFAULT_MAX_TOKENS)))
                body.update(req)
                body.update(w.extra_body)  # --max-tokens / --temperature win over the file
                rec = RequestRecord(request_id=f"cal-{i}", session_id="", lane=0, turn=i,
                                    warmup=False, kind="turn")
                await stream_request(session, url + "/v1/chat/completions",
                                     orjson.dumps(body), rec, {"X-Request-ID": rec.request_id})
                writer.write(rec)
        finally:
            writer.close()
            await scraper.stop()
    spec = (scraper.compute(ccfg.model) or {}).get("spec_decode") or {}
    return spec, read_records(out / RunDir.REQUESTS)
