"""`agentx report DIR...`: one run -> its console table and PNG plots; several runs (or a
directory of runs) -> one CSV row each, and the Pareto frontier as PNG and table; an `agentx ab`
directory -> its sides' runs. `--html` writes all of it, with ab.json's comparison, into one
self-contained HTML file. A run killed before writing summary.json gets it rebuilt from its
records first."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator

from ..metrics.cost import CostOption
from ..metrics.goodput import slo_option
from ..metrics.percentiles import PercentilesOption
from ..options import add_arguments, from_args, opt


class ReportOptions(PercentilesOption, CostOption):
    dirs: list[str] = opt(None, "run directories, or directories holding run directories",
                          factory=list, positional=True, metavar="DIR", min_length=1)
    gpus: int | None = opt(None, "GPUs behind the server, for runs that recorded no GPU count "
                           "(per-GPU columns; without it they are left empty)", ge=1)
    slo: Annotated[dict[str, float], BeforeValidator(slo_option)] | None = opt(
        None, "compute goodput with these SLOs from each run's records",
        metavar="ttft:MS,tpot:MS,e2el:MS")
    goodput: bool = opt(False, "Pareto on goodput tok/s per GPU instead of throughput (needs "
                        "--slo or runs made with --slo)")
    output_dir: str | None = opt(None, "where runs.csv and pareto.png go (default: the runs' "
                                 "common parent directory)", short="-o", old=("--out",))
    cost: bool = opt(False, "Pareto on $ per million output tokens (lower is better) against "
                     "interactivity instead of throughput (needs --gpu-hour-usd or runs made "
                     "with it)")
    plots: bool = opt(True, "write PNG plots")
    aiperf: bool = opt(False, "also write each run's AIPerf export files into its "
                       "aiperf_artifacts/, what InferenceX's agentic aggregator reads "
                       "(docs/inferencex.md)")
    html: str | None = opt(None, "also write one self-contained HTML report (figures embedded, "
                           "no network): to FILE, or with no FILE report.html in the run "
                           "directory (one run) or the output directory", metavar="FILE",
                           bare="")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_arguments(p, ReportOptions)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return run(from_args(args, ReportOptions))


def run(o: ReportOptions) -> int:
    from ..report.console import make_console
    from ..report.html import ab_dirs
    from ..report.rebuild import find_runs, load_run
    from ..report.runs import report_many, report_one
    from ..rundir import ABDir, ReportDir

    console = make_console()
    ab = ab_dirs(o.dirs)  # an `agentx ab` directory: its sides' runs (a/1, b/1, ...)
    dirs = [str(x) for d in o.dirs for x in ([Path(d) / s for s in ABDir.SIDES] if Path(d) in ab
                                             else [d])]
    runs = [load_run(d, gpus=o.gpus, slo=o.slo) for d in find_runs(dirs)]
    if o.percentiles:  # computed from the records where the run's summary lacks them
        from ..metrics.summary import add_percentiles

        for r in runs:
            add_percentiles(r.summary, r.records, o.percentiles)
    if o.gpu_hour_usd is not None:  # priced here: in memory, the run's files untouched
        from ..metrics.cost import cost_block

        for r in runs:
            r.summary["cost"] = cost_block(r.summary, o.gpu_hour_usd, o.gpus)
    for r in runs:
        for note in r.notes:
            console.print(f"agentx report: {r.dir}: {note}")
    if o.aiperf:
        from ..report.aiperf_export import export

        for r in runs:
            console.print(f"aiperf: {export(r.dir)}")
    out = ReportDir.at(o.output_dir, *(r.dir for r in runs)).path
    if len(runs) == 1:
        code = report_one(runs[0], console, plots=o.plots)
    else:
        code = report_many(runs, out, console, goodput=o.goodput, gpus=o.gpus, plots=o.plots,
                           cost=o.cost)
    if o.html is not None:
        from ..report.html import default_path, write_html
        from ..rundir import RunDir

        path = Path(o.html) if o.html else default_path(runs, out)
        write_html(path, runs, ab_dirs=ab, goodput=o.goodput, gpus=o.gpus, plots=o.plots,
                   cost=o.cost)
        if len(runs) == 1 and path.parent.resolve() == runs[0].dir.resolve():
            RunDir(runs[0].dir).register(path.name)  # --overwrite removes it with the run
        console.print(f"html: {path}")
    return code
