"""What a run measured, as one line for the console and every plot title: the `target` record
(written by agentx.targets.base.Target.identity) and the run's labels; the load it offered
(lanes or an arrival rate) and the GPUs its per-GPU figures divide by."""
from __future__ import annotations


def load_text(cfg: dict, short: bool = False) -> str:
    """The offered load as configured: `8 session lanes` (`conc 8` when `short`), or an
    open loop's `rate 0.5 sessions/s (cap 16)` / `trace arrivals x0.5`: an open-loop run's
    --conc is unused and never shown."""
    if cfg.get("session_rate"):
        cap = f", cap {cfg['max_active']}" if cfg.get("max_active") else ""
        return (f"rate {cfg['session_rate']:g}/s" if short
                else f"open loop, {cfg['session_rate']:g} sessions/s{cap}")
    if cfg.get("arrivals") == "trace":
        return f"trace arrivals x{cfg.get('time_scale') or 1:g}"
    conc = cfg.get("conc") or "?"
    return f"conc {conc}" if short else f"{conc} session lanes"


def gpus_of(summary: dict) -> int | None:
    """The GPUs a run's per-GPU figures divide by: as recorded (--gpus, the recipe point or
    the simulator's TP), None when unknown (never assumed 1)."""
    n = summary.get("gpus") or (summary.get("config") or {}).get("gpus")
    return n if isinstance(n, int) and n > 0 else None


def is_simulator(target: dict) -> bool:
    """The run measured agentx's simulator: `simulator` in its target record, or (a record
    written before 2026-12-03) `kind: simulator`."""
    return bool(target.get("simulator", target.get("kind") == "simulator"))


def target_text(summary: dict) -> str:
    """One line: `simulator h200-minimaxm3-fp8` or `MODEL at URL (vLLM 0.32.0)`, then the
    labels (`; recipe=..., point=...`)."""
    t = summary.get("target") or {}
    if is_simulator(t):  # its URL is a port picked at random: noise in a title
        what = f"simulator {t.get('profile') or ''}".strip()
    elif t:
        what = f"{t.get('model') or '?'} at {t.get('url') or '?'}" + (
            f" (vLLM {t['server_version']})" if t.get("server_version") else "")
    else:
        what = "target not recorded"
    labels = summary.get("labels") or {}
    return what + ("; " + ", ".join(f"{k}={v}" for k, v in labels.items()) if labels else "")
