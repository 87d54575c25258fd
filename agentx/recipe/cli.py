"""`agentx recipe list|render` and `agentx serve`: a recipe as a pasteable command, or launched."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from ..errors import InputError
from ..yamlconf import load_value
from .load import line_in, load_recipe, recipe_names, recipes_dir


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recipe", help="list recipes or render one as a vllm serve command",
                       description=__doc__)
    rsub = p.add_subparsers(dest="recipe_command", required=True)
    ls = rsub.add_parser("list", help="the shipped recipes")
    ls.set_defaults(func=_list)
    r = rsub.add_parser("render", help="print the exact server command, environment, generated "
                        "files and DRAM arithmetic of one operating point")
    _point_args(r, default_port=8000)
    r.add_argument("--host-dram-mib", type=int, default=None, metavar="N",
                   help="host DRAM to budget, overriding the recipe (MiB, as `free -m`)")
    r.add_argument("--workdir", default=".", help="where generated files go (default: .)")
    r.set_defaults(func=_render)

    s = sub.add_parser("serve", help="launch a recipe's server, wait for /health, stop the "
                       "whole process group on exit or Ctrl-C")
    _point_args(s, default_port=8000)
    s.add_argument("--sim", action="store_true",
                   help="start the simulator with the recipe's sim_profile instead")
    s.add_argument("--workdir", default=None,
                   help="logs and generated files (default: results/serve-<time>-<recipe>-p<I>)")
    s.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds to wait for /health (default: the recipe's health_timeout_s)")
    s.add_argument("--quiet", action="store_true", help="do not echo the server log")
    s.set_defaults(func=_serve)

    w = sub.add_parser("sweep", help="run every operating point of a recipe at each "
                       "concurrency, one result directory per cell, then the Pareto report")
    w.add_argument("recipe", metavar="NAME|PATH", help="recipe name (recipes/NAME.yaml) or file")
    for flags, kw in _SWEEP_FLAGS:
        w.add_argument(*flags, **kw)
    w.set_defaults(func=_sweep)


_SWEEP_FLAGS: list[tuple[tuple[str, ...], dict]] = [
    (("--base-url",), {"metavar": "URL", "help": "use this running server for every point "
                       "instead of launching one"}),
    (("--sim",), {"action": "store_true", "help": "serve with the simulator and the recipe's "
                  "sim_profile (the default when neither a GPU nor vLLM is present)"}),
    (("--points",), {"type": lambda t: _int_list(t), "metavar": "I,J",
                     "help": "only these operating points (indices)"}),
    (("--conc",), {"type": lambda t: _int_list(t), "metavar": "C,D",
                   "help": "these concurrencies at every point instead of the recipe's lists"}),
    (("--output-dir", "-o"), {"metavar": "DIR",
                              "help": "default: results/sweep-<time>-<recipe>"}),
    (("--resume",), {"action": "store_true",
                     "help": "skip cells whose summary.json exists (and was not rebuilt)"}),
    (("--duration",), {"type": float, "metavar": "S",
                       "help": "seconds per cell, overriding the recipe's run.duration_s"}),
    (("--warmup",), {"metavar": "S|auto",
                     "help": "warm-up per cell, overriding the recipe's run.warmup_s: seconds, "
                     "or auto (the default: until every lane has finished its first request)"}),
    (("--set",), {"action": "append", "default": [], "metavar": "KEY=VALUE", "dest": "run_set",
                  "help": "a run option for every cell (a RunConfig field, YAML value), e.g. "
                  "think_scale=0.1; repeatable"}),
    (("--sim-time-scale",), {"type": float, "metavar": "F",
                             "help": "the simulator runs F x faster than real time (tests)"}),
    (("--timeout",), {"type": float, "metavar": "S", "help": "seconds to wait for /health "
                      "(default: the recipe's health_timeout_s)"}),
]


def _point_args(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("recipe", metavar="NAME|PATH", help="recipe name (recipes/NAME.yaml) or file")
    p.add_argument("--point", type=int, default=0, metavar="I", help="operating point index")
    p.add_argument("--conc", type=int, default=None, metavar="C",
                   help="concurrency (needed when K depends on it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") \
            from None


def _list(ns: argparse.Namespace) -> int:
    print(f"recipes in {recipes_dir()}:")
    for name in recipe_names():
        recipe, _ = load_recipe(name)
        print(f"  {name:<28} {recipe.hardware} x{recipe.gpus}, {len(recipe.points)} point(s)"
              f"  {recipe.description}")
    return 0


def _render(ns: argparse.Namespace) -> int:
    from .render import render

    recipe, path = load_recipe(ns.recipe)
    try:
        r = render(recipe, ns.point, conc=ns.conc, host=ns.host, port=ns.port,
                   workdir=ns.workdir, recipe_dir=path.parent, host_dram_mib=ns.host_dram_mib,
                   source=str(path))
    except InputError as e:
        if e.source == str(path) and e.field and e.line is None:
            e.line = line_in(path, e.field)  # point at the key to change
        raise
    sys.stdout.write(r.script())
    return 0


def _serve(ns: argparse.Namespace) -> int:
    from .serve import LogTail, ServerStartError, launch

    recipe, path = load_recipe(ns.recipe)
    workdir = ns.workdir or Path("results") / (f"serve-{time.strftime('%Y%m%d-%H%M%S')}-"
                                              f"{recipe.name}-p{ns.point}")
    echo = None if ns.quiet else (lambda line: print(line, file=sys.stderr, flush=True))

    def on_term(signum, frame):  # `kill` of agentx serve stops the server like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        server = launch(recipe, ns.point, conc=ns.conc, host=ns.host, port=ns.port,
                        workdir=workdir, recipe_dir=path.parent, source=str(path), sim=ns.sim,
                        health_timeout=ns.timeout, on_log=echo)
    except ServerStartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    with server:
        print(f"ready: {server.base_url} (model {server.model}; log {server.log_path}); "
              "Ctrl-C stops it", file=sys.stderr, flush=True)
        tail = LogTail(server.log_path, echo, pos=server.log_path.stat().st_size)
        try:
            while server.running:
                tail.poll()
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping the server", file=sys.stderr)
            return 0
        print(f"error: the server exited with code {server.proc.returncode}", file=sys.stderr)
        return 1


def _sweep(ns: argparse.Namespace) -> int:
    from .sweep import SweepOptions, sweep

    recipe, path = load_recipe(ns.recipe)
    out = Path(ns.output_dir) if ns.output_dir else Path("results") / (
        f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{recipe.name}")
    overrides = {k: v for k, v in (("duration_s", ns.duration), ("warmup_s", ns.warmup))
                 if v is not None}
    for item in ns.run_set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError("command line", f"expected KEY=VALUE, got {item!r}", field="--set")
        overrides[key.strip()] = load_value(value, "command line --set")
    opts = SweepOptions(output_dir=out, base_url=ns.base_url, sim=ns.sim, points=ns.points,
                        conc=ns.conc, resume=ns.resume, run=overrides,
                        sim_time_scale=ns.sim_time_scale, health_timeout=ns.timeout)
    cells = sweep(recipe, path, opts)
    failed = [c for c in cells if c.status == "failed"]
    if failed:
        print(f"agentx sweep: {len(failed)} of {len(cells)} cell(s) failed (see "
              f"{out / 'sweep.json'})", file=sys.stderr)
    return 1 if failed else 0
