"""`agentx report DIR... --html`: one self-contained HTML file a reader can open anywhere or
attach to a ticket: every figure embedded as a base64 PNG data URI, the style inline, no
script, and a Content-Security-Policy that forbids any fetch, so the file never reaches the
network and nothing in it runs.

It shows what the console and the PNG plots show, from the same data: per run the target and
config, the verdict with its reasons, the latency table of the metric catalog with sample
counts, the console's request, throughput, window and cache lines, the latency CDFs and the
server time series (report/plots.py); for several runs the Pareto table and figure
(report/pareto.py); and an A/B comparison's ab.json (its table and its ab_cdf.png) when a
directory holds one. No metric is computed here. Every string that comes from results (model
names, labels, paths, reasons) goes through html.escape: a label cannot inject markup.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import tempfile
from collections.abc import Callable
from html import escape
from pathlib import Path

from .. import __version__
from ..errors import InputError
from ..metrics.catalog import DISTS
from ..metrics.percentiles import pct_key, shown
from ..rundir import ABDir, ReportDir, RunDir
from .console import GLOSSARY, THIN_P99, checked_text, summary_lines, title
from .pareto import (
    INTERACTIVITY,
    frontier_key,
    in_flight_text,
    mark_frontiers,
    run_row,
    throughput_axis,
)
from .pareto import short_names as pareto_short_names
from .rebuild import Run
from .target import target_text

OPEN_UP_TO = 3  # runs whose sections start unfolded; more start folded (<details>)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1300px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.verdict{display:inline-block;padding:.15em .6em;border-radius:4px;font-weight:bold;color:#fff}
.pass{background:#2a7d2a}.fail{background:#b22}.insufficient,.interrupted{background:#c80}
.none{background:#777}ul.reasons li{margin:.2em 0}.meta{color:#666}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:12px}
"""


def default_path(runs: list[Run], out: Path) -> Path:
    """One run: report.html in its directory; several: in the output directory."""
    return (runs[0].dir if len(runs) == 1 else out) / ReportDir.HTML


def write_html(path: Path, runs: list[Run], *, ab_dirs: list[Path] = (), goodput: bool = False,
               gpus: int | None = None, plots: bool = True, cost: bool = False,
               head: list[str] = ()) -> Path:
    """Write the report; `plots=False` leaves the figures out (tables and text only); `head`:
    sections (HTML) that go first (`agentx compare`'s comparisons)."""
    with tempfile.TemporaryDirectory(prefix="agentx-html-") as tmp:
        figs = Figures(Path(tmp), plots)
        parts = [*head, *(_ab_section(d, figs) for d in ab_dirs)]
        names = short_names(runs)
        if len(runs) > 1:
            parts.append(_pareto_section(runs, names, figs, goodput, gpus, cost))
        parts += [_run_section(r, names[i], figs, i, open_=len(runs) <= OPEN_UP_TO)
                  for i, r in enumerate(runs)]
    heading = title(runs[0].summary) if len(runs) == 1 else f"agentx report — {len(runs)} runs"
    doc = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
           f"<title>{escape(heading)}</title><style>{STYLE}</style></head><body>"
           f"<h1>{escape(heading)}</h1><p class=meta>written by agentx {escape(__version__)} on "
           f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC} from "
           f"{escape(', '.join(str(r.dir) for r in runs))}</p>" + "".join(parts)
           + "</body></html>\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc, encoding="utf-8")
    except OSError as e:
        raise InputError(str(path), f"cannot write the HTML report ({e.strerror or e})",
                         field="--html") from None
    return path


class Figures:
    """Draws a figure with report/plots.py into a scratch file and returns it as an <img>
    with a data URI (or nothing when plots are off)."""

    def __init__(self, tmp: Path, on: bool) -> None:
        self.tmp, self.on, self.n = tmp, on, 0

    def img(self, draw: Callable[[Path], Path], alt: str) -> str:
        if not self.on:
            return ""
        self.n += 1
        return png_img(draw(self.tmp / f"fig{self.n}.png"), alt)


def png_img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def short_names(runs: list[Run]) -> list[str]:
    """Each run's path below the runs' common parent (`ab/a/1`, not `1`)."""
    return pareto_short_names([str(r.dir.resolve()) for r in runs])


def _run_section(run: Run, name: str, figs: Figures, i: int, open_: bool) -> str:
    from .plots import gpu_power, latency_cdfs, server_timeseries
    from .runs import plot_title
    from .sessions import html_section, per_turn_plot

    s = run.summary
    head = f"{escape(name)} — {escape(target_text(s))}"
    body = [f"<p><b>target</b>: {escape(target_text(s))}<br><b>workload</b>: "
            f"{escape(workload(s.get('config') or {}))}<br><b>directory</b>: "
            f"{escape(str(run.dir))}</p>"]
    body += [_notes(run.notes), _verdict(s), _latency_table(s), _lines(s)]
    ptitle = plot_title(run)
    body.append(figs.img(lambda p: latency_cdfs(run.records, p, ptitle), "latency CDFs"))
    body.append(html_section(s))
    body.append(figs.img(lambda p: per_turn_plot(s, p, ptitle), "per-turn TTFT and hit rate"))
    if run.metrics:
        body.append(figs.img(lambda p: server_timeseries(run.metrics, p, ptitle, s, run.records),
                             "server time series"))
    if run.gpu:
        body.append(figs.img(lambda p: gpu_power(run.gpu, p, ptitle, s, run.records),
                             "GPU power"))
    body.append(_config(s))
    return (f'<section id="run-{i}"><details{" open" if open_ else ""}><summary><h2 '
            f'style="display:inline">{head}</h2> {_badge(s)}</summary>{"".join(body)}'
            f"</details></section>")


def workload(cfg: dict) -> str:
    """`trace swe, conc 8, duration 60 s, warm-up auto, ramp-up 0 s, seed 0`: what was run."""
    parts = [f"trace {cfg.get('trace') or '?'}", f"conc {cfg.get('conc') or '?'}"]
    for key, name, unit in (("session_rate", "session rate", " /s"),
                            ("duration_s", "duration", " s"), ("max_requests", "max requests", ""),
                            ("warmup_s", "warm-up", " s"), ("ramp_up_s", "ramp-up", " s"),
                            ("seed", "seed", "")):
        v = cfg.get(key)
        if v is not None and v != "":
            parts.append(f"{name} {v:g}{unit}" if isinstance(v, float) else f"{name} {v}"
                         + (unit if isinstance(v, int) else ""))
    return ", ".join(parts)


def _notes(notes: list[str]) -> str:
    return "".join(f"<p><b>note</b>: {escape(n)}</p>" for n in notes)


def _badge(s: dict) -> str:
    v = (s.get("validation") or {}).get("verdict") or "not validated"
    cls = v if v in ("pass", "fail", "insufficient", "interrupted") else "none"
    return f'<span class="verdict {cls}">{escape(v)}</span>'


def _verdict(s: dict) -> str:
    v = s.get("validation")
    if not v:
        return "<p><b>verdict</b>: not validated (--validate off)</p>"
    out = [f"<p><b>verdict</b>: {_badge(s)}</p><p>{escape(checked_text(v))}</p>"]
    for name, key in (("reasons", "reasons"), ("warnings", "warnings"),
                      ("checks skipped", "skipped")):
        items = v.get(key) or []
        if items:
            out.append(f"<p>{name}:</p><ul class=reasons>"
                       + "".join(f"<li>{escape(str(x))}</li>" for x in items) + "</ul>")
    return "".join(out)


def _num(v: object, nd: int = 1) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:,.{nd}f}"


def _latency_table(s: dict) -> str:
    pcts = shown(s)  # --percentiles, else the console's p50, p90, p99
    cols = [pct_key(q) for q in pcts]
    head = "".join(f"<th>{escape(c)}</th>"
                   for c in ("metric", "n", "mean", *(f"p{q:g}" for q in pcts)))
    rows = []
    for m in DISTS:  # the catalog's order, as the console
        d = s.get(m.key) or {}
        n = d.get("count")
        thin = n is not None and 0 < n < THIN_P99
        cells = [_num(d.get("mean"))] + [_num(d.get(c)) + (" †" if thin and q >= 99 else "")
                                         for q, c in zip(pcts, cols)]
        rows.append(f"<tr><td>{escape(m.label)}</td><td class=n>"
                    f"{'-' if n is None else f'{n:,}'}</td>"
                    + "".join(f"<td class=n>{c}</td>" for c in cells) + "</tr>")
    return (f"<table><caption>latency over the measured requests (n: values per metric; † "
            f"a p99 or above of fewer than {THIN_P99} values, near the maximum; "
            f"{escape(GLOSSARY)})</caption>"
            f"<tr>{head}</tr>{''.join(rows)}</table>")


def _lines(s: dict) -> str:
    """The console's lines under its table, from the same function."""
    lines = summary_lines(s, verdict=False)
    if s.get("stop_reason"):
        lines.append(f"stop: {s['stop_reason']}")
    return "<ul>" + "".join(f"<li>{escape(ln)}</li>" for ln in lines) + "</ul>"


def _config(s: dict) -> str:
    cfg = {k: s[k] for k in ("config", "labels", "run") if s.get(k)}
    return (f"<details><summary>config, labels and run metadata ({RunDir.SUMMARY})</summary><pre>"
            f"{escape(json.dumps(cfg, indent=1, default=str))}</pre></details>")


def _pareto_section(runs: list[Run], names: list[str], figs: Figures, goodput: bool,
                    gpus: int | None, cost: bool = False) -> str:
    from .plots import pareto_plot

    rows = [run_row(str(r.dir), r.summary, r.records, gpus) for r in runs]
    y, y_label = throughput_axis(rows, goodput, cost)
    mark_frontiers(rows, y)
    cols = ["run", "load", "in flight mean/p90", "n", y_label, "TTFT p50 ms", "TPOT p50 ms",
            *(x for _, x in INTERACTIVITY), "verdict"]
    body = []
    for i, r in sorted(enumerate(rows), key=lambda t: (t[1]["conc"] or 0, t[1]["run"])):
        inter = [_num(r[c]) + (" *" if r[frontier_key(c)] else "") for c, _ in INTERACTIVITY]
        answer = " <b>(SLO answer)</b>" if r.get("slo_answer") else ""  # a sweep's --search
        cells = [f'<a href="#run-{i}">{escape(names[i])}</a>{answer}',
                 escape(r["load"]), escape(in_flight_text(r)), str(r["completed"]), _num(r[y]),
                 _num(r["ttft_p50_ms"]), _num(r["tpot_p50_ms"]), *map(escape, inter),
                 escape(r["validation"] or "-") + (" (rebuilt)" if r["rebuilt"] else "")]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    fig = figs.img(lambda p: pareto_plot(rows, p, y, y_label), "Pareto frontier")
    return (f"<section id=pareto><h2>{len(rows)} runs: {escape(y_label)} against "
            f"interactivity</h2><p>* on the Pareto frontier; only runs whose verdict is pass "
            f"take part.</p><table><tr>{''.join(f'<th>{escape(c)}</th>' for c in cols)}</tr>"
            f"{''.join(body)}</table>{fig}</section>")


def ab_dirs(paths: list[str]) -> list[Path]:
    """The given directories that hold an A/B result (ab.json)."""
    return [Path(p) for p in paths if (Path(p) / ABDir.JSON).is_file()]


def _ab_section(d: Path, figs: Figures) -> str:
    """ab.json's table (as `agentx ab` prints it) and its ab_cdf.png as written."""
    doc, broken = ABDir(d).read_json(ABDir.JSON)
    if doc is None:
        return f"<section><h2>A/B</h2><p>{escape(str(d / ABDir.JSON))} is {escape(broken)}</p>" \
               "</section>"
    png = d / ABDir.CDF
    return ab_html(doc, png_img(png, "A/B CDFs") if figs.on and png.is_file() else "")


def ab_html(doc: dict, fig: str, heading: str = "A/B") -> str:
    """An ab.json-shaped comparison (`agentx ab`, `agentx compare`) as a section: its sides,
    the table with intervals and verdicts, why a side has none, and the figure `fig`."""
    la, lb = doc["a"].get("label") or "A", doc["b"].get("label") or "B"
    cols = ["metric", la, lb, f"{lb} - {la}", "95% CI", f"{lb} / {la}", "verdict"]
    verdicts = {"a_better": f"{la} better", "b_better": f"{lb} better",
                "no_difference": "no difference", "insufficient": "insufficient"}
    rows = []
    for m in doc.get("metrics", {}).values():
        pct = m.get("unit") == "fraction"

        def f(v: object, pct: bool = pct) -> str:
            if not isinstance(v, (int, float)):
                return "-"
            return f"{100 * v:.1f}%" if pct else f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.3g}"

        ratio = "-" if m.get("ratio") is None else f"{m['ratio']:.3f}"
        cells = [m.get("label", ""), f(m.get("a")), f(m.get("b")), f(m.get("diff")),
                 f"[{f(m.get('ci_low'))}, {f(m.get('ci_high'))}]", ratio,
                 verdicts.get(m.get("verdict"), str(m.get("verdict")))]
        rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    sides = "".join(
        f"<li>{escape(doc[k].get('label') or k.upper())}: {escape(str(doc[k].get('spec')))}, "
        f"{escape(str(doc[k].get('completed')))} requests, validation "
        f"{escape(', '.join(map(str, doc[k].get('validation') or [])))}</li>" for k in ("a", "b"))
    notes = "".join(f"<p><b>no verdict</b>: {escape(str(k))}: {escape(str(v))}</p>"
                    for k, v in (doc.get("insufficient") or {}).items())
    notes += "".join(f"<p><b>warning</b>: {escape(str(w))}</p>" for w in doc.get("warnings") or [])
    how = (doc.get("bootstrap") or {}).get("resampled", "sessions")
    return (f"<section id=ab><h2>{escape(heading)}: {escape(la)} against {escape(lb)}</h2>"
            f"<ul>{sides}</ul>"
            f"<table><caption>95% CI: bootstrap interval of {escape(lb)} - {escape(la)}, "
            f"resampling {escape(str(how))}</caption><tr>"
            + "".join(f"<th>{escape(c)}</th>" for c in cols) + f"</tr>{''.join(rows)}</table>"
            f"{notes}{fig}</section>")
