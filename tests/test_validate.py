"""Run validator: pass, fail and skip for every check, on server_metrics built
from the real vLLM /metrics samples."""
from __future__ import annotations

import copy

import pytest

from agentx.scrape import server_metrics as sm
from agentx.scrape.prom import parse_metrics
from agentx.verdict.validate import Expectations, validate
from conftest import SAMPLES

BEFORE = (SAMPLES / "metrics_before.txt").read_text()
AFTER = (SAMPLES / "metrics_after.txt").read_text()


def server_metrics(before: str = BEFORE, after: str = AFTER) -> dict:
    return sm.compute(parse_metrics(before, t=0.0), parse_metrics(after, t=30.0))


def drop(text: str, needle: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if needle not in ln) + "\n"


@pytest.fixture(scope="module")
def real() -> dict:
    return server_metrics()


def summary(metrics: dict | None, **kw) -> dict:
    out: dict = {"completed": 100, "failed": 0}
    if metrics is not None:
        out["server_metrics"] = copy.deepcopy(metrics)
    out.update(kw)
    return out


def check(result: dict, name: str) -> dict:
    (c,) = [c for c in result["checks"] if c["name"] == name]
    return c


# ---------------------------------------------------------------- overall

def test_clean_run_passes_and_lists_skips(real: dict) -> None:
    res = validate(summary(real), Expectations())
    assert res["verdict"] == "pass" and res["reasons"] == []
    assert check(res, "error_rate")["ok"] is True
    assert check(res, "required_metric_families")["ok"] is True
    assert check(res, "metrics_window")["ok"] is True
    for name in ("spec_decode_acceptance_length", "offload_hits", "prefix_hit_rate", "thinking_mode",
                 "golden_thinking_mode", "load_delivered"):
        assert check(res, name)["ok"] is None
    assert len(res["skipped"]) == 6
    assert check(res, "samples") == {"name": "samples", "ok": True, "measured": 100,
                                     "expected": ">= 30", "reason": ""}


def test_too_few_requests_is_insufficient_not_pass(real: dict) -> None:
    """A window of 1 request (a sweep cell at --warmup 0 on an H200) must not read `pass`;
    a check that fails outranks it; the floor is --min-samples."""
    res = validate(summary(real, completed=1), Expectations())
    assert res["verdict"] == "insufficient"
    assert check(res, "samples") == {**check(res, "samples"), "ok": False, "measured": 1}
    assert "fewer than --min-samples 30" in res["reasons"][0]
    assert validate(summary(real, completed=29), Expectations())["verdict"] == "insufficient"
    assert validate(summary(real, completed=30), Expectations())["verdict"] == "pass"
    assert validate(summary(real, completed=5), Expectations(min_samples=5))["verdict"] == "pass"
    failing = validate(summary(real, completed=1), Expectations(), extra_reasons=["client-bound"])
    assert failing["verdict"] == "fail" and len(failing["reasons"]) == 2
    assert validate(summary(real, completed=1), Expectations(),
                    interrupted="SIGINT")["verdict"] == "interrupted"


def test_extra_reasons_fail(real: dict) -> None:
    res = validate(summary(real), Expectations(), extra_reasons=["client-bound: loop lag p99 80 ms"])
    assert res["verdict"] == "fail"
    assert res["reasons"] == ["extra: client-bound: loop lag p99 80 ms"]


def test_bad_expectations_rejected() -> None:
    with pytest.raises(ValueError):
        Expectations(thinking="maybe")
    with pytest.raises(ValueError):
        Expectations(al_tolerance=-0.1)


# ---------------------------------------------------------------- error rate

@pytest.mark.parametrize("completed,failed,max_rate,ok", [
    (100, 0, 0.0, True),
    (99, 1, 0.01, True),     # exactly at the threshold passes
    (98, 2, 0.01, False),
    (0, 5, 0.5, False),
])
def test_error_rate(real: dict, completed: int, failed: int, max_rate: float, ok: bool) -> None:
    res = validate(summary(real, completed=completed, failed=failed), Expectations(max_error_rate=max_rate))
    c = check(res, "error_rate")
    assert c["ok"] is ok
    assert c["measured"] == pytest.approx(failed / (completed + failed))
    assert res["verdict"] == ("pass" if ok else "fail")


def test_error_rate_no_requests_fails_and_missing_skips(real: dict) -> None:
    assert check(validate(summary(real, completed=0, failed=0), Expectations()), "error_rate")["ok"] is False
    s = summary(real)
    del s["failed"]
    c = check(validate(s, Expectations()), "error_rate")
    assert c["ok"] is None and "failed" in c["reason"]


# ---------------------------------------------------------------- metric families

def test_missing_family_fails() -> None:
    metrics = server_metrics(drop(BEFORE, "vllm:num_preemptions"), drop(AFTER, "vllm:num_preemptions"))
    res = validate(summary(metrics), Expectations())
    c = check(res, "required_metric_families")
    assert c["ok"] is False and c["measured"] == ["vllm:num_preemptions"]
    assert res["verdict"] == "fail"


def test_no_metrics_fails_families_but_skips_the_rest() -> None:
    for s in (summary(sm.compute(None, None, [])), summary(None)):
        res = validate(s, Expectations(synthetic_al=2.0, theoretical_hit_rate=0.5, offload_expected=True,
                                       working_set_exceeds_pool=True))
        assert res["verdict"] == "fail"
        assert check(res, "required_metric_families")["ok"] is False
        for name in ("metrics_window", "spec_decode_acceptance_length", "offload_hits", "prefix_hit_rate"):
            assert check(res, name)["ok"] is None, name


def test_family_spelling_with_total(real: dict) -> None:
    exp = Expectations(required_families=["vllm:prefix_cache_hits_total", "vllm:kv_cache_usage_perc"])
    assert check(validate(summary(real), exp), "required_metric_families")["ok"] is True
    exp = Expectations(required_families=["vllm:kv_offload_load_bytes_total"])
    assert check(validate(summary(real), exp), "required_metric_families")["ok"] is False


# ---------------------------------------------------------------- window

def test_partial_window_fails_unless_not_required(real: dict) -> None:
    partial = sm.compute(parse_metrics(BEFORE, t=0), None, [parse_metrics(AFTER, t=5)])
    assert check(validate(summary(partial), Expectations()), "metrics_window")["ok"] is False
    res = validate(summary(partial), Expectations(require_complete_window=False))
    assert check(res, "metrics_window")["ok"] is None and res["verdict"] == "pass"


# ---------------------------------------------------------------- acceptance length

def test_acceptance_length_band(real: dict) -> None:
    al = real["spec_decode"]["acceptance_length"]
    assert al is not None  # the sample server ran ngram speculation
    for offset, ok in [(0.0, True), (0.04, True), (-0.04, True), (0.06, False), (-0.5, False)]:
        c = check(validate(summary(real), Expectations(synthetic_al=al + offset)),
                  "spec_decode_acceptance_length")
        assert c["ok"] is ok, offset
        assert c["measured"] == al
    wide = Expectations(synthetic_al=al + 0.3, al_tolerance=0.35)
    assert check(validate(summary(real), wide), "spec_decode_acceptance_length")["ok"] is True


def test_acceptance_length_without_drafts_or_counters_fails() -> None:
    idle = server_metrics(BEFORE, BEFORE)  # counters exposed, no draft in the window
    c = check(validate(summary(idle), Expectations(synthetic_al=2.5)), "spec_decode_acceptance_length")
    assert c["ok"] is False and "no speculative drafts" in c["reason"]
    no_spec = server_metrics(drop(BEFORE, "spec_decode"), drop(AFTER, "spec_decode"))
    c = check(validate(summary(no_spec), Expectations(synthetic_al=2.5)), "spec_decode_acceptance_length")
    assert c["ok"] is False and "no spec-decode counters" in c["reason"]


# ---------------------------------------------------------------- offload

OFFLOAD_HEAD = "# TYPE vllm:simple_kv_offload_load_blocks_total counter\n"


def with_offload(text: str, blocks: float) -> str:
    return text + OFFLOAD_HEAD + (
        f'vllm:simple_kv_offload_load_blocks_total{{engine="0",model_name="tiny",phase="completed"}} {blocks}\n')


@pytest.mark.parametrize("offload,exceeds,ok", [
    (False, True, None),   # no connector: not checked
    (True, None, None),    # unknown working set: skipped
    (True, False, None),   # fits in the pool: offload not required
    (True, True, False),   # sample server had no offload hits
])
def test_offload_check_on_sample(real: dict, offload: bool, exceeds: bool | None, ok: bool | None) -> None:
    exp = Expectations(offload_expected=offload, working_set_exceeds_pool=exceeds)
    assert check(validate(summary(real), exp), "offload_hits")["ok"] is ok


def test_offload_hits_pass() -> None:
    metrics = server_metrics(with_offload(BEFORE, 0), with_offload(AFTER, 12))
    exp = Expectations(offload_expected=True, working_set_exceeds_pool=True)
    c = check(validate(summary(metrics), exp), "offload_hits")
    assert c["ok"] is True and c["measured"]["simple_kv_offload_blocks_loaded"] == 12


def test_offload_without_any_signal_fails(real: dict) -> None:
    metrics = copy.deepcopy(real)
    metrics["offload"] = {"hits_observed": None, "loads": {}, "stores": {}}
    exp = Expectations(offload_expected=True, working_set_exceeds_pool=True)
    c = check(validate(summary(metrics), exp), "offload_hits")
    assert c["ok"] is False and "no offload" in c["reason"]


# ---------------------------------------------------------------- prefix hit rate

@pytest.mark.parametrize("achieved,theory,ok", [
    (0.90, 0.93, True),
    (0.83, 0.93, True),   # exactly 10 points
    (0.80, 0.93, False),
    (0.00, 0.93, False),  # cache off
])
def test_hit_rate_client(real: dict, achieved: float, theory: float, ok: bool) -> None:
    res = validate(summary(real, cache={"achieved_hit_rate": achieved}),
                   Expectations(theoretical_hit_rate=theory))
    c = check(res, "prefix_hit_rate")
    assert c["ok"] is ok and c["source"] == "client" and c["measured"] == achieved


def test_hit_rate_falls_back_to_server_then_skips(real: dict) -> None:
    server_rate = real["prefix_cache"]["hit_rate"]
    c = check(validate(summary(real), Expectations(theoretical_hit_rate=server_rate + 0.05)), "prefix_hit_rate")
    assert c["ok"] is True and c["source"] == "server" and c["measured"] == server_rate
    c = check(validate(summary(real), Expectations(theoretical_hit_rate=server_rate + 0.2)), "prefix_hit_rate")
    assert c["ok"] is False
    c = check(validate(summary(None), Expectations(theoretical_hit_rate=0.9)), "prefix_hit_rate")
    assert c["ok"] is None


# ---------------------------------------------------------------- thinking

@pytest.mark.parametrize("mode,reasoning,ok", [
    ("on", 1234, True),
    ("on", 0, False),
    ("off", 0, True),
    ("off", 17, False),
    ("on", None, None),
])
def test_thinking(real: dict, mode: str, reasoning: int | None, ok: bool | None) -> None:
    s = summary(real) if reasoning is None else summary(real, reasoning_tokens=reasoning)
    res = validate(s, Expectations(thinking=mode))
    assert check(res, "thinking_mode")["ok"] is ok
    assert res["verdict"] == ("fail" if ok is False else "pass")


def test_everything_expected_and_met() -> None:
    metrics = server_metrics(with_offload(BEFORE, 0), with_offload(AFTER, 3))
    al = metrics["spec_decode"]["acceptance_length"]
    exp = Expectations(max_error_rate=0.0, synthetic_al=round(al, 2), offload_expected=True,
                       working_set_exceeds_pool=True, theoretical_hit_rate=0.6, thinking="on",
                       golden={"file": "g.yaml", "model": "d", "thinking": "on", "k": 3,
                               "al": round(al, 2)})
    s = summary(metrics, cache={"achieved_hit_rate": 0.62}, reasoning_tokens=50)
    res = validate(s, exp)
    assert res["verdict"] == "pass", res["reasons"]
    assert res["skipped"] == ["load_delivered: closed loop: lanes send as the server answers"]
