"""`agentx compare RUN_A RUN_B [RUN_C ...]`: saved runs compared with `agentx ab`'s statistics.

`ab` runs both sides itself; users also hold yesterday's run and today's. The first directory
is the baseline A, each later one a B compared against it, with the same session bootstrap,
intervals and verdicts (agentx/ab/stats.py) and the same ab.json shape, so the console table,
the CDF figure and the HTML section are `ab`'s. Two runs are comparable only when they replayed
the same workload: a different trace, lane count (or arrival schedule) or window makes B - A a
difference of workloads, not of servers, so such a pair is refused unless --allow-mismatch.
When both runs used the same seed, their lanes replayed the same sessions from the same start
turns, and the bootstrap draws sessions for both sides at once (paired by session: a session's
own difficulty cancels from B - A); otherwise each side is resampled on its own, as in `ab`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError
from ..report.rebuild import Run
from ..report.target import target_text
from ..rundir import CompareDir
from .stats import ab_metrics, compare, replay_key, side_data, too_thin

# config fields two runs must share, by what they decide
MUST_MATCH = {
    "trace": ("trace", "context_scale", "think_scale", "max_think_s", "start_min", "start_max",
              "shared_prefix"),
    "lanes": ("conc", "session_rate", "burstiness", "max_active", "arrivals", "time_scale"),
    "window": ("duration_s", "warmup_s", "max_requests", "ramp_up_s"),
}
DEFAULT_MIN_SAMPLES = 30  # RunConfig's, for a run that did not record its own


def mismatch(a: Run, b: Run) -> str | None:
    """The first config field (with what it decides) two runs do not share, or None."""
    ca, cb = a.summary.get("config") or {}, b.summary.get("config") or {}
    for what, fields in MUST_MATCH.items():
        for f in fields:
            if ca.get(f) != cb.get(f):
                return (f"{what}: {f} {cb.get(f)!r} where {a.dir} has {ca.get(f)!r}")
    return None


def pairs_of(runs: Sequence[Run], allow_mismatch: bool) -> list[tuple[Run, Run, str | None]]:
    """(A, B, mismatch) for each later run against the first; a mismatch refuses the pair
    (InputError naming the run and field) unless allowed, when it is kept as a warning."""
    out = []
    for b in runs[1:]:
        why = mismatch(runs[0], b)
        if why and not allow_mismatch:
            raise InputError(str(b.dir), f"is not comparable with {runs[0].dir}: its {why} "
                             "(the same trace, lanes and window make B - A a difference of "
                             "servers; --allow-mismatch compares anyway)", field="RUN")
        out.append((runs[0], b, why))
    return out


def _seed(r: Run) -> object:
    return (r.summary.get("config") or {}).get("seed")


def _side(r: Run, label: str) -> dict:
    s = r.summary
    return {"label": label, "spec": str(r.dir), "kind": "run", "base_url": target_text(s),
            "runs": [str(r.dir)], "validation": [(s.get("validation") or {}).get("verdict")],
            "completed": s.get("completed", 0), "failed": s.get("failed", 0),
            "window_s": (s.get("throughput") or {}).get("window_s") or 0.0,
            "rebuilt": bool(s.get("rebuilt"))}


def compare_pair(a: Run, b: Run, *, labels: tuple[str, str], replicates: int, seed: int,
                 min_sessions: int, percentiles: Sequence[float] | None = None,
                 unpaired: bool = False, why: str | None = None) -> dict:
    """ab.json's document for two saved runs (plus `paired`, `paired_sessions`, `mismatch`)."""
    data = {k: side_data(r.records, (r.summary.get("throughput") or {}).get("window_s") or 0.0)
            for k, r in (("a", a), ("b", b))}
    min_samples = max((r.summary.get("config") or {}).get("min_samples", DEFAULT_MIN_SAMPLES)
                      for r in (a, b))
    paired = not unpaired and _seed(a) is not None and _seed(a) == _seed(b)
    common = set(map(replay_key, data["a"].keys or ())) & set(map(replay_key,
                                                                    data["b"].keys or ()))
    metrics = compare(data["a"], data["b"], replicates=replicates, seed=seed,
                      min_sessions=min_sessions, min_requests=min_samples,
                      metrics=ab_metrics(percentiles), paired=paired and bool(common))
    thin = {k.upper(): w for k in ("a", "b") if (w := too_thin(data[k], min_sessions,
                                                                min_samples))}
    warnings = ["one run a side: the intervals resample that run's sessions, so they do not "
                "cover run-to-run variance (docs/ab.md); compare repeated runs before "
                "publishing a verdict"]
    if why:
        warnings.insert(0, f"compared although the workloads differ ({why}): B - A mixes "
                        "the workload's effect with the server's")
    if paired and not common:
        warnings.append("same seed but no session replayed by both runs: resampled unpaired")
    rebuilt = [str(r.dir) for r in (a, b) if r.summary.get("rebuilt")]
    if rebuilt:
        warnings.append(f"rebuilt from a killed run's records: {', '.join(rebuilt)}")
    return {"a": _side(a, labels[0]), "b": _side(b, labels[1]), "insufficient": thin,
            "sessions": {"a": data["a"].n_sessions, "b": data["b"].n_sessions},
            "paired": paired and bool(common), "paired_sessions": len(common) if paired else 0,
            "mismatch": why,
            "bootstrap": {"replicates": replicates, "level": 0.95, "seed": seed,
                          "resampled": "sessions, paired by session (same seed)"
                          if paired and common else "sessions"},
            "per_run": {}, "metrics": metrics, "warnings": warnings}


def default_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's directory name, or its path below the runs' common parent when two share a
    name (`a/1`, `b/1`)."""
    names = [r.dir.name for r in runs]
    if len(set(names)) == len(names):
        return names
    from ..report.html import short_names

    return short_names(list(runs))


def check_labels(labels: Sequence[str], runs: Sequence[Run]) -> list[str]:
    if not labels:
        return default_labels(runs)
    if len(labels) != len(runs):
        raise InputError("command line", f"{len(labels)} label(s) for {len(runs)} runs: give "
                         "one per run, in order", field="--names")
    return list(labels)


def write_outputs(out: Path, docs: list[dict], runs: list[Run], plots: bool) -> list[Path]:
    """compare.json (every pair), one CDF figure per pair, compare.html."""
    from ..report.html import ab_html, png_img, write_html
    from .plot import cdf_plot

    folder = CompareDir(out).create()
    made, head = [], []
    for i, doc in enumerate(docs, 1):
        fig = ""
        if plots:
            png = cdf_plot(doc, folder.cdf(i))
            doc["plot"] = str(png)
            made.append(png)
            fig = png_img(png, f"comparison {i} CDFs")
        head.append(ab_html(doc, fig, heading=f"compare {i}"))
    made.insert(0, folder.write_json(CompareDir.JSON, {"baseline": str(runs[0].dir),
                                                       "pairs": docs}))
    made.append(write_html(folder / CompareDir.HTML, runs, plots=plots, head=head))
    folder.register(*(p.name for p in made))
    return made
