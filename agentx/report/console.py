"""End-of-run console table: the numbers a performance engineer checks first."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..metrics.arrivals import arrivals_line
from ..metrics.catalog import DISTS
from ..metrics.concurrency import LANE, concurrency_line
from ..metrics.percentiles import pct_key, shown
from ..metrics.window import headline, not_steady_note
from ..rundir import RunDir
from .sessions import sessions_line
from .target import gpus_of, load_text, target_text

WIDE = 200  # columns when stdout is not a terminal: a file or a pipe gets whole numbers
THIN_P99 = 100  # a p99 from fewer values is flagged: it is the largest value or next to it
# the two rows a reader of other tools' tables does not know, said once under the table
GLOSSARY = ("TTFC: time to the first visible (non-reasoning) answer chunk; TTFT per 1k uncached: "
            "TTFT per 1,000 prompt tokens the server had to prefill (not prefix-cached); "
            "docs/metrics.md")


def make_console(stderr: bool = False) -> Console:
    """A rich Console that, writing to a pipe or a file (no terminal to size to), is wide
    enough that no table cell is cut to `14,4…`; on a terminal, the terminal's width."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = max(console.width, WIDE)
    return console


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"



def title(summary: dict) -> str:
    """`agentx — swe conc 8 — simulator h200-minimaxm3-fp8`: the workload and the target."""
    cfg = summary.get("config") or {}
    return (f"agentx — {cfg.get('trace') or '?'} {load_text(cfg, short=True)} — "
            f"{target_text(summary)}")


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or make_console()
    t = Table(title=title(summary))
    t.add_column("metric")
    pcts = shown(summary)  # --percentiles, else p50, p90, p99
    for c in ("n", "mean", *(f"p{q:g}" for q in pcts)):
        t.add_column(c, justify="right")
    thin = False
    for m in DISTS:  # the catalog's order
        d = summary.get(m.key) or {}
        n = d.get("count")
        flag = n is not None and 0 < n < THIN_P99
        thin |= flag and max(pcts) >= 99
        t.add_row(m.label, "-" if n is None else f"{n:,}", _f(d.get("mean")),
                  *(_f(d.get(pct_key(q))) + (" †" if flag and q >= 99 else "") for q in pcts))
    if thin:
        t.caption = (f"n: values per metric; † p99 or above of fewer than {THIN_P99} values "
                     "(near the maximum)")
    console.print(t)
    console.print(GLOSSARY, soft_wrap=True)
    for ln in summary_lines(summary):  # one line each: the terminal wraps, a pipe greps
        console.print(ln, soft_wrap=True)


def summary_lines(summary: dict, verdict: bool = True) -> list[str]:
    """The lines under the table: requests, window, throughput, cache, energy, goodput,
    errors, client, and (`verdict`) the validation (the HTML report shows the same)."""
    cache = summary["cache"]
    lines = [
        requests_line(summary),
        *concurrency_lines(summary),
        *throughput_lines(summary),
        cache_line(cache),
    ]
    if (summary.get("energy") or {}).get("source"):
        lines.append(energy_line(summary["energy"]))
    if summary.get("cost"):
        lines.append(cost_line(summary["cost"]))
    sessions = sessions_line(summary)
    if sessions:
        lines.append(sessions)
    lines[1:1] = window_lines(summary)
    if summary.get("arrivals"):  # open loop: offered vs achieved, the cap's waits
        lines.insert(1, arrivals_line(summary["arrivals"]))
    gp = summary.get("goodput")
    if gp:
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in gp["slo_ms"].items())
        met = ", ".join(f"{k} {_pct(v)}" for k, v in gp["met"].items())
        lines.append(f"goodput ({slo}): {_f(gp['requests_s'], 3)} req/s, "
                     f"{_f(gp['total_tok_s'])} tok/s, {_f(gp['output_tok_s'])} output tok/s; "
                     f"met (failed requests count as missed): {met}")
    if summary.get("errors"):
        lines.append("errors: " + ", ".join(f"{k}={v}" for k, v in summary["errors"].items()))
    sm = summary.get("server_metrics") or {}
    al = (sm.get("spec_decode") or {}).get("acceptance_length")
    if al:
        lines.append(f"spec decode: acceptance length {al:.3f}")
    cl = summary.get("client") or {}
    if cl.get("loop_lag_ms"):
        lines.append(f"client: loop lag p99 {_f(cl['loop_lag_ms'].get('p99'), 2)} ms, dispatch lag "
                     f"p99 {_f((cl.get('dispatch_lag_ms') or {}).get('p99'), 2)} ms, "
                     f"cpu {_pct(cl.get('cpu_util'))}")
    if summary.get("rebuilt"):
        lines.append(f"REBUILT from the records of a run that did not finish "
                     f"(stop: {summary.get('stop_reason')})")
    v = summary.get("validation")
    if v and verdict:
        lines.append(f"validation: {v['verdict']}" + (
            " — " + "; ".join(v["reasons"]) if v.get("reasons") else ""))
        lines.append(f"  {checked_text(v)}")
    return lines


def checked_text(v: dict) -> str:
    """What a verdict rests on: the checks that ran (passed or failed) by name, and how many
    were skipped (their reasons: summary.json validation.skipped), so `pass` is not taken
    for more than it checked."""
    ran = [c["name"] for c in v.get("checks") or [] if c.get("ok") is not None]
    skipped = len(v.get("skipped") or [])
    return (f"checked: {', '.join(ran) or 'nothing'}; {skipped} skipped (no input: "
            f"{RunDir.SUMMARY} validation.skipped)")


def requests_line(summary: dict) -> str:
    """What became of every request: the measured ones, then the warm-up's failures (by
    class) and cancellations, excluded from the statistics but not from sight, and the
    Retry-After waits."""
    wf, wc = summary.get("warmup_failed") or 0, summary.get("warmup_cancelled") or 0
    classes = ", ".join(f"{k}={v}" for k, v in (summary.get("warmup_errors") or {}).items())
    warm = (f"; {wf} failed" + (f": {classes}" if classes else "") if wf else "") + (
        f"; {wc} cancelled" if wc else "")
    line = (f"requests: {summary['completed']} completed, {summary['failed']} failed, "
            f"{summary['cancelled']} cancelled, {summary['warmup_requests']} warm-up "
            f"(excluded{warm})")
    if summary.get("retry_after_responses"):
        line += (f"; {summary['retry_after_responses']} answer(s) with Retry-After: lanes "
                 f"waited up to {summary['retry_after_s']:.1f} s in all")
    return line


def concurrency_lines(summary: dict) -> list[str]:
    """The load as configured beside the request concurrency it achieved, and (lanes) what a
    lane is: `--conc 8` is read as 8 requests in flight by users of other tools."""
    cfg = summary.get("config") or {}
    c = summary.get("concurrency")
    if not c:  # a summary written before the block existed
        return []
    lanes = not (cfg.get("session_rate") or cfg.get("arrivals") == "trace")
    return [concurrency_line(c, load_text(cfg))] + ([f"  lane: {LANE}"] if lanes else [])


def per_gpu_text(summary: dict, h: dict) -> str:
    """`per GPU: 1,234 tok/s (8 GPUs, simulator)`, or unknown: a GPU count never assumed."""
    n = gpus_of(summary)
    if not n or h.get("per_gpu_tok_s") is None:
        return "per GPU: unknown (give --gpus)"
    src = {"given": "--gpus", "simulator": "the simulator's TP"}.get(
        summary.get("gpus_source") or "given", "--gpus")
    return f"per GPU: {_f(h['per_gpu_tok_s'])} tok/s ({n} GPU{'s' if n > 1 else ''}, {src})"


def throughput_lines(summary: dict) -> list[str]:
    """The headline throughput, named so, with its cached-prompt share, per GPU and its
    one-line definition; then the other two, each labelled as not the headline and by the
    summary.json key it is stored under (docs/metrics.md#throughput)."""
    th = summary["throughput"]
    h = th.get("headline") or headline(th, gpus_of(summary))
    share = h.get("cached_share")
    cached = "" if share is None else f" ({_pct(share)} of it cached prompt)"
    out = [f"headline throughput: {_f(h['total_tok_s'])} tok/s total{cached}, "
           f"{_f(h['output_tok_s'])} output tok/s; {per_gpu_text(summary, h)}",
           f"  headline = {h['definition']} ({RunDir.SUMMARY} throughput.headline)"]
    if h["source"] == "delivered":
        out.append(f"  not the headline: measured requests only (sent in the window; the "
                   f"latency table's): {_f(th['total_tok_s'])} tok/s total, "
                   f"{_f(th['output_tok_s'])} output tok/s, {_f(th['requests_s'], 3)} req/s "
                   f"over {_f(th['window_s'])} s (throughput.total_tok_s)")
    else:
        out.append(f"  {_f(th['requests_s'], 3)} req/s over {_f(th['window_s'])} s")
    if th.get("server_total_tok_s") is not None:
        out.append(f"  not the headline: server's /metrics over the whole run, start-up "
                   f"included: {_f(th['server_total_tok_s'])} tok/s total, "
                   f"{_f(th['server_output_tok_s'])} output tok/s over "
                   f"{_f(th['server_window_s'])} s (throughput.server_total_tok_s)")
    return out


def cache_line(cache: dict) -> str:
    """Achieved hit rate beside the theory the validation used (the pool-aware one when the
    server's KV pool is known: GPU pool plus offload tier) and the infinite-cache figure, each
    labelled, so a low achieved rate next to a high infinite-cache one is not a contradiction."""
    line = f"prefix cache: achieved {_pct(cache.get('achieved_hit_rate'))}"
    pool = cache.get("kv_pool_tokens")
    if pool:
        off = cache.get("offload_tokens")
        sizes = f"GPU {pool:,} tok" + (f" + offload {off:,} tok" if off else "")
        line += (f"; pool-aware theory ({sizes}), used by validation: "
                 f"{_pct(cache.get('theoretical_hit_rate_pool'))}")
    theory = f"infinite-cache theory{'' if pool else ', used by validation'}: "
    return f"{line}; {theory}{_pct(cache.get('theoretical_hit_rate'))}"


def cost_line(c: dict) -> str:
    """`cost ($2.50/GPU-h x 8 GPUs, headline rate): $0.12 per M input tokens, ...`, or why
    there is no figure (a GPU count unknown is never taken for 1)."""
    head = f"cost (${c['gpu_hour_usd']:g}/GPU-h x {c.get('gpus') or '?'} GPUs"
    if c.get("unknown"):
        return f"{head}): unknown — {c['unknown']}"

    def usd(v: float | None) -> str:
        return "-" if v is None else f"${v:,.4g}"
    return (f"{head}, {c.get('throughput_source') or '?'} rate): "
            f"{usd(c.get('usd_per_m_input_tokens'))}/M input, "
            f"{usd(c.get('usd_per_m_output_tokens'))}/M output, "
            f"{usd(c.get('usd_per_m_total_tokens'))}/M total tokens; "
            f"{usd(c.get('usd_per_request'))}/request, {usd(c.get('usd_per_session'))}/session "
            "(docs/metrics.md, Cost)")


def energy_line(e: dict) -> str:
    """The measurement window's GPU energy (NVML) and what it buys, or why it is missing."""
    gpus = ",".join(map(str, e.get("gpus") or [])) or "-"
    how = ", ".join(sorted(set((e.get("method") or {}).values()))) or "-"
    if e.get("energy_j") is None:
        return f"energy (NVML, GPU {gpus}): - ({e.get('note') or 'no figure'})"
    return (f"energy (NVML, GPU {gpus}, {how}): {_f(e['energy_j'])} J over the window, "
            f"{_f(e.get('mean_power_w'))} W mean; {_f(e.get('j_per_output_token'), 3)} J/output "
            f"token, {_f(e.get('j_per_request'), 1)} J/request, "
            f"{_f(e.get('output_tokens_per_j'), 3)} output tok/J")


def window_lines(summary: dict) -> list[str]:
    """Where the measurement window sat, and a plain warning when it did not see the steady
    state."""
    win = summary.get("window")
    out = []
    if win:
        wu = "auto" if win["warmup"] == "auto" else f"{win['warmup']:g} s"
        out.append(f"window: +{_f(win['start_s'])} to +{_f(win['end_s'])} s (warm-up {wu}, "
                   f"ramp-up {win['ramp_up_s']:g} s); steady state: "
                   f"{'yes' if win['steady_state'] else 'NO'}")
    note = not_steady_note(win) if win else None
    if note:
        out.append(note)
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"
