"""Acceptance against real vLLM: `agentx sweep tiny-cpu` launches the CPU server once for the
point and runs conc 1, 2 and 4 end to end, one directory per cell, then runs.csv."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def test_agentx_sweep_tiny_cpu_real_vllm(tmp_path, vllm_python, vllm_assets, vllm_servers):
    vllm_servers.stop()  # one vLLM at a time on this machine
    env = {**os.environ, "AGENTX_TINY_ASSETS": str(vllm_assets.root),
           "AGENTX_VLLM_PYTHON": str(vllm_python)}
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "agentx.cli", "sweep", "tiny-cpu",
                           "--duration", "6", "--set", "drain_timeout_s=20",
                           # 6 s cells may decide nothing: warn keeps the exit code 0 (strict: 3)
                           "--set", "validation=warn", "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((out / "sweep.json").read_text())
    assert record["kind"] == "vllm"
    assert [(c["conc"], c["status"]) for c in record["cells"]] == \
        [(1, "ok"), (2, "ok"), (4, "ok")]
    # vLLM serves /reset_prefix_cache only in dev mode: recorded, not an error
    assert {c["reset_prefix_cache"] for c in record["cells"]} <= {"reset", "not available"}
    for conc in (1, 2, 4):
        s = json.loads((out / "p0-tp1" / f"c{conc}" / "summary.json").read_text())
        assert s["completed"] > 0 and s["failed"] == 0
        assert (s["conc"], s["framework"], s["spec_decoding"], s["hw"]) == \
            (conc, "vllm", "eagle3", "cpu")
        assert s["kv_cache_pool_tokens"] and s["run"]["model"] == "tiny"
        assert s["request_metrics"]["throughput"]["per_gpu"]["total_tput_tps"] > 0
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["conc"]) for r in rows) == [1, 2, 4]
    assert (out / "pareto.png").is_file()
    assert "eagle3" in (out / "p0-tp1" / "server" / "command.sh").read_text()
