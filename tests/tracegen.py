"""Small hand-made sessions in the native trace format, for tests (not real data)."""
from __future__ import annotations

import json
from pathlib import Path


def write_trace(path: Path, sessions: int = 6, turns: int = 8, think: float = 1.0,
                out: int = 20, subagent_at: int | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        reqs = []
        ids: list[int] = list(range(1, 40))
        for i in range(turns):
            ids = ids + list(range(1000 * (i + 1), 1000 * (i + 1) + 5))
            reqs.append({"t": float(i), "type": "n", "in": len(ids) * 64, "out": out,
                         "hash_ids": list(ids), "think_time": think, "api_time": 0.5})
            if subagent_at is not None and i == subagent_at:
                sub = [{"t": 0.0, "type": "n", "in": 3000 + 200 * j, "out": 10,
                        "hash_ids": list(range(1, 48 + 3 * j)), "think_time": 0.0}
                       for j in range(3)]
                reqs.append({"type": "subagent", "agent_id": f"a{s}", "t": float(i),
                             "system_tokens": 500, "tool_tokens": 1000, "requests": sub})
        doc = {"id": f"trace_{s:04d}", "block_size": 64, "system_tokens": 800,
               "tool_tokens": 1200, "requests": reqs}
        (path / f"trace_{s:04d}.json").write_text(json.dumps(doc))
    return path
