"""`agentx calibrate` against the simulator over real HTTP: it recovers the simulator's true
acceptance length within its interval, writes and merges the golden file (loaded back
strictly, picked up by a recipe), and validation catches an AL pinned from the golden entry of
the other thinking mode. The simulator's acceptance draws are seeded and conc 1 fixes their
order, so each figure here is reproducible run to run."""
from __future__ import annotations

import json
import math
from pathlib import Path

import orjson
import pytest
import yaml

from agentx.calibrate.interval import CHUNK_COUNTS, bootstrap, request_counts
from agentx.cli import main
from agentx.golden_al import load_golden
from agentx.metrics.definitions import acceptance_length, chunk_spec_counts
from agentx.recipe.load import load_recipe
from agentx.recipe.simargs import sim_options
from agentx.sim.config import SimConfig
from agentx.targets.embedded import start_in_process

SIM = ["--recipe", "tiny-cpu", "--sim", "--sim-time-scale", "20", "--max-tokens", "64"]
KEY = "${AGENTX_TINY_ASSETS}/eagle3"  # tiny-cpu's golden key: its draft, as written


def _calibrate(tmp_path: Path, name: str, *args: str) -> tuple[int, dict]:
    out = tmp_path / name
    code = main(["calibrate", *args, "-o", str(out)])
    return code, json.loads((out / "calibration.json").read_text())


def test_recovers_the_simulators_true_al(tmp_path):
    golden = tmp_path / "golden.yaml"
    code, res = _calibrate(tmp_path, "cal", *SIM, "--k", "1,3", "--thinking", "on",
                           "--requests", "30", "--golden", str(golden))
    assert code == 0
    assert [(c["k"], c["thinking"]) for c in res["cells"]] == [(1, "on"), (3, "on")]
    for c in res["cells"]:
        iv = c["interval"]
        assert c["kind"] == "sim" and c["error"] is None and c["completed"] == 30
        assert iv["source"] == CHUNK_COUNTS and iv["low"] < iv["high"]  # not degenerate
        assert iv["low"] <= c["true_al"] <= iv["high"], c  # 1.8 (K=1), 2.952 (K=3)
        assert iv["low"] <= c["al"] <= iv["high"]
        assert len(c["per_position"]) == c["k"]  # non-increasing, as 0.8^i
        assert all(a >= b for a, b in zip(c["per_position"], c["per_position"][1:]))
    table = load_golden(golden)  # strict load of what it wrote
    on = table[KEY].thinking_on
    assert set(on) == {1, 3} and table[KEY].thinking_off == {}
    assert on == {c["k"]: round(c["al"], 2) for c in res["cells"]}


def test_golden_file_merged_and_picked_up_by_a_recipe(tmp_path):
    golden = tmp_path / "golden" / "tiny.yaml"
    golden.parent.mkdir()
    golden.write_text("# kept: a header line of the user's\nother/draft:\n  thinking_on:\n"
                      "    3: 2.5\n")
    args = [*SIM, "--requests", "8", "--golden", str(golden)]
    assert _calibrate(tmp_path, "a", *args, "--k", "3", "--thinking", "on,off")[0] == 0
    code, res = _calibrate(tmp_path, "b", *args, "--k", "2", "--thinking", "on")
    assert code == 0 and res["golden_file"] == str(golden)
    table = load_golden(golden)
    assert table["other/draft"].thinking_on == {3: 2.5}  # the other entry is kept
    assert set(table[KEY].thinking_on) == {2, 3} and set(table[KEY].thinking_off) == {3}
    assert table[KEY].thinking_on[2] == round(res["cells"][0]["al"], 2)
    text = golden.read_text()
    assert text.startswith("# kept: a header line of the user's\n")
    prov = [x for x in text.splitlines() if x.startswith(f"# {KEY} ")]
    assert len(prov) == 3  # one provenance line per entry, date, server, dataset, interval
    assert all("95% interval" in x and "requests at conc 1" in x and "temperature=0.0" in x
               and "trace swe" in x and "agentx simulator" in x for x in prov)
    for value in yaml.safe_load(text)[KEY]["thinking_on"].values():
        assert value == round(value, 2)
    # a recipe with `synthetic_al: golden` reading this file pins the calibrated value
    recipe = yaml.safe_load(load_recipe("tiny-cpu")[1].read_text())
    recipe["speculative"].update(k=2, synthetic_al="golden", golden_file="golden/tiny.yaml")
    recipe["default_chat_template_kwargs"] = {"enable_thinking": True}
    path = tmp_path / "tiny-golden.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r, p = load_recipe(str(path))
    assert sim_options(r, 0, recipe_dir=p.parent)["synthetic_al"] == table[KEY].thinking_on[2]


def test_url_and_prompts_file_recover_a_synthetic_al(tmp_path):
    """--url K=URL with a user's JSONL prompts: the simulator pinned to AL 2.4 at K=2."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": t}],
                                             "max_tokens": 80})
                                 for t in ("fix the failing test", "refactor util.py")) + "\n")
    sim = start_in_process(SimConfig(port=0, profile="cpu-tiny", spec_k=2, synthetic_al=2.4,
                                     time_scale=20, model_name="m"))
    try:
        code, res = _calibrate(tmp_path, "u", "--url", f"2={sim.base_url}", "--prompts",
                               str(prompts), "--thinking", "off", "--requests", "12",
                               "--golden", str(tmp_path / "g.yaml"))
    finally:
        sim.stop()
    assert code == 0
    [c] = res["cells"]
    assert c["kind"] == "url" and c["model"] == "m" and c["completed"] == 12
    assert c["interval"]["low"] <= 2.4 <= c["interval"]["high"]
    assert c["per_position"][0] == pytest.approx(1.0)  # vLLM's schedule: [1.0, 0.4]
    assert load_golden(tmp_path / "g.yaml")["m"].thinking_off == {2: round(c["al"], 2)}


def _run(tmp_path: Path, name: str, golden: Path, thinking: str) -> tuple[int, dict]:
    out = tmp_path / name
    code = main(["run", "--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "--conc", "1",
                 "--max-requests", "40", "--context-scale", "0.01", "--think-scale", "0",
                 "--extra-body", '{"max_tokens": 96}', "--thinking", thinking,
                 "--golden-al", f"{golden}:d/eagle3:on:3", "--validate", "strict",
                 "--loop-lag-threshold", "10000",  # a loaded machine's client lag is not the point
                 "--no-progress", "-o", str(out)])
    return code, orjson.loads((out / "summary.json").read_bytes())


def test_validation_catches_an_al_pinned_for_the_other_thinking_mode(tmp_path):
    golden = tmp_path / "g.yaml"
    golden.write_text("d/eagle3:\n  thinking_on:\n    3: 2.9\n  thinking_off:\n    3: 2.6\n")
    code, s = _run(tmp_path, "on", golden, "on")
    checks = {c["name"]: c for c in s["validation"]["checks"]}
    assert s["golden_al"] == {"file": str(golden), "model": "d/eagle3", "thinking": "on",
                              "k": 3, "al": 2.9}
    assert checks["golden_thinking_mode"]["ok"] is True
    # the embedded simulator was pinned to the entry and the measured AL matches it
    assert checks["spec_decode_acceptance_length"]["ok"] is True, checks
    assert code == 0, s["validation"]["reasons"]
    code, s = _run(tmp_path, "off", golden, "off")
    assert code == 3
    [reason] = [r for r in s["validation"]["reasons"] if r.startswith("golden_thinking_mode")]
    assert "thinking_on K=3 = 2.9" in reason and "traffic is thinking-off" in reason


@pytest.mark.parametrize("args, needle", [
    (["--url", "x=http://h:1"], "--url"),
    (["--url", "3=http://h:1", "--recipe", "tiny-cpu"], "give --recipe or --url"),
    (["--url", "3=http://h:1", "--sim"], "--sim needs --recipe"),
    (["--url", "3=http://h:1", "--k", "2"], "differs from the --url keys"),
    (["--recipe", "tiny-cpu", "--sim", "--prompts", "PROMPTS"], ":2: field 'messages'"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"prompt": "y"}\n')
    args = [str(bad) if a == "PROMPTS" else a for a in args]
    assert main(["calibrate", *args, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


def test_golden_al_flag_names_a_missing_entry(tmp_path, capsys):
    golden = tmp_path / "g.yaml"
    golden.write_text("d:\n  thinking_on:\n    3: 2.9\n")
    assert main(["run", "--golden-al", f"{golden}:d:off:3", "--max-requests", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--golden-al" in err and "no golden AL for d thinking_off K=3" in err


def test_interval_from_per_request_counts_and_chunks():
    assert acceptance_length(30, 20) == 2.5 and acceptance_length(5, 0) is None
    assert chunk_spec_counts([1, 3, 2, 1, 4]) == (6, 4)  # first chunk: the prefill's token
    recs = [{"ok": True, "chunk_tokens": [1, 3, 3], "spec_accepted": 4, "spec_steps": 2},
            {"ok": True, "chunk_tokens": [1, 2, 1], "spec_accepted": 1, "spec_steps": 2},
            {"ok": False, "chunk_tokens": [1]}]
    pairs, source = request_counts(recs)
    assert pairs == [(4, 2), (1, 2)] and source != CHUNK_COUNTS
    iv = bootstrap(2.25, pairs, 3, source, resamples=500)
    assert 1.0 <= iv.low < 2.25 < iv.high <= 4.0 and iv.requests == 2
    recs[1]["spec_steps"] = None  # one request without server counts: chunks for all
    assert request_counts(recs) == ([(4, 2), (1, 2)], CHUNK_COUNTS)
    assert bootstrap(2.0, [(1, 1)], 3, CHUNK_COUNTS) is None


def test_interval_when_no_draft_is_accepted():
    """A useless draft (the tiny random EAGLE3 of the vLLM tests): the bootstrap collapses,
    the exact binomial bound over the drafts does not."""
    iv = bootstrap(1.0, [(0, 100), (0, 150)], 2, CHUNK_COUNTS)
    assert iv.low == 1.0 and 1.0 < iv.high < 1.04  # 1 + 2 * (1 - 0.025^(1/250)) = 1.029
    iv = bootstrap(4.0, [(30, 10), (60, 20)], 3, CHUNK_COUNTS)
    assert 3.6 < iv.low < 4.0 == iv.high  # 4 - 3 * (1 - 0.025^(1/30)) = 3.65


def test_interval_when_every_request_accepts_the_same_share():
    """A deterministic model on near-identical prompts (the tiny ngram server of the vLLM
    tests): every request 20 accepted in 8 steps, so every resample is the same; the interval
    is Hoeffding's over the 80 drafts, not a point."""
    iv = bootstrap(3.5, [(20, 8)] * 10, 3, CHUNK_COUNTS)
    half = 3 * (math.log(40) / 160) ** 0.5  # K * sqrt(ln(2/0.05) / (2 * 80)) = 0.455
    assert iv.low == pytest.approx(3.5 - half) and iv.high == pytest.approx(3.5 + half)
    assert "Hoeffding" in iv.source and iv.requests == 10
    # the bound narrows as drafts grow, and stays inside [1, K+1]
    wide = bootstrap(1.2, [(1, 5)] * 4, 3, CHUNK_COUNTS)
    narrow = bootstrap(1.2, [(100, 500)] * 4, 3, CHUNK_COUNTS)
    assert wide.low == 1.0 and narrow.low > 1.0 and narrow.high - narrow.low < wide.high - wide.low


def test_url_calibration_says_its_key_and_how_a_recipe_pins_it(tmp_path, capsys):
    """--url without --golden-model keys the golden file by the served model name; when that is
    a filesystem path (vLLM's default without --served-model-name) the note says so and names
    --golden-model, and the closing note gives the file and the three recipe keys that pin it."""
    sim = start_in_process(SimConfig(port=0, profile="cpu-tiny", spec_k=2, synthetic_al=2.4,
                                     time_scale=20, model_name="/opt/models/qwen3-8b"))
    golden = tmp_path / "g.yaml"
    try:
        code, _ = _calibrate(tmp_path, "u", "--url", f"2={sim.base_url}", "--thinking", "off",
                             "--requests", "4", "--max-tokens", "32", "--context-scale", "0.01",
                             "--golden", str(golden))
    finally:
        sim.stop()
    out = capsys.readouterr().out
    assert code == 0 and "/opt/models/qwen3-8b" in load_golden(golden)
    assert "the golden key /opt/models/qwen3-8b is the server's model path" in out
    assert "give --golden-model" in out
    assert (f"note: written to {golden} under /opt/models/qwen3-8b; a recipe pins these values "
            f"with `golden_file: {golden.resolve()}`, `synthetic_al: golden` and "
            "`golden_model: /opt/models/qwen3-8b`") in out
