"""What a run measured, named once: the embedded simulator and its profile, or a server's URL
(credentials removed), served model and version; the run's labels beside it. summary.json and
run.json carry it as `target` and `labels`; the console and every plot title show it."""
from __future__ import annotations

from .config import RunConfig
from .urls import redact_url


def target(cfg: RunConfig, base_url: str, embedded: bool, model: str, version: dict) -> dict:
    """`version` is client.http.server_version's: a served simulator (a sweep's or an A/B
    side's stand-in, `agentx serve-sim`) says so there, and is named as one."""
    sim = embedded or bool(version.get("simulator_profile"))
    return {"kind": "simulator" if sim else "server",
            "profile": cfg.sim.profile if embedded else version.get("simulator_profile"),
            "url": None if embedded else redact_url(base_url), "model": model,
            "server_version": version.get("version")}


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
