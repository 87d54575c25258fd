"""What a run measured, as one line for the console and every plot title: the `target` record
(written by agentx.targets.base.Target.identity) and the run's labels."""
from __future__ import annotations


def target_text(summary: dict) -> str:
    """One line: `simulator h200-minimaxm3-fp8` or `MODEL at URL (vLLM 0.32.0)`, then the
    labels (`; recipe=..., point=...`)."""
    t = summary.get("target") or {}
    if t.get("kind") == "simulator":
        what = f"simulator {t.get('profile') or ''}".strip() + (
            f" at {t['url']}" if t.get("url") else "")
    elif t:
        what = f"{t.get('model') or '?'} at {t.get('url') or '?'}" + (
            f" (vLLM {t['server_version']})" if t.get("server_version") else "")
    else:
        what = "target not recorded"
    labels = summary.get("labels") or {}
    return what + ("; " + ", ".join(f"{k}={v}" for k, v in labels.items()) if labels else "")
