"""Cost: `--gpu-hour-usd` turns a run's throughput into dollars per million tokens, per request
and per session (docs/metrics.md#cost-2026-12-03).

The GPU time of the window is priced at `gpu_hour_usd` x GPUs; the GPU count is the target's
(`--gpus`, a recipe point's tp x dp, or what the target records). When it is unknown the cost
is unknown and says so: assuming one GPU would understate an 8-GPU server's cost 8 times.
Rates are the run's headline throughput (metrics.window.headline). Each $ per million figure
charges the whole GPU time to that kind of token (input, output, or both), as a price sheet
quotes them, so the input and output figures do not add up; per request and per session the
GPU time is shared out by tokens (prompt + output), so a session's cost is its tokens times
the $ per total token.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..options import StrictModel, opt

DEFINITION = ("GPU $/s = gpu_hour_usd x gpus / 3600 over the headline rate; per M input / "
              "output / total tokens: all GPU time charged to that kind; per request and "
              "per session: GPU time shared by tokens (prompt + output)")
COLUMNS = ("gpu_hour_usd", "usd_per_m_input_tokens", "usd_per_m_output_tokens",
           "usd_per_m_total_tokens", "usd_per_request", "usd_per_session")


class CostOption(StrictModel):
    """The option, declared once; run (and with it a recipe's `run:`), sweep and report
    inherit it."""

    gpu_hour_usd: float | None = opt(
        None, "price of one GPU-hour in USD: the summary, runs.csv and reports add $ per "
        "million input / output / total tokens, per request and per session, with the GPU "
        "count from the target (--gpus or the recipe point); unknown when that count is",
        ge=0.0, metavar="USD")


def gpu_count(summary: Mapping) -> int | None:
    """The GPUs behind the run's server, where the run recorded them (summary `gpus`: --gpus,
    the recipe point or the simulator's TP; older runs: the config, the target's own record);
    None when nothing says."""
    for v in (summary.get("gpus"), (summary.get("config") or {}).get("gpus"),
              (summary.get("target") or {}).get("gpus")):
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def cost_block(summary: Mapping, gpu_hour_usd: float | None,
               gpus_given: int | None = None) -> dict | None:
    """summary.json `cost` (None without a price): the price, the GPU count and the $ figures,
    or `unknown` saying why they are missing. `gpus_given` (`agentx report --gpus`) counts
    only for a run that recorded none."""
    if gpu_hour_usd is None:
        return None
    gpus = gpu_count(summary) or gpus_given
    th = summary.get("throughput") or {}
    h = th.get("headline") or {}
    total, out = h.get("total_tok_s"), h.get("output_tok_s")
    out_block: dict = {"gpu_hour_usd": gpu_hour_usd, "gpus": gpus,
                       "throughput_source": h.get("source"), "definition": DEFINITION,
                       **{k: None for k in COLUMNS[1:]}, "unknown": None}
    if gpus is None:
        out_block["unknown"] = "GPU count unknown (give --gpus): cost not computed"
        return out_block
    if not total or out is None:
        out_block["unknown"] = "no throughput: nothing completed in the window"
        return out_block
    usd_s = gpu_hour_usd * gpus / 3600.0
    inp = total - out
    per_tok = usd_s / total
    meas = summary.get("completed") or 0
    tokens = summary.get("tokens") or {}
    sess = (summary.get("per_session") or {})
    sess_tok = [((sess.get(k) or {}).get("mean")) for k in ("input_tokens", "output_tokens")]
    out_block.update({
        "usd_per_hour": usd_s * 3600.0,
        "usd_per_m_total_tokens": per_tok * 1e6,
        "usd_per_m_output_tokens": usd_s / out * 1e6 if out else None,
        "usd_per_m_input_tokens": usd_s / inp * 1e6 if inp > 0 else None,
        "usd_per_request": per_tok * ((tokens.get("input") or 0) + (tokens.get("output") or 0))
        / meas if meas else None,
        "usd_per_session": per_tok * (sess_tok[0] + sess_tok[1])
        if None not in sess_tok else None,
    })
    return out_block


def cost_columns(summary: Mapping) -> dict:
    """runs.csv's cost columns of one run (empty without a price or when unknown)."""
    c = summary.get("cost") or {}
    return {k: c.get(k) for k in COLUMNS}
