"""`agentx compare RUN_A RUN_B [RUN_C ...]`: saved run directories compared with `agentx ab`'s
session bootstrap, intervals and verdicts (the first run is the baseline A, each later one a
B), paired by session when the seeds match; runs whose trace, lanes or window differ are
refused unless --allow-mismatch. Console table per pair, compare.json, compare.html and one CDF
figure per pair (agentx/ab/compare.py)."""
from __future__ import annotations

import argparse

from ..ab.config import BootstrapOptions
from ..metrics.percentiles import PercentilesOption
from ..options import add_arguments, from_args, opt


class CompareOptions(PercentilesOption, BootstrapOptions):
    dirs: list[str] = opt(None, "run directories: the baseline first, then each run to "
                          "compare with it", factory=list, positional=True, metavar="RUN",
                          min_length=2)
    names: list[str] | None = opt(None, "a name per run, in order (default: the directories' "
                                   "names)", metavar="A,B,...")
    allow_mismatch: bool = opt(False, "compare runs whose trace, lanes or window differ (B - A "
                               "then mixes the workload's effect with the server's; said in "
                               "every output)")
    unpaired: bool = opt(False, "resample each run's sessions on its own even when the seeds "
                         "match (as `agentx ab`)")
    seed: int = opt(0, "seed of the bootstrap's draws")
    output_dir: str | None = opt(None, "where compare.json, compare.html and the figures go "
                                 "(default: results/compare-<time>)", short="-o")
    plots: bool = opt(True, "write the CDF figures (and embed them in compare.html)")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_arguments(p, CompareOptions)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return run(from_args(args, CompareOptions))


def run(o: CompareOptions) -> int:
    from ..ab.compare import check_labels, compare_pair, pairs_of, write_outputs
    from ..ab.report import print_ab
    from ..report.console import make_console
    from ..report.rebuild import find_runs, load_run
    from ..rundir import CompareDir

    console = make_console()
    runs = [load_run(d) for d in find_runs(o.dirs)]
    for r in runs:
        for note in r.notes:
            console.print(f"agentx compare: {r.dir}: {note}")
    labels = check_labels(o.names or [], runs)
    docs = []
    for a, b, why in pairs_of(runs, o.allow_mismatch):
        i = runs.index(b)
        docs.append(compare_pair(a, b, labels=(labels[0], labels[i]), replicates=o.bootstrap,
                                 seed=o.seed, min_sessions=o.min_sessions,
                                 percentiles=o.percentiles, unpaired=o.unpaired, why=why))
    made = write_outputs(CompareDir.at(o.output_dir).path, docs, runs, o.plots)
    for doc in docs:
        print_ab(doc, console, "compare")
        console.print(f"pairing: {doc['bootstrap']['resampled']}"
                      + (f" ({doc['paired_sessions']} sessions replayed by both)"
                         if doc["paired"] else ""))
    console.print("results: " + ", ".join(str(p) for p in made))
    return 0
