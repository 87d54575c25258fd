"""Shared fixtures and the one place that knows where the test data lives (tests/data)."""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers: vllm_env, helpers

pytest_plugins = ["vllm_env.fixtures",  # real-vLLM fixtures (tests/vllm_env)
                  "parallel"]  # `pytest -n auto`: `alone` tests, the vllm group (tests/parallel.py)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"  # sources and licences: tests/data/NOTICE
SAMPLES = DATA / "vllm-samples"  # captured vLLM 0.32 responses and /metrics pages
REAL_TRACES = DATA / "traces" / "claude-code-traces.tar.xz"  # 533 real Claude Code sessions
H200_RUNS = DATA / "h200-runs"  # agentx runs against vLLM 0.24 on one H200


@pytest.fixture(scope="session")
def real_stats() -> dict:
    """`trace_stats` of the 533 real sessions, computed once per test run."""
    from agentx.trace.load import load_traces
    from agentx.trace.shape import trace_stats

    return trace_stats(load_traces(str(REAL_TRACES)))


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return SAMPLES


@dataclass
class CliResult:
    """What a shell would see of one `agentx` command: exit code and the two streams."""
    returncode: int
    stdout: str
    stderr: str


_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE")
                 if hasattr(signal, n))


@pytest.fixture
def cli(capfd: pytest.CaptureFixture[str]) -> Iterator[Callable[..., CliResult]]:
    """Run `agentx ARGS` in this process (`agentx.cli.main`), ~1 s cheaper than a subprocess.

    For tests whose subject is the command's behaviour, not a separate process (signals,
    kills, interpreter start-up keep their subprocess). Each call captures file-descriptor
    output (so logging and child processes are caught too) and returns a CliResult; whatever
    a command leaves behind in the process (environment, working directory, signal handlers,
    logging handlers and levels, switch interval, gc state) is put back afterwards.
    """
    from agentx.cli import main

    env, cwd, switch = dict(os.environ), os.getcwd(), sys.getswitchinterval()
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    loggers = {name: (lg.handlers[:], lg.level, lg.propagate) for name, lg in
               [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
               if isinstance(lg, logging.Logger)}

    def run(*args: object) -> CliResult:
        capfd.readouterr()  # drop anything printed before
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse errors and --help exit as a process would
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
        out, err = capfd.readouterr()
        return CliResult(int(code or 0), out, err)

    try:
        yield run
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.setswitchinterval(switch)
        if not gc.isenabled():
            gc.enable()
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for name, lg in list(logging.Logger.manager.loggerDict.items()) + [("", None)]:
            logger = logging.getLogger() if name == "" else lg
            if not isinstance(logger, logging.Logger):
                continue
            hs, level, propagate = loggers.get(name, ([], logging.NOTSET, True))
            for h in logger.handlers[:]:
                if h not in hs:
                    logger.removeHandler(h)
            logger.setLevel(level)
            logger.propagate = propagate
