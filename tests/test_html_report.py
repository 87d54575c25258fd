"""`agentx report --html`: real runs and a real A/B against the embedded simulator, their report
written, then opened in headless Chromium (Debian's `chromium`; .ci/run installs it) driven
over the DevTools protocol: the page must load with no console error, no exception and no
network request (every figure is a data URI), every <img> must have decoded, and labels full
of markup must show as text, not become elements."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from helpers import write_trace

REPO = Path(__file__).resolve().parents[1]
EVIL = "<img src=x onerror=alert(1)>"  # a label that would run script if not escaped
SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "--max-think", "0",
       "--no-progress", "--validate", "warn", "--scrape-interval", "0.5"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium is not installed: the HTML report is checked in a real browser. "
                    "Install it: apt-get install -y chromium (.ci/run does)")
    return path


def agentx(*args: object) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "agentx", *map(str, args)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Two runs (conc 1 and 2; one labelled with markup) and an A/B of two simulators."""
    root = tmp_path_factory.mktemp("html")
    trace = write_trace(root / "tr", sessions=8, turns=4, think=0.0, out=20)
    for conc in (1, 2):
        agentx("run", "--trace", trace, "--conc", conc, "--max-requests", 24, "--duration", 0,
               "--label", f"note={EVIL}", "--sim-model-name", "<b>model</b>", *SIM,
               "--output-dir", root / "runs" / f"c{conc}")
    agentx("ab", "--a", "qwen3-8b-dummy-h200", "--b", "qwen3-8b-dummy-h200", "--sim",
           "--trace", trace, "--conc", 2, "--max-requests", 24, "--duration", 0,
           "--bootstrap", 200, "--min-sessions", 1, "--min-samples", 5, "--a-label", "<i>A</i>",
           "--b-label", "B&<b>", *SIM, "-o", root / "ab")
    return root


async def _open(browser: str, page: Path, profile: Path) -> dict:
    """Load `page` in a fresh headless Chromium; what its console, network and images did."""
    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                tab = next(t for t in await r.json() if t["type"] == "page")
            async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                return await _drive(ws, page)
    finally:
        proc.terminate()
        proc.wait(10)


async def _drive(ws, page: Path) -> dict:
    seq, events, replies = 0, [], {}

    async def call(method: str, **params) -> dict:
        nonlocal seq
        seq += 1
        await ws.send_json({"id": seq, "method": method, "params": params})
        while seq not in replies:
            msg = json.loads((await ws.receive(timeout=60)).data)
            if "id" in msg:
                replies[msg["id"]] = msg
            else:
                events.append(msg)
        assert "error" not in replies[seq], replies[seq]
        return replies[seq]["result"]

    for domain in ("Runtime", "Log", "Page", "Network"):
        await call(f"{domain}.enable")
    await call("Page.navigate", url=page.as_uri())
    deadline = time.monotonic() + 60
    while not any(e["method"] == "Page.loadEventFired" for e in events):
        assert time.monotonic() < deadline, "the page never finished loading"
        await call("Runtime.evaluate", expression="1")  # collects events meanwhile
        await asyncio.sleep(0.1)
    probe = ("JSON.stringify({imgs: [...document.images].map(i => [i.alt, i.complete && "
             "i.naturalWidth > 0]), scripts: document.scripts.length, text: "
             "document.body.innerText, italic: document.querySelectorAll('i').length})")
    res = await call("Runtime.evaluate", expression=probe, returnByValue=True)
    out = json.loads(res["result"]["value"])
    out["errors"] = [e["params"] for e in events
                     if e["method"] == "Runtime.exceptionThrown"
                     or (e["method"] == "Runtime.consoleAPICalled"
                         and e["params"]["type"] in ("error", "assert"))
                     or (e["method"] == "Log.entryAdded"
                         and e["params"]["entry"]["level"] == "error")]
    out["requests"] = [e["params"]["request"]["url"][:80] for e in events
                       if e["method"] == "Network.requestWillBeSent"
                       and e["params"]["request"]["url"] != page.as_uri()
                       and not e["params"]["request"]["url"].startswith("data:")]
    return out


def check_page(html: Path, tmp: Path, images: set[str]) -> dict:
    page = asyncio.run(_open(chromium(), html, tmp / f"profile-{html.stem}"))
    assert page["errors"] == [], page["errors"]
    assert page["requests"] == []  # nothing fetched: the file stands alone
    assert page["scripts"] == 0
    assert {alt for alt, _ in page["imgs"]} == images, page["imgs"]
    assert all(ok for _, ok in page["imgs"]), page["imgs"]  # every image decoded
    assert EVIL not in html.read_text()  # the label went in escaped
    return page


def test_one_run_report_renders_in_chromium(made, tmp_path):
    run = made / "runs" / "c2"
    p = agentx("report", run, "--html")
    html = run / "report.html"
    assert f"html: {html}" in p.stdout
    page = check_page(html, tmp_path, {"latency CDFs", "server time series", "per-turn TTFT and hit rate"})
    text = page["text"]
    assert f"note={EVIL}" in text  # shown as the text it is
    for seen in ("verdict", "TTFT ms", "TPOT ms", "p50", "p99", "requests: ", "throughput: ",
                 "conc 2, max requests 24", "simulator cpu-tiny"):
        assert seen in text, seen
    summary = json.loads((run / "summary.json").read_text())
    assert f"{summary['ttft_ms']['count']:,}" in text  # the table's sample counts
    assert summary["validation"]["verdict"] in text
    assert "report.html" in (run / ".agentx-files").read_text()  # --overwrite removes it


def test_several_runs_and_an_ab_in_one_file(made, tmp_path):
    out = tmp_path / "all.html"
    agentx("report", made / "runs", made / "ab", "-o", tmp_path, "--no-plots")  # console only
    agentx("report", made / "runs", made / "ab", "--html", out, "-o", tmp_path)
    page = check_page(out, tmp_path, {"A/B CDFs", "Pareto frontier", "latency CDFs",
                                      "server time series", "per-turn TTFT and hit rate"})
    assert len(page["imgs"]) == 1 + 1 + 3 * 4  # A/B, Pareto, three figures for each of 4 runs
    text = page["text"]
    assert "A/B: <i>A</i> against B&<b>" in text and page["italic"] == 0  # no injected <i>
    ab = json.loads((made / "ab" / "ab.json").read_text())
    assert all(m["label"] in text for m in ab["metrics"].values())
    assert "4 runs: headline throughput tok/s per GPU against interactivity" in text


def test_gpu_power_and_energy_are_in_the_page(cli, made, tmp_path, monkeypatch):
    """A run sampled by NVML (faked at the library boundary, as tests/test_gpu_energy.py does)
    gets its power figure and energy line in the page."""
    from agentx.scrape import gpu
    from test_gpu_energy import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setattr(gpu, "_said", set())
    out = tmp_path / "run"
    r = cli("run", "--trace", made / "tr", "-o", out, "--gpu-indices", "0,1", "--conc", 2,
            "--max-requests", 16, "--duration", 0, "--max-think", 0, "--no-progress",
            "--validate", "warn", "--scrape-interval", "0.5", "--sim-profile", "cpu-tiny")
    assert r.returncode == 0, r.stderr
    assert cli("report", out, "--html").returncode == 0
    page = check_page(out / "report.html", tmp_path,
                      {"latency CDFs", "server time series", "GPU power", "per-turn TTFT and hit rate"})
    assert "energy (NVML, GPU 0,1" in page["text"]
