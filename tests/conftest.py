"""Shared fixtures and the one place that knows where the test data lives (tests/data)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers: vllm_env, helpers

pytest_plugins = ["vllm_env.fixtures"]  # real-vLLM fixtures (tests/vllm_env)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"  # sources and licences: tests/data/NOTICE
SAMPLES = DATA / "vllm-samples"  # captured vLLM 0.32 responses and /metrics pages
REAL_TRACES = DATA / "traces" / "claude-code-traces.tar.xz"  # 533 real Claude Code sessions
H200_RUNS = DATA / "h200-runs"  # agentx runs against vLLM 0.24 on one H200


@pytest.fixture(scope="session")
def real_stats() -> dict:
    """`trace_stats` of the 533 real sessions, computed once per test run."""
    from agentx.trace.load import load_traces
    from agentx.trace.stats import trace_stats

    return trace_stats(load_traces(str(REAL_TRACES)))


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return SAMPLES
