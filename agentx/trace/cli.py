"""`agentx trace stats|gen`: look at a trace before replaying it; regenerate the built-in one."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="trace statistics and the built-in trace generator")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser("stats", help="shape statistics and theoretical prefix-cache hit rates")
    s.add_argument("trace", help="built-in name (swe) or path")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.add_argument("--lru-capacity", type=int, default=None, metavar="TOKENS",
                   help="also the hit rate of one LRU cache of this many tokens")
    s.set_defaults(func=stats_main)
    g = tsub.add_parser("gen", help="regenerate the built-in swe trace (seeded, byte-identical)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--sessions", type=int, default=None)
    g.add_argument("--out", default=None, help="default: traces/swe.tar.xz in the repo")
    g.set_defaults(func=gen_main)


def stats_main(args: argparse.Namespace) -> int:
    from .load import load_traces
    from .stats import trace_stats

    st = trace_stats(load_traces(args.trace), args.lru_capacity)
    if args.json:
        sys.stdout.write(orjson.dumps(st, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_stats(st)
    return 0


def gen_main(args: argparse.Namespace) -> int:
    from .generate import SWE_SEED, SWE_SESSIONS, write_swe
    from .load import builtin_path

    out = Path(args.out) if args.out else builtin_path("swe")
    path = write_swe(out, SWE_SEED if args.seed is None else args.seed,
                     SWE_SESSIONS if args.sessions is None else args.sessions)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def print_stats(st: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"trace {st['name']}: {st['sessions']} sessions, {st['turns']} turns, "
                    f"{st['subagents']} subagents (block {st['block_size']})")
    t.add_column("per parent session / turn")
    for c in ("p10", "p50", "p90", "p99", "mean"):
        t.add_column(c, justify="right")
    for key, d in st["parent"].items():
        t.add_row(key, *(_fmt(d.get(c)) for c in ("p10", "p50", "p90", "p99", "mean")))
    for key, d in st["subagent"].items():
        t.add_row(f"subagent {key}", *(_fmt(d.get(c)) for c in ("p10", "p50", "p90", "p99",
                                                                  "mean")))
    console.print(t)
    console.print(f"context compaction: {st['compaction_turns']} turns "
                  f"({100 * st['compaction_turn_fraction']:.2f}% of turn transitions); "
                  f"subagents: {st['subagents_per_session']:.3f} per session, "
                  f"{st['subagents_per_100_turns']:.3f} per 100 turns")
    console.print(f"theoretical prefix-cache hit rate, infinite in-session cache: "
                  f"{100 * st['prefix_hit_rate_overall']:.1f}% (token-weighted)")
    if st.get("lru"):
        console.print(f"LRU cache of {st['lru']['capacity_tokens']:,} tokens: "
                      f"{100 * st['lru']['hit_rate']:.1f}%")


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"
