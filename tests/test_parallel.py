"""tests/parallel.py: the lock that lets `alone` tests run with nothing beside them, and the
rule that keeps the vllm tests on one worker."""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from parallel import SharedOrAlone, _is_vllm_file, unit_of


def _hold(name: str, directory: str, alone: bool, seconds: float, go: float, log) -> None:
    time.sleep(max(0.0, go - time.time()))
    asked = time.monotonic()
    with SharedOrAlone(Path(directory)).hold(alone):
        got = time.monotonic()
        time.sleep(seconds)
        log.put((name, asked, got, time.monotonic()))


def _run(tmp_path: Path, plan: list[tuple[str, bool, float, float]]) -> dict[str, tuple]:
    ctx = mp.get_context("spawn")
    log = ctx.Queue()
    t0 = time.time() + 3.0  # every process started (spawn) before the first asks
    procs = {name: ctx.Process(target=_hold,
                               args=(name, str(tmp_path), alone, secs, t0 + after, log))
             for name, alone, secs, after in plan}
    for p in procs.values():
        p.start()
    rows = [log.get(timeout=30) for _ in procs]
    for p in procs.values():
        p.join(10)
    return {name: (name, asked, got, left) for name, asked, got, left in rows}


def test_shared_holders_overlap(tmp_path):
    r = _run(tmp_path, [("s1", False, 0.6, 0.0), ("s2", False, 0.6, 0.1)])
    assert r["s2"][2] < r["s1"][3]  # the second took the lock while the first still held it


def test_alone_waits_for_running_tests_and_blocks_later_ones(tmp_path):
    """A shared holder runs; an `alone` test asks, then another shared test: the alone test
    starts once the first ends, and the late shared test only after the alone one (the lock
    prefers the exclusive side, so a stream of short tests cannot starve it)."""
    r = _run(tmp_path, [("s1", False, 0.8, 0.0), ("a", True, 0.5, 0.2),
                        ("s2", False, 0.2, 0.4)])
    assert r["a"][2] >= r["s1"][3] - 0.01
    assert r["s2"][2] >= r["a"][3] - 0.01


def test_vllm_tests_are_grouped_by_file_name():
    assert _is_vllm_file("tests/test_vllm_smoke.py::test_models_lists_tiny")
    assert _is_vllm_file("tests/test_vllm_replay.py::test_x[eagle3]")
    assert not _is_vllm_file("tests/test_client_stream.py::test_vllm_stream_parsed_exactly[1]")
    assert not _is_vllm_file("tests/test_sim_api.py::test_metrics_families_match_vllm")


def test_a_module_fixtures_tests_are_one_unit_and_the_vllm_files_another():
    """The scheduler's units: a file's tests that share a module fixture (as the workers
    found them at collection) go to one worker, so the fixture is built once."""
    units = {"tests/test_wheel.py::test_a": "test_wheel.py",
             "tests/test_wheel.py::test_b": "test_wheel.py"}
    assert unit_of("tests/test_wheel.py::test_a", units) == unit_of("tests/test_wheel.py::test_b", units)
    assert unit_of("tests/test_ab.py::test_c", units) == "tests/test_ab.py::test_c"
    assert unit_of("tests/test_vllm_smoke.py::test_d", units) == unit_of("tests/test_vllm_replay.py::test_e", {})


INNER = '''
import time
from pathlib import Path

import pytest

OUT = Path(__file__).parent


def _stamp(name: str) -> None:
    with open(OUT / "log.txt", "a") as f:
        f.write(f"{name} {time.time()}\\n")


def test_busy_beside():
    _stamp("busy-start")
    time.sleep(2.0)
    _stamp("busy-end")


def test_fails_once_beside_others():
    _stamp("flaky")
    if not (OUT / "flaky.once").exists():
        (OUT / "flaky.once").write_text("")
        time.sleep(0.3)  # the busy test is running: this run is beside it
        assert 1 == 2, "late by the others' load"


def test_always_fails():
    _stamp("broken")
    assert False, "a real bug"


@pytest.mark.alone
def test_alone_fails_once():
    _stamp("alone")
    assert False, "already alone"
'''


def test_a_test_that_fails_beside_others_runs_again_alone(tmp_path):
    """An inner suite on 2 workers: a test that fails once while another runs is run again
    alone (after the other ended) and passes; one that fails every time fails and is listed
    as failed alone too; an `alone` test runs once. The end of the run names both reruns."""
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "pytest_plugins = ['parallel']\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: x\n    vllm: x\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
                          "-q", "test_inner.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "2 failed, 2 passed" in text, text
    log = [line.split() for line in (tmp_path / "log.txt").read_text().splitlines()]
    when = {}
    for name, t in log:
        when.setdefault(name, []).append(float(t))
    assert len(when["flaky"]) == 2 and len(when["broken"]) == 2 and len(when["alone"]) == 1
    assert when["flaky"][1] >= when["busy-end"][0]  # the rerun waited for the busy test
    summary = text.split("run again alone", 1)[1].split("short test summary", 1)[0]
    assert "passed alone: test_inner.py::test_fails_once_beside_others" in summary, text
    assert "beside others: call: AssertionError: late by the others' load" in summary, text
    assert "failed alone: test_inner.py::test_always_fails" in summary, text
    assert "test_alone_fails_once" not in summary
