"""One thin module per `agentx` subcommand: its option model (the flags are derived from it)
and `main(args)`; the work stays in the packages below. `agentx.cli` imports a module here
only when its subcommand runs, so `agentx --help` stays fast."""
