"""The metric catalog (agentx.metrics.catalog): every entry shows where it says it does —
summary.json, the console table, runs.csv, ab.json and the A/B table — in real runs against
the simulator, with the same number everywhere; and the metric added through the catalog alone
(TTFT per 1k uncached prompt tokens) has its definition's value on records whose timestamps
and token counts the test chose."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import orjson
import pytest

from agentx.ab.stats import ab_metrics, point_estimates, side_data
from agentx.cli import main
from agentx.client.assemble import assemble
from agentx.client.facts import StreamFacts
from agentx.metrics import definitions as d
from agentx.metrics.catalog import CATALOG, DISTS, RATIOS, SLO_KEYS, Dist, Ratio, dist_named
from agentx.metrics.goodput import parse_slo
from agentx.metrics.summary import summarize
from agentx.records import RequestRecord
from agentx.sim.config import SimConfig
from agentx.sim.embedded import start_in_thread
from helpers import write_trace

MS = 1_000_000  # ns
NEW = "ttft_per_1k_uncached_ms"  # the metric added through the catalog
SIM = ["--sim-profile", "cpu-tiny", "--sim-time-scale", "20"]


def _cells(printed: str) -> dict[str, list[str]]:
    """Rows of the rich tables in `printed`, by their first cell."""
    rows = {}
    for line in printed.splitlines():
        cells = [c.strip() for c in line.split("│")]
        cells = [c for c in cells[1:-1]] if len(cells) > 2 else []
        if cells and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def _num(cell: str) -> float:
    return float(cell.replace(",", "").rstrip(" †%"))


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return write_trace(tmp_path_factory.mktemp("catalog") / "tr", sessions=6, turns=4,
                       think=0.0, out=20)


# ------------------------------------------------------------------- the new metric by hand
def _record(ttft_ms: float, isl: int, cached: int | None, out_tokens: int = 5) -> dict:
    """A completed request whose first chunk arrived `ttft_ms` after the send, one token a
    chunk 10 ms apart, with the server's usage as given."""
    t0 = 50 * MS
    first = t0 + int(ttft_ms * MS)
    offsets = [first - t0 + 10 * MS * i for i in range(out_tokens)]
    f = StreamFacts(start_ns=t0, end_ns=t0 + offsets[-1] + MS, status=200, first_chunk_ns=first,
                    last_chunk_ns=t0 + offsets[-1], first_content_ns=first,
                    chunk_offsets_ns=offsets, chunk_tokens=[1] * out_tokens, isl=isl,
                    osl=out_tokens, cached_tokens=cached, finish_reason="length")
    rec = RequestRecord(f"r{isl}-{cached}", f"s{isl}", 0, 0, False, isl_intended=isl,
                        osl_intended=out_tokens)
    assemble(rec, f)
    assert rec.ok and rec.ttft_ms == ttft_ms
    return orjson.loads(rec.to_json())


def test_ttft_per_1k_uncached_on_known_records():
    """150 ms to prefill 3,000 - 2,000 = 1,000 tokens: 150 ms per 1k; 200 ms for 5,000 - 1,000:
    50 ms per 1k. A full hit (nothing to prefill) and a server that reports no cached tokens
    have none, as the definition says."""
    m = dist_named(NEW)
    recs = [_record(150.0, 3000, 2000), _record(200.0, 5000, 1000), _record(30.0, 4000, 4000),
            _record(80.0, 4000, None)]
    assert [m.value(r) for r in recs] == [pytest.approx(150.0), pytest.approx(50.0), None, None]
    assert d.ttft_per_1k_uncached_ms(150.0, 3000, 2000) == pytest.approx(150.0)
    s = summarize(recs, window_s=1.0)[NEW]
    assert s["count"] == 2 and s["mean"] == pytest.approx(100.0)
    assert s["min"] == pytest.approx(50.0) and s["max"] == pytest.approx(150.0)
    # A/B reads the same values: its p50 over these requests is the summary's
    p = point_estimates(side_data(recs, window_s=1.0))
    assert p[m.column(50)] == pytest.approx(s["p50"])


def test_declarations_are_consistent():
    """Keys and column names are unique; the goodput SLO names are the catalog's, and --slo
    takes each of them."""
    keys = [m.key for m in CATALOG]
    assert len(set(keys)) == len(keys)
    cols = [m.column(q) for m in DISTS for q in (*m.ab, *m.csv)]
    assert len(set(cols)) == len({(m.key, q) for m in DISTS for q in (*m.ab, *m.csv)})
    assert SLO_KEYS == ("ttft", "tpot", "e2el")  # vLLM's --goodput names, in its order
    assert parse_slo(",".join(f"{k}:100" for k in SLO_KEYS)) == {k: 100.0 for k in SLO_KEYS}
    names = [m.name for m in ab_metrics()]
    assert len(set(names)) == len(names)


# ------------------------------------------------------------------- real runs
def test_every_entry_in_summary_console_and_csv(tmp_path, trace, capsys):
    out = tmp_path / "run"
    assert main(["run", "--trace", str(trace), "--conc", "2", "--max-requests", "10",
                 "--think-scale", "0", "--no-progress", "--validate", "warn",
                 "--scrape-interval", "0.3", "-o", str(out), *SIM]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    table = _cells(printed)
    for m in DISTS:  # a distribution in summary.json and its row in the console table
        got = summary[m.key]
        assert got["count"] > 0, m.key
        row = table[m.label]
        assert int(row[0].replace(",", "")) == got["count"], m.key
        assert _num(row[2]) == pytest.approx(got["p50"], abs=0.05), m.key  # printed .1f
    for m in RATIOS:
        block, key = m.summary
        assert summary[block][key] is not None and summary[block][key] > 0, m.key
    assert summary[NEW]["count"] > 0  # the simulator reports cached tokens

    shutil.copytree(out, tmp_path / "copy")  # runs.csv is written for two runs or more
    assert main(["report", str(out), str(tmp_path / "copy"), "-o", str(tmp_path / "rep"),
                 "--no-plots"]) == 0
    with open(tmp_path / "rep" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for m in DISTS:
        for q in m.csv:
            for row in rows:
                assert float(row[m.column(q)]) == pytest.approx(summary[m.key][f"p{q}"]), m.key
    assert f"{NEW.removesuffix('_ms')}_p50_ms" in rows[0]


def test_every_ab_entry_in_ab_json_and_table(tmp_path, trace, capsys):
    """Both sides on one simulator (each run has its own cache salt): every catalog entry A/B
    compares is in ab.json and the A/B table, and its A value is the side's own summary's."""
    with start_in_thread(SimConfig(profile="cpu-tiny", time_scale=20)) as sim:
        assert main(["ab", "--a", sim.base_url, "--b", sim.base_url, "--trace", str(trace),
                     "--conc", "2", "--max-requests", "10", "--think-scale", "0",
                     "--no-progress", "--validate", "warn", "--bootstrap", "200",
                     "-o", str(tmp_path / "ab")]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "ab" / "ab.json").read_text())
    a = json.loads((Path(doc["a"]["runs"][0]) / "summary.json").read_text())
    table = _cells(printed)
    expected = {m.name for m in ab_metrics()}
    assert set(doc["metrics"]) == expected
    for m in CATALOG:
        if isinstance(m, Dist):
            for q in m.ab:
                got = doc["metrics"][m.column(q)]
                assert got["a"] == pytest.approx(a[m.key][f"p{q}"]), m.key
                assert got["label"] in table and got["unit"] == m.unit
        elif isinstance(m, Ratio) and m.ab:
            block, key = m.summary
            assert doc["metrics"][m.key]["a"] == pytest.approx(a[block][key]), m.key
            assert m.name in table
    assert any(m.key == NEW and m.ab for m in DISTS)
