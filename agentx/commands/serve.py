"""`agentx serve NAME|PATH`: launch one operating point of a recipe (on vLLM, or the
simulator with --sim), wait for /health, echo its log; Ctrl-C or SIGTERM stops the whole
process group."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from ..options import add_arguments, from_args, opt
from ..rundir import default_dir
from ..targets.choice import LaunchOptions
from .recipe import RecipePoint


class ServeOptions(LaunchOptions, RecipePoint):
    workdir: str | None = opt(None, "logs and generated files (default: "
                              "results/serve-<time>-<recipe>-p<I>)")
    quiet: bool = opt(False, "do not echo the server log")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_arguments(p, ServeOptions)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return run(from_args(args, ServeOptions))


def run(o: ServeOptions) -> int:
    from ..recipe.load import load_recipe
    from ..targets.choice import RecipeChoice
    from ..targets.open import open_server
    from ..targets.process import LogTail, ServerStartError

    recipe, path = load_recipe(o.recipe)
    workdir = o.workdir or default_dir(recipe.name, f"p{o.point}", kind="serve")
    echo = None if o.quiet else (lambda line: print(line, file=sys.stderr, flush=True))

    def on_term(signum, frame):  # `kill` of agentx serve stops the server like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        launched = open_server(RecipeChoice.of(
            recipe, path, sim=o.sim, point=o.point, conc=o.conc, host=o.host, port=o.port,
            workdir=Path(workdir), health_timeout_s=o.health_timeout_s, on_log=echo))
        launched.start()
        server = launched.handle  # type: ignore[attr-defined] - a recipe's: its process
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
