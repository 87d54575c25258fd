"""`agentx trace stats|gen`: look at a trace before replaying it; regenerate the built-in one."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..options import StrictModel, add_arguments, from_args, opt

_COLS = ("p10", "p50", "p90", "p99", "mean")
_LABELS = {"turns_per_session": "turns/session", "first_prompt_tokens": "first prompt",
           "last_prompt_tokens": "last prompt", "system_tokens": "system", "tool_tokens": "tools",
           "input_growth_tokens": "growth/turn >0", "output_tokens": "output/turn",
           "think_time_s": "think s", "api_time_s": "api s",
           "subagents_per_session": "subagents/sess", "prefix_hit_rate": "hit in-session",
           "turns_per_subagent": "turns/subagent"}


class StatsOptions(StrictModel):
    trace: str = opt("", "built-in name (swe) or a file, directory or archive in a format "
                     "agentx reads (Weka JSON, Mooncake, AIPerf multi-turn or Bailian JSONL, "
                     "OTel GenAI spans; docs/traces.md)", positional=True, metavar="NAME|PATH", min_length=1)
    as_json: bool = opt(False, "print the statistics as JSON", flag="json")
    lru_capacity: int | None = opt(None, "also the hit rate of one LRU cache of this many "
                                   "tokens, the whole set replayed one session after another "
                                   "(slow on big sets: ~10 s per 70 M blocks)", gt=0,
                                   metavar="TOKENS")


class GenOptions(StrictModel):
    seed: int | None = opt(None, "default: the shipped trace's seed")
    sessions: int | None = opt(None, "default: the shipped trace's session count", gt=0)
    output_file: str | None = opt(None, "default: traces/swe.tar.xz in the repo",
                                  old=("--out",), metavar="PATH")
    full_hash_ids: bool = opt(False, "write hash_ids on every turn (for tools without the "
                              "fallback rule; ~4x slower to load)")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    tsub = p.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser("stats", help="shape statistics and theoretical prefix-cache hit rates")
    add_arguments(s, StatsOptions)
    s.set_defaults(func=stats_main)
    g = tsub.add_parser("gen", help="regenerate the built-in swe trace (seeded, byte-identical)")
    add_arguments(g, GenOptions)
    g.set_defaults(func=gen_main)


def stats_main(args: argparse.Namespace) -> int:
    from ..trace.load import load_traces
    from ..trace.shape import trace_stats

    o = from_args(args, StatsOptions)
    st = trace_stats(load_traces(o.trace), o.lru_capacity)
    if o.as_json:
        sys.stdout.write(orjson.dumps(st, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_stats(st)
    return 0


def gen_main(args: argparse.Namespace) -> int:
    from ..trace.generate import SWE_SEED, SWE_SESSIONS, write_swe
    from ..trace.load import builtin_path

    o = from_args(args, GenOptions)
    out = Path(o.output_file) if o.output_file else builtin_path("swe")
    path = write_swe(out, SWE_SEED if o.seed is None else o.seed,
                     SWE_SESSIONS if o.sessions is None else o.sessions,
                     full_hash_ids=o.full_hash_ids)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def print_stats(st: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"trace {st['name']}: {st['sessions']:,} sessions, {st['turns']:,} turns, "
                    f"{st['subagents']:,} subagents ({st['subagent_turns']:,} turns), "
                    f"block {st['block_size']}", box=box.SIMPLE_HEAD)
    t.add_column("tokens unless noted", no_wrap=True)
    for c in ("count", *_COLS):
        t.add_column(c, justify="right", no_wrap=True)
    for prefix, group in (("", st["parent"]), ("sub ", st["subagent"])):
        for key, d in group.items():
            t.add_row(prefix + _LABELS.get(key, key), f"{d['count']:,}",
                      *(_fmt(key, d.get(c)) for c in _COLS))
    console.print(t)
    hit = st["parent"]["prefix_hit_rate"]["mean"]
    lines = [(f"context compaction (prompt shrinks): {st['compaction_turns']:,} turns = "
              f"{100 * st['compaction_turn_fraction']:.2f}% of turn transitions"),
             (f"subagents: {st['subagents_per_session']:.3f} per session, "
              f"{st['subagents_per_100_turns']:.3f} per 100 turns"),
             (f"theoretical prefix-cache hit rate, infinite in-session cache: "
              f"{100 * st['prefix_hit_rate_overall']:.1f}% token-weighted"
              f" (per-session mean {_fmt('prefix_hit_rate', hit)})")]
    if st.get("formats"):
        lines.append(f"format: {', '.join(st['formats'])} (docs/traces.md)")
    if st.get("lru"):
        lines.append(f"LRU cache of {st['lru']['capacity_tokens']:,} tokens, sessions replayed "
                     f"one after another: {100 * st['lru']['hit_rate']:.1f}%")
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False)


def _fmt(key: str, v: float | None) -> str:
    """Compact but unambiguous: 248.8k tokens, 1.23M, 95.6%, 2,134 s."""
    if v is None:
        return "-"
    if key.endswith("hit_rate"):
        return f"{100 * v:.1f}%"
    if key.endswith("_s"):
        return f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.1f}k"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"
