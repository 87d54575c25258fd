"""The suite on several workers (`pytest -n auto`, pytest-xdist) without disturbing timing.

Most tests wait on the clock (simulated runs in real time, server start-ups, process kills), so
the suite runs on two workers more than the machine has cores. These rules keep that honest:

- tests marked `alone` measure timing that only an idle machine keeps (the client's own
  delay, TTFT agreement with the server, an SLO search against a TTFT bound): each runs
  with no other test beside it. Every test holds a shared lock while it runs (set-up, call,
  tear-down), an `alone` test an exclusive one. The lock prefers the exclusive side: once an
  `alone` test asks, no new test starts, so it waits only for the tests already running;
- the `vllm` tests (files tests/test_vllm_*.py) are one unit of work: one worker runs them in
  server order (one server alive at a time, each kind started once: tests/vllm_env/fixtures.py)
  while the others run the rest. Being the largest unit, the scheduler hands it out first;
- a `vllm` test waits for the vLLM venv (built in the background by .ci/run) before it takes
  the shared lock, so an `alone` test never waits on a pip install;
- the tests of a file that share a module-scoped fixture (a built wheel, a rendered report,
  50 real sessions loaded) are one unit of work too, so the fixture is built once, not once
  on every worker that draws one of them (the wheel was built twice, 110 s each). An `alone`
  test stays a unit of its own, run last: inside a unit it would start early and wait for the
  vllm worker's current test while every other worker idles. Workers know the fixtures, the
  scheduler only node ids: the workers write each test's unit to a file the scheduler reads.
- a test that fails beside other tests runs once more, alone (the exclusive lock), and that run
  is its result: on 2 cores with 4 workers and servers starting beside it, a test that waits on
  the clock can miss by the other tests' load (CI saw one such failure in about every other
  run of the suite, each time in another test, each passing alone). A test that fails alone
  fails; an `alone` test, already alone, is never run again. The end of the run lists every test
  that passed only alone, with its first failure, so a load-sensitive test stays visible.

Without `-n` nothing here does anything: the suite runs in order in one process.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

VLLM_GROUP = "vllm"
VLLM_FILES = "test_vllm_"
UNITS_ENV = "AGENTX_PYTEST_UNITS"  # the file the workers write {nodeid: unit} to


class SharedOrAlone:
    """A readers-writer lock across processes, writer-preferring, from two flock(2) files.

    A reader passes the gate (shared, for an instant) and then holds the room shared; a
    writer holds the gate exclusively while it waits for the room and runs, so readers queue
    at the gate behind it.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._gate = os.open(directory / "gate.lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._room = os.open(directory / "room.lock", os.O_RDWR | os.O_CREAT, 0o644)

    @contextmanager
    def hold(self, alone: bool) -> Iterator[None]:
        if alone:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            fcntl.flock(self._room, fcntl.LOCK_EX)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)
            fcntl.flock(self._room, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)


_LOCK: list[SharedOrAlone] = []
_VENV_WAITED: list[bool] = []


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: open the session's lock (one directory per test run). On the
    controller of `-n`: name the units file (the workers, started later, inherit it)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        run = workerinput.get("testrunuid", "local")
        _LOCK.append(SharedOrAlone(Path(tempfile.gettempdir()) / f"agentx-pytest-{run}"))
    elif getattr(config.option, "numprocesses", None):
        fd, path = tempfile.mkstemp(prefix="agentx-pytest-units-", suffix=".json")
        os.close(fd)
        os.environ[UNITS_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    """On the controller: remove the units file."""
    if getattr(config, "workerinput", None) is None and os.environ.get(UNITS_ENV):
        Path(os.environ.pop(UNITS_ENV)).unlink(missing_ok=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers more than cores (the suite mostly waits on the clock: at 3 workers
    on 2 cores it used 1,216 CPU-s in 1,149 s of wall, 2026-12-03; the tests that measure
    timing run `alone`)."""
    return (os.cpu_count() or 1) + 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every `vllm` test lives in a tests/test_vllm_*.py file (the scheduler groups them by
    name); on workers, the `slow` tests come first, so that no long test starts near the end,
    and the `alone` ones last, when the vllm worker (whose tests hold the lock for up to a
    minute each, a server start included) is done: first, they waited on it and held up
    everyone else for 5 minutes."""
    for item in items:
        if item.get_closest_marker("vllm") is not None and not _is_vllm_file(item.nodeid):
            raise pytest.UsageError(f"{item.nodeid}: a `vllm` test must live in a "
                                    f"{VLLM_FILES}*.py file (tests/parallel.py groups them)")
    if getattr(config, "workerinput", None) is not None:
        units = {item.nodeid: str(item.path.name) for item in items if _shares_module_fixture(item)}
        if os.environ.get(UNITS_ENV):
            tmp = f"{os.environ[UNITS_ENV]}.{os.getpid()}"
            Path(tmp).write_text(json.dumps(units))
            os.replace(tmp, os.environ[UNITS_ENV])  # whole, whichever worker writes last
        items.sort(key=lambda item: (item.get_closest_marker("alone") is not None,  # stable
                                     item.get_closest_marker("slow") is None))


def _is_vllm_file(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith(VLLM_FILES)


def _shares_module_fixture(item: pytest.Item) -> bool:
    """A test outside the vllm files, not `alone`, that uses a module-scoped fixture."""
    if _is_vllm_file(item.nodeid) or item.get_closest_marker("alone") is not None:
        return False
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module"
                                    for defs in info.name2fixturedefs.values())


def unit_of(nodeid: str, units: dict[str, str]) -> str:
    """The unit of work a test belongs to: the vllm group, its file when it shares a module
    fixture (`units`, from the workers), or else the test alone."""
    return VLLM_GROUP if _is_vllm_file(nodeid) else units.get(nodeid, nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Load scheduling in units of work (`unit_of`): the `vllm` tests (one worker, in the
    server order of tests/vllm_env/fixtures.py), handed out first as the largest, and each
    file's tests that share a module fixture. (xdist's own `--dist loadgroup` marks do not
    group anything with pytest 9.2 / xdist 3.8: it renames `item._nodeid`, which pytest 9 no
    longer reads.)"""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    units: dict[str, str] = {}

    class VllmFirst(OrderedDict):
        """The work queue (units by size, largest first) with the vllm group at its head even
        when a file's unit holds more tests: it is the longest unit by far."""

        def __setitem__(self, key, value) -> None:
            super().__setitem__(key, value)
            if key == VLLM_GROUP:
                self.move_to_end(key, last=False)

    class VllmGroupScheduling(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self.workqueue = VllmFirst()

        def _split_scope(self, nodeid: str) -> str:
            if not units and os.environ.get(UNITS_ENV):  # written before any collection is in
                units.update(json.loads(Path(os.environ[UNITS_ENV]).read_text() or "{}"))
            return unit_of(nodeid, units)

    return VllmGroupScheduling(config, log)


RERUN_ALONE = "failed beside other tests"  # the user property a rerun's reports carry
_RERUNS: list[tuple[str, str, str]] = []  # on the controller: (nodeid, first failure, outcome)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """On an xdist worker: the test under the shared (or, `alone`, the exclusive) lock; a test
    that failed under the shared lock runs again under the exclusive one, and only that run's
    reports are logged (pytest's own protocol, as pytest-rerunfailures drives it)."""
    if not _LOCK:
        return None  # pytest's protocol
    from _pytest.runner import runtestprotocol

    if item.get_closest_marker("vllm") is not None and not _VENV_WAITED:
        _VENV_WAITED.append(True)
        _wait_for_vllm_venv()
    alone = item.get_closest_marker("alone") is not None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    with _LOCK[0].hold(alone=alone):
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    failed = [r for r in reports if r.failed]
    if failed and not alone and not item.session.shouldstop:
        item.user_properties.append((RERUN_ALONE, _first_line(failed[0])))
        with _LOCK[0].hold(alone=True):
            reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _first_line(report: pytest.TestReport) -> str:
    """The failure's own message (`assert ...`), or else the first line of its report."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else report.longreprtext
    lines = [line for line in str(text).splitlines() if line.strip()]
    return f"{report.when}: {lines[0] if lines else '?'}"[:300]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller: remember a test that ran again alone, and how that run ended."""
    first = dict(report.user_properties).get(RERUN_ALONE)
    if first is None or (report.when != "call" and not report.failed):
        return  # the call's outcome, or a failed set-up or tear-down, says how it ended
    _RERUNS[:] = [r for r in _RERUNS if r[0] != report.nodeid]
    _RERUNS.append((report.nodeid, first, report.outcome))


def pytest_terminal_summary(terminalreporter) -> None:
    """List the tests that failed beside other tests and ran again alone."""
    if getattr(terminalreporter.config, "workerinput", None) is not None or not _RERUNS:
        return
    terminalreporter.section("run again alone (failed beside other tests: tests/parallel.py)")
    for nodeid, first, outcome in _RERUNS:
        terminalreporter.line(f"{outcome} alone: {nodeid}")
        terminalreporter.line(f"    beside others: {first}")


def _wait_for_vllm_venv() -> None:
    """Block until the vLLM venv exists (or fails to build: the fixture reports that)."""
    from vllm_env.venv import VenvBuildError, ensure_vllm_venv

    try:
        ensure_vllm_venv()
    except VenvBuildError:
        pass
