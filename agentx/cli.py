"""`agentx` command line: one subcommand per concern, each in its own module of
agentx.commands, imported only when that subcommand runs (or shows its --help), so `agentx
--help` and every command's start pay for the imports of one command, not of all."""
from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from . import sigint_hold
from .errors import InputError, RunLost

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

# name -> (module under agentx.commands, one-line help); the module adds the flags
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "replay a trace against a server (default: embedded simulator)"),
    "sweep": ("sweep", "run every operating point of a recipe at each concurrency, one result "
              "directory per cell, then the Pareto report"),
    "ab": ("ab", "compare two servers (URL or recipe) on the same traffic, with bootstrap "
           "confidence intervals and a verdict per metric"),
    "compare": ("compare", "compare saved runs (the first against each later one) with the A/B "
                "bootstrap intervals and verdicts, paired by session when the seeds match"),
    "cliff": ("cliff", "predict the prefix-cache hit rate per tier against lanes and the lane "
              "count where each tier collapses; --verify measures around it"),
    "calibrate": ("calibrate", "measure a draft's acceptance length per thinking mode and K, "
                  "write the golden AL file"),
    "serve": ("serve", "launch a recipe's server, wait for /health, stop the whole process "
              "group on exit or Ctrl-C"),
    "serve-sim": ("serve_sim", "run the embedded vLLM-compatible simulator as a server"),
    "recipe": ("recipe", "list recipes or render one as a vllm serve command"),
    "report": ("report", "tables and plots of finished (or killed) runs; the Pareto frontier "
               "of several"),
    "trace": ("trace", "trace statistics and the built-in trace generator"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only `command`'s module is imported to add its flags (the
    others are listed by name and help)."""
    p = argparse.ArgumentParser(prog="agentx", description="Replay agentic-coding traces "
                                "against LLM inference servers and measure them.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            importlib.import_module(f"agentx.commands.{module}").configure(sp)
    return p


def command_of(argv: list[str]) -> str | None:
    """The subcommand named on the line: the top level has no option but -h, so it is the
    first word that is not one."""
    return next((a for a in argv if not a.startswith("-")), None)


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; a word the subcommand does not know is refused by the subcommand's own
    parser (its usage, not the top level's `agentx COMMAND ...`), with the closest flag it
    has: `agentx run: error: unrecognized arguments: --conk 8 (did you mean --conc?)`."""
    parser = build_parser(command_of(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sp = sub.choices[args.command]
        word = next((a for a in extra if a.startswith("-")), extra[0]).split("=", 1)[0]
        close = difflib.get_close_matches(word, list(sp._option_string_actions), n=1)
        sp.error(f"unrecognized arguments: {' '.join(extra)}"
                 + (f" (did you mean {close[0]}?)" if close else ""))
    return args


def main(argv: list[str] | None = None) -> int:
    sigint_hold.hold()  # a Ctrl-C while imports and parsing run is raised inside the try
    argv = sys.argv[1:] if argv is None else list(argv)
    is_run = command_of(argv) == "run"
    if is_run:  # SIGTERM as Ctrl-C: exit 130 (docs/reliability.md)
        # Rust extensions first: a signal handler raising inside their module init aborts it
        # as a panic (orjson: "PyCapsule_Import could not import module datetime", exit 1)
        import orjson  # noqa: F401
        import pydantic_core  # noqa: F401

        from .aio import term_interrupts
    try:
        if is_run:  # inside the try: a SIGTERM right after it lands in the except
            term_interrupts()
        args = parse(argv)
        if getattr(args, "config", None) or getattr(args, "print_config", False):
            from .yamlconf import config_flags  # only then: the YAML reader costs ~17 ms

            if (printed := config_flags(args)) is not None:
                return printed
        sigint_hold.release()  # the command handles Ctrl-C from here (a run: its drain)
        return int(args.func(args) or 0)
    except (InputError, RunLost) as err:
        print(str(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C before a run handles it (start-up), or in a command
        print("agentx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sigint_hold.restore()  # a parse error or --help: no held Ctrl-C left behind


if __name__ == "__main__":
    sys.exit(main())
