"""Shared fixtures: paths to ../shared (read in place, never copied)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers: vllm_env, tracegen

pytest_plugins = ["vllm_env.fixtures"]  # real-vLLM fixtures (tests/vllm_env)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SAMPLES = SHARED / "vllm-samples"
REAL_TRACES = SHARED / "traces" / "claude-code-traces.tar.xz"


@pytest.fixture(scope="session")
def real_stats() -> dict:
    """`trace_stats` of the 533 real sessions, computed once per test run."""
    if not REAL_TRACES.is_file():
        pytest.skip("../shared/traces/claude-code-traces.tar.xz not present")
    from agentx.trace.load import load_traces
    from agentx.trace.stats import trace_stats

    return trace_stats(load_traces(str(REAL_TRACES)))


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip("../shared/vllm-samples not present")
    return SAMPLES
