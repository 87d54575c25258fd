"""Hostile files and requests (issue 20, defects 9, 12, 13): a YAML alias bomb, a request that
would hold the simulator's event loop for seconds, a trace that decompresses to gigabytes. Each
must end promptly with one line naming the file (exit 2) or a JSON error (4xx), never hang,
never eat the machine's memory. The bombs are generated here, small compressed."""
from __future__ import annotations

import asyncio
import gzip
import io
import lzma
import random
import re
import tarfile
import time
import tracemalloc
from pathlib import Path

import aiohttp
import orjson
import pytest

from agentx.cli import main
from agentx.errors import InputError
from conftest import REAL_TRACES, REPO

# ---------------------------------------------------------------- 9: YAML alias bomb


def _alias_bomb(path: Path, levels: int = 9) -> Path:
    """A "billion laughs": 10 lines, 9**9 (387 M) leaves once the aliases are followed."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_line_error(capsys, path: Path, line: int) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {path}:{line}: ") and "aliases are not accepted" in err, err
    return err


@pytest.mark.parametrize("argv", [
    ["recipe", "render", "{f}"],
    ["serve-sim", "--profile", "{f}", "--port", "0"],
    ["run", "--sim-profile", "{f}", "--max-requests", "1", "--duration", "2"],
])
def test_yaml_alias_bomb_is_one_line_exit_2(argv, tmp_path, capsys):
    bomb = _alias_bomb(tmp_path / "bomb.yaml")
    t0 = time.monotonic()
    code = main([a.format(f=bomb) for a in argv] + (["--output-dir", str(tmp_path / "out")]
                                                   if argv[0] == "run" else []))
    assert code == 2 and time.monotonic() - t0 < 8  # it hung before
    _one_line_error(capsys, bomb, 2)
    assert not (tmp_path / "out").exists()


def test_yaml_aliases_refused_in_golden_files_and_set_values(tmp_path):
    from agentx.golden_al import GoldenPin, load_golden
    from agentx.yamlconf import load_value

    bomb = _alias_bomb(tmp_path / "golden.yaml")
    with pytest.raises(InputError, match=r"golden.yaml:2: not valid YAML \(aliases are not accepted"):
        load_golden(bomb)
    with pytest.raises(ValueError, match="aliases are not accepted"):
        GoldenPin.model_validate(f"{bomb}:m:on:3")
    with pytest.raises(InputError, match="command line --set:1: not valid YAML"):
        load_value("[&a [1, 1], *a]", "command line --set")
    assert load_value("{a: [1, 2]}", "x") == {"a": [1, 2]}  # plain values still load


def test_every_yaml_read_goes_through_yamlconf():
    """One loader: no other module parses YAML itself (yaml.dump is fine)."""
    calls = re.compile(r"yaml\.(safe_load|load|full_load|unsafe_load|compose|parse)\w*\(")
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "agentx").rglob("*.py")
                 if p.name != "yamlconf.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if calls.search(line)]
    assert offenders == []


# ---------------------------------------------------------------- 13: trace bombs

ZEROS = b"\0" * (1 << 20)
# a valid session, then spaces: parses, and compresses to nothing
SESSION = orjson.dumps({"id": "s", "block_size": 64, "requests": [
    {"t": 0.0, "in": 640, "out": 20, "hash_ids": list(range(10))}]}) + b" " * (256 << 10)


def _gz(n_mib: int, data: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as f:
        for _ in range(n_mib):
            f.write(ZEROS)
        f.write(data or b"")
    return buf.getvalue()


def _xz(n_mib: int) -> bytes:
    c = lzma.LZMACompressor(preset=0)
    return b"".join(c.compress(ZEROS) for _ in range(n_mib)) + c.flush()


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.n = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        k = min(len(b), self.n)
        b[:k] = bytes(k)
        self.n -= k
        return k


def _tar(path: Path, mode: str, members: list[tuple[str, int | bytes]]) -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = data if isinstance(data, int) else len(data)
            tf.addfile(ti, io.BufferedReader(_Zeros(data)) if isinstance(data, int)
                       else io.BytesIO(data))
    return path


BOMBS = {  # name -> a writer of a file that expands to 64 MiB, a few hundred KB at most
    "a.json.gz": lambda p: p.write_bytes(_gz(64)),
    "a.json.xz": lambda p: p.write_bytes(_xz(64)),
    "a.jsonl.gz": lambda p: p.write_bytes(_gz(64)),
    "a.gz": lambda p: p.write_bytes(_gz(32) * 2),  # two gzip members
    "a.tar.gz": lambda p: _tar(p, "w:gz", [("t/a.json", 64 << 20)]),
    "a.tgz": lambda p: _tar(p, "w:gz", [("skipped.bin", 64 << 20), ("a.json", b"{}")]),
    "a.tar.xz": lambda p: _tar(p, "w:xz", [(f"t/{i}.json", SESSION) for i in range(40)]),
    "b.tar.xz": lambda p: _tar(p, "w:xz", [("t/a.json.gz", _gz(64))]),  # a bomb in a tar
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_trace_bomb_stops_at_the_bound(name, tmp_path, monkeypatch):
    """Every compressed format, with the bound at 8 MiB: one InputError naming the file, and
    never much more than the bound in memory (8 MiB, plus the xz decoder's 8 MiB dictionary
    and a read chunk), where the whole 64 MiB (or 2x that) was held before."""
    from agentx.trace.load import load_traces

    monkeypatch.setenv("AGENTX_MAX_TRACE_BYTES", "8M")
    path = tmp_path / name
    BOMBS[name](path)
    assert path.stat().st_size < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            load_traces(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(f"error: {path}")
    assert "trace data exceeds 8 MiB once decompressed" in str(err.value)
    assert "AGENTX_MAX_TRACE_BYTES" in str(err.value)
    assert peak < 20 << 20, peak


def test_trace_bound_counts_a_whole_directory(tmp_path, monkeypatch):
    from agentx.trace.load import load_traces

    monkeypatch.setenv("AGENTX_MAX_TRACE_BYTES", "8M")
    for i in range(40):  # 40 x 256 KiB: each under the bound, together over it
        (tmp_path / f"{i:02d}.json.gz").write_bytes(_gz(0, SESSION))
    with pytest.raises(InputError, match=r"31\.json\.gz: trace data exceeds 8 MiB"):
        load_traces(str(tmp_path))


def test_trace_bomb_cli_exit_2(tmp_path, capsys, monkeypatch):
    """Through the CLI: one line, exit 2. /dev/zero stands for a huge plain file or a pipe
    (no size to check: a bound on what is read is the only stop; it ate all memory before)."""
    monkeypatch.setenv("AGENTX_MAX_TRACE_BYTES", "8M")
    for path in ("/dev/zero", BOMBS["a.tar.gz"](tmp_path / "a.tar.gz")):
        code = main(["trace", "stats", str(path)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err == (f"error: {path}: trace data exceeds 8 MiB once decompressed "
                                     "(a decompression bomb? set AGENTX_MAX_TRACE_BYTES to allow "
                                     "more)")


def test_trace_bound_comfortably_exceeds_the_real_traces(monkeypatch):
    """The default bound is over twice the 533 real sessions (332 MiB of JSON), and they load
    under it; a bad AGENTX_MAX_TRACE_BYTES is one line naming it."""
    from agentx.trace.load import MAX_TRACE_BYTES, max_trace_bytes

    with tarfile.open(REAL_TRACES) as tf:
        real = sum(m.size for m in tf if m.isfile())
    assert real == 347_736_059 and MAX_TRACE_BYTES >= 2 * real and max_trace_bytes() == MAX_TRACE_BYTES
    monkeypatch.setenv("AGENTX_MAX_TRACE_BYTES", "2G")
    assert max_trace_bytes() == 2 << 30
    monkeypatch.setenv("AGENTX_MAX_TRACE_BYTES", "lots")
    with pytest.raises(InputError, match="AGENTX_MAX_TRACE_BYTES: expected a positive size"):
        max_trace_bytes()


# ---------------------------------------------------------------- 12: hostile requests


@pytest.fixture(scope="module")
def sim_proc():
    """The simulator in its own process (its event loop and interpreter lock not shared with
    the test's client), as `agentx run` and `agentx serve-sim` run it."""
    from agentx.sim.config import SimConfig
    from agentx.targets.embedded import start_in_process

    with start_in_process(SimConfig(profile="cpu-tiny", fixed_ttft_ms=1, fixed_itl_ms=1)) as s:
        yield s


SMALL = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2}
CAP = 16 << 20  # the default max_model_len's body limit (and the floor for smaller models)


async def _post(s: aiohttp.ClientSession, url: str, data, **kw) -> tuple[int, dict]:
    async with s.post(url, data=data, headers={"Content-Type": "application/json"}, **kw) as r:
        return r.status, await r.json(content_type=None)


async def test_body_over_the_cap_is_413_json(sim_proc):
    big = b'{"prompt":"' + b"word " * (CAP // 5) + b'"}'

    async def chunked():  # no Content-Length: the cap applies while reading
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    async with aiohttp.ClientSession() as s:
        for data in (big, chunked()):
            status, body = await _post(s, sim_proc.base_url + "/v1/completions", data)
            assert status == 413 and body["error"]["code"] == 413, body
            assert "over the limit of 16,777,216 bytes" in body["error"]["message"]
        status, _ = await _post(s, sim_proc.base_url + "/v1/chat/completions", orjson_dumps(SMALL))
        assert status == 200  # the server is fine


def orjson_dumps(x) -> bytes:
    import orjson

    return orjson.dumps(x)


@pytest.mark.parametrize("path,body,msg", [
    ("/v1/completions", {"prompt": [1, -5, 3]}, "Token id -5 is out of vocabulary"),
    ("/v1/completions", {"prompt": [1, 1 << 17]}, "Token id 131072 is out of vocabulary"),
    ("/v1/completions", {"prompt": [[1], [2, 1 << 40]]}, "Token id 1099511627776 is out of"),
    ("/detokenize", {"tokens": [7, -1]}, "Token id -1 is out of vocabulary"),
    ("/v1/completions", {"prompt": ["a"] * 2049}, "List should have at most 2048 items"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}] * 12_000},  # max_model_len 59616
     "the request has 12000 messages, and each takes at least 5 (at most 11923 fit)"),
])
async def test_bad_requests_are_400_json(sim_proc, path, body, msg):
    async with aiohttp.ClientSession() as s:
        status, out = await _post(s, sim_proc.base_url + path, orjson_dumps(dict(body, max_tokens=2)))
    assert status == 400 and msg in out["error"]["message"], out


def _hostile(kind: str) -> bytes:
    n = CAP - 4096
    if kind == "text":  # 3 M tokens of text: tokenized on the worker, stopped at max_model_len
        return b'{"prompt":"' + (b"lorem ipsum dolor sit amet " * (n // 27)) + b'"}'
    return b'{"messages":[' + b'{"role":"u"},' * (n // 13) + b'{"role":"u"}]}'  # 1.3 M objects


@pytest.mark.alone  # timing: another client's worst latency (1,065 ms once beside 2 busy workers)
@pytest.mark.parametrize("kind", ["text", "objects"])
async def test_other_clients_are_served_while_a_huge_request_arrives(sim_proc, kind):
    """Before: the loop parsed and tokenized a huge body itself, 1-4 s here (52 MB: 5-8 s),
    and every other client waited that long. Now the other client's worst latency over 20
    requests stays under 0.75 s (measured 10-90 ms), and the huge one gets its 400."""
    url = sim_proc.base_url
    async with aiohttp.ClientSession() as s:
        async def huge():
            return await _post(s, url + ("/v1/completions" if kind == "text"
                                         else "/v1/chat/completions"), _hostile(kind))

        async def other():
            await asyncio.sleep(0.05)  # the huge one is on its way
            worst = 0.0
            for _ in range(20):
                t = time.perf_counter()
                status, _ = await _post(s, url + "/v1/chat/completions", orjson_dumps(SMALL))
                assert status == 200
                worst = max(worst, time.perf_counter() - t)
                await asyncio.sleep(0.03)
            return worst

        (status, body), worst = await asyncio.gather(huge(), other())
    assert status == 400 and "maximum context length" in body["error"]["message"]
    assert worst < 0.75, f"another client waited {worst * 1000:.0f} ms"


async def test_big_legit_request_tokenized_on_the_worker_counts_the_same(sim_proc):
    """A body over the inline limit goes to the worker thread's encoder; its token count is
    the one the client's own tokenizer gives (and /tokenize's)."""
    from agentx.tokens.tokenizer import BuiltinTokenizer
    from agentx.tokens.words import WORDS

    tok = BuiltinTokenizer(WORDS)
    rng = random.Random(7)
    long = [w for w in WORDS if len(w) >= 7]
    text = " ".join(rng.choice(long) for _ in range(40_000)) + "\n<x> tab\there"
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": text}]
    assert len(text) > 256 << 10
    want = len(tok.encode(tok.apply_chat_template(msgs)))
    async with aiohttp.ClientSession() as s:
        status, body = await _post(s, sim_proc.base_url + "/v1/chat/completions",
                                   orjson_dumps({"messages": msgs, "max_tokens": 2}))
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == want
        status, body = await _post(s, sim_proc.base_url + "/tokenize",
                                   orjson_dumps({"messages": msgs}))
        assert status == 200 and body["count"] == want


def test_piece_tokenizer_gives_the_same_ids():
    """Cutting a long text before whitespace or `<` never changes its tokens."""
    from agentx.sim import parse
    from agentx.tokens.tokenizer import BuiltinTokenizer
    from agentx.tokens.words import WORDS

    tok = BuiltinTokenizer(WORDS)
    rng = random.Random(3)
    atoms = [*WORDS[:200], " ", "  ", "\n", "\t", "<", "<|im_end|>", "<|x", "é", "\u2003", "a" * 300]
    for _ in range(20):
        text = "".join(rng.choice(atoms) for _ in range(rng.randrange(1000, 40_000)))
        pieces = parse._PieceTokenizer(tok)
        pieces.left = 1 << 30
        orig, parse._PIECE = parse._PIECE, rng.choice([1, 7, 300])
        try:
            assert pieces.encode(text) == tok.encode(text)
        finally:
            parse._PIECE = orig
