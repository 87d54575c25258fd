"""Plots read right (issue 29 point 6): Pareto labels that do not overprint and say the requests
in flight, titles that fit and carry no random port, a CDF axis not stretched by one outlier,
A and B in the same colours in every figure, open-loop runs named by their rate. Figures are
drawn with matplotlib (Agg) and measured from the renderer's own text extents."""
from __future__ import annotations

import json

import numpy as np
import pytest

from agentx.ab.plot import SIDE_COLOURS
from agentx.report.plots import (
    _point_label,
    _pyplot,
    axis_cut,
    group_colours,
    place_labels,
    wrap_title,
)
from agentx.report.target import load_text, target_text


def _row(conc: int, flight: float, point: str = "p0-tp8") -> dict:
    return {"point": point, "conc": conc, "load": f"conc {conc}", "in_flight_mean": flight,
            "run": f"/x/c{conc}", "labels": ""}


def test_pareto_labels_do_not_overprint():
    """Seven sweep cells whose points sit close together (the cpu-tiny sweep of 2026-12-03
    had c4, c6 and c8 within 3% of each other on x): every label's rendered box is clear of
    every other label's and of every point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.8))
    xs = [917, 944, 855, 921, 802, 918, 929]
    ys = [13.7e3, 17.0e3, 21.5e3, 46.0e3, 64.8e3, 66.6e3, 85.0e3]
    ax.scatter(xs, ys)
    ax.margins(x=0.08, y=0.12)
    texts = [_point_label(_row(c, f)) for c, f in zip((1, 2, 3, 4, 5, 6, 8),
                                                      (0.1, 0.3, 0.5, 0.9, 1.5, 1.7, 2.6))]
    place_labels(ax, list(zip(xs, ys)), texts)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in ax.texts]
    assert [t.get_text() for t in ax.texts] == texts
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
        assert ax.bbox.contains(a.x0, a.y0) and ax.bbox.contains(a.x1, a.y1)
    dots = ax.transData.transform(list(zip(xs, ys)))
    for box in boxes:
        assert not any(box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1 for x, y in dots)
    plt.close(fig)


def test_point_labels_say_lanes_and_requests_in_flight_or_the_rate():
    assert _point_label(_row(8, 1.46)) == "p0-tp8 c8 · 1.5 in flight"
    open_loop = {"point": "", "conc": None, "load": "rate 0.5/s", "in_flight_mean": 12.3,
                 "run": "/x/r0.5", "labels": ""}
    assert _point_label(open_loop) == "r0.5 rate 0.5/s · 12.3 in flight"
    assert load_text({"session_rate": 0.5, "max_active": 16, "conc": 8}) == \
        "open loop, 0.5 sessions/s, cap 16"
    assert load_text({"session_rate": 0.5, "conc": 8}, short=True) == "rate 0.5/s"
    assert load_text({"conc": 8}) == "8 session lanes"


def test_ab_sides_keep_their_colours_in_every_figure():
    """A's runs come first (a/1 before b/1); B's label sorts first by name. Sorted, the Pareto
    figure gave A the colour the CDF figure gives B."""
    rows = [{"point": "", "labels": "ab_side=gpu-only;repeat=1"},
            {"point": "", "labels": "ab_side=cpu-tier;repeat=1"}]
    colours = group_colours(rows)
    assert colours["ab_side=gpu-only;repeat=1"] == SIDE_COLOURS["a"]
    assert colours["ab_side=cpu-tier;repeat=1"] == SIDE_COLOURS["b"]
    assert _point_label({**rows[0], "conc": 4, "in_flight_mean": 0.5, "run": "/ab/a/1"}) == \
        "gpu-only c4 · 0.5 in flight"


def test_long_titles_wrap_within_the_figure_and_keep_every_word():
    title = ("gpu-only: http://gpu-box-1.example.internal:8000 (vLLM 0.32.0, TP8)   "
             "cpu-tier-offload: http://gpu-box-2.example.internal:8000 (LMCache 400 GB)\n"
             "no verdict: gpu-only: 8 session(s) measured, fewer than --min-sessions 10")
    wrapped = wrap_title(title, 11)
    assert all(len(ln) <= 121 for ln in wrapped.splitlines())
    assert wrapped.split() == title.split()
    plt = _pyplot()
    fig, _ = plt.subplots(figsize=(11, 4))
    fig.suptitle(wrapped)
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1  # no longer cut at the edges
    plt.close(fig)


def test_simulator_titles_carry_no_port():
    t = {"target": {"kind": "simulator", "profile": "h200-minimaxm3-fp8",
                    "url": "http://127.0.0.1:43117", "model": "m"}}
    assert target_text(t) == "simulator h200-minimaxm3-fp8"


def test_a_far_maximum_does_not_stretch_the_cdf_axis():
    """20k chunk gaps near 7.5 ms and a 105 ms maximum (the quickstart's ITL): the axis ends
    at twice p99; without an outlier it shows everything."""
    rng = np.random.default_rng(1)
    v = np.sort(np.append(rng.normal(7.5, 0.8, 20000), 105.6))
    cut = axis_cut(v)
    assert cut == pytest.approx(2 * np.percentile(v, 99)) and cut < 25
    assert axis_cut(np.sort(rng.normal(7.5, 0.8, 20000))) is None


def test_open_loop_run_plots_are_titled_by_rate(cli, tmp_path):
    """A real open-loop run on the simulator: its plot title (and the console title) name the
    session rate, never the unused --conc."""
    from agentx.report.rebuild import load_run
    from agentx.report.runs import plot_title
    from helpers import write_trace

    trace = write_trace(tmp_path / "tr", sessions=4, turns=4, think=0.2)
    r = cli("run", "--trace", trace, "--session-rate", "4", "--duration", "2", "--warmup", "0",
            "--scrape-interval", "0", "--no-progress", "--validate", "off",
            "--sim-profile", "cpu-tiny", "--sim-time-scale", "20", "-o", tmp_path / "ol")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "ol" / "summary.json").read_text())
    assert s["config"]["conc"]  # the default is there, unused
    title = plot_title(load_run(tmp_path / "ol"))
    assert "rate 4/s" in title and "conc" not in title
