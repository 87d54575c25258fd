"""`agentx recipe list|render` and `agentx serve`: a recipe as a pasteable command, or launched."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from ..errors import InputError
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


def _point_args(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("recipe", metavar="NAME|PATH", help="recipe name (recipes/NAME.yaml) or file")
    p.add_argument("--point", type=int, default=0, metavar="I", help="operating point index")
    p.add_argument("--conc", type=int, default=None, metavar="C",
                   help="concurrency (needed when K depends on it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port)


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
