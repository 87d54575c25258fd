"""`agentx calibrate` against the real CPU vLLM (real verification): ngram on the session's
ngram server given by URL, and the tiny EAGLE3 draft through the tiny-cpu recipe, which the
command launches itself at K=2 with vLLM's per-request spec-decode counts. Each writes a golden
file that loads strictly, with an AL in [1, K+1] and an interval that is not a point. The
tiny EAGLE3 draft has random weights, so it accepts (almost) nothing: its AL is ~1 and its
interval comes from the exact binomial bound rather than the bootstrap. The tiny model's ngram
requests can all accept the same share (10 requests of 8 steps, 20 accepted each, in one CI
run): that interval is Hoeffding's over the drafts."""
from __future__ import annotations

import json

import pytest

from agentx.calibrate.interval import SERVER_COUNTS
from agentx.cli import main
from agentx.golden_al import load_golden

pytestmark = pytest.mark.vllm

SMALL = ["--thinking", "off", "--max-tokens", "32", "--context-scale", "0.01"]


def _check(tmp_path, key: str, k: int) -> dict:
    res = json.loads((tmp_path / "o" / "calibration.json").read_text())
    [c] = res["cells"]
    print(f"\n{key} K={k}: AL {c['al']:.4f} [{c['interval']['low']:.4f}, "
          f"{c['interval']['high']:.4f}] ({c['interval']['source']}), per position "
          f"{c['per_position']}, {c['drafts']:.0f} drafts, vLLM {c['server_version']}")
    assert c["error"] is None and c["failed"] == 0 and c["kind"] in ("url", "vllm")
    assert 1.0 <= c["al"] <= k + 1 and len(c["per_position"]) == k
    assert c["interval"]["low"] < c["interval"]["high"]
    assert c["interval"]["low"] <= c["al"] <= c["interval"]["high"]
    assert load_golden(tmp_path / "g.yaml")[key].thinking_off == {k: round(c["al"], 2)}
    return c


def test_calibrate_ngram(vllm_server_ngram, tmp_path):
    server = vllm_server_ngram  # K=3
    code = main(["calibrate", "--url", f"3={server.base_url}", *SMALL, "--requests", "10",
                 "--golden-model", "tiny-ngram", "--golden", str(tmp_path / "g.yaml"),
                 "-o", str(tmp_path / "o")])
    assert code == 0
    c = _check(tmp_path, "tiny-ngram", 3)
    assert c["server_version"] and c["completed"] == 10


def test_calibrate_eagle3_recipe(vllm_servers, vllm_assets, vllm_python, tmp_path, monkeypatch):
    vllm_servers.stop()  # one vLLM at a time on this machine
    monkeypatch.setenv("AGENTX_TINY_ASSETS", str(vllm_assets.root))
    monkeypatch.setenv("AGENTX_VLLM_PYTHON", str(vllm_python))
    code = main(["calibrate", "--recipe", "tiny-cpu", "--k", "2", *SMALL, "--requests", "8",
                 "--per-request-spec", "--golden", str(tmp_path / "g.yaml"),
                 "-o", str(tmp_path / "o")])
    assert code == 0
    c = _check(tmp_path, "${AGENTX_TINY_ASSETS}/eagle3", 2)
    assert c["interval"]["source"].startswith(SERVER_COUNTS)  # vLLM's per-request counts
    assert "eagle3" in (tmp_path / "o" / "k2" / "server" / "command.sh").read_text()
