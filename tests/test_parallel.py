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
