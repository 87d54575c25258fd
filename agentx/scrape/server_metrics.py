"""Scrape series → the ``server_metrics`` block of summary.json.

Counters become deltas over the run window (first → last scrape, reset-aware
through the intermediate scrapes); gauges become time-weighted mean / max over
the series. Every figure is None when the server does not expose its inputs,
so an absent metric is never reported as a measured zero. Names are vLLM
0.32's; see docs/server-metrics.md for each field's source.
"""
from __future__ import annotations

import math
from typing import Sequence

from agentx import offload
from agentx import vllm_names as vn
from agentx.scrape.prom import (
    Snapshot,
    chain,
    counter_delta,
    counter_delta_by_label,
    counter_resets,
)
from agentx.vllm_names import int_label, total

# The sample names this reader looks up: counters as exposed, with _total (names: vllm_names).
PREFIX_HITS, PREFIX_QUERIES = total(vn.PREFIX_HITS), total(vn.PREFIX_QUERIES)
EXT_HITS, EXT_QUERIES = total(vn.EXT_HITS), total(vn.EXT_QUERIES)
CACHED_BY_SOURCE = total(vn.CACHED_BY_SOURCE)
PROMPT_BY_SOURCE = total(vn.PROMPT_BY_SOURCE)
PROMPT_CACHED = total(vn.PROMPT_CACHED)
PROMPT_TOKENS = total(vn.PROMPT_TOKENS)
GEN_TOKENS = total(vn.GEN_TOKENS)
PREEMPTIONS = total(vn.PREEMPTIONS)
REQUEST_SUCCESS = total(vn.REQUEST_SUCCESS)
KV_USAGE, RUNNING, WAITING = vn.KV_USAGE, vn.RUNNING, vn.WAITING
WAITING_BY_REASON = vn.WAITING_BY_REASON
SPEC_DRAFTS = total(vn.SPEC_DRAFTS)
SPEC_DRAFT_TOKENS = total(vn.SPEC_DRAFT_TOKENS)
SPEC_ACCEPTED = total(vn.SPEC_ACCEPTED)
SPEC_PER_POS = total(vn.SPEC_PER_POS)
CACHE_CONFIG = vn.CACHE_CONFIG
OFFLOAD_LOAD_BYTES, OFFLOAD_STORE_BYTES = total(vn.OFFLOAD_LOAD_BYTES), total(vn.OFFLOAD_STORE_BYTES)
OFFLOAD_LEGACY_BYTES = total(vn.OFFLOAD_LEGACY_BYTES)

# Server-side latency histograms: mean over the window = Δsum / Δcount.
LATENCY_HISTOGRAMS = {
    "ttft_s": vn.TTFT,
    "itl_s": vn.ITL,
    "tpot_s": vn.TPOT,
    "e2e_s": vn.E2E,
    "queue_s": vn.QUEUE_TIME,
    "prefill_s": vn.PREFILL_TIME,
    "decode_s": vn.DECODE_TIME,
}

CORE_FAMILIES = vn.CORE_FAMILIES

_IGNORED_FAMILY_PREFIXES = ("python_", "process_")


def compute(first: Snapshot | None, last: Snapshot | None, series: Sequence[Snapshot] = (),
            model_name: str | None = None) -> dict:
    """Build ``server_metrics`` from the start/end scrapes and the periodic series.

    ``first``/``last`` are the scrapes taken at run start/end. If either failed
    (None) the nearest periodic scrape stands in and ``window.complete`` is
    False: the counters then miss part of the run. ``model_name`` restricts
    every figure to that ``model_name`` label (default: all models summed).
    """
    ordered = sorted(series, key=lambda s: s.t)
    complete = first is not None and last is not None
    first = first if first is not None else (ordered[0] if ordered else None)
    last = last if last is not None else (ordered[-1] if ordered else None)
    if first is None or last is None:
        return _unavailable()
    snaps = chain(first, last, ordered)
    flt = {"model_name": model_name} if model_name else {}

    def d(name: str, **extra: str) -> float | None:
        return counter_delta(snaps, name, **flt, **extra)

    prefix_hits, prefix_queries = d(PREFIX_HITS), d(PREFIX_QUERIES)
    ext_hits, ext_queries = d(EXT_HITS), d(EXT_QUERIES)
    prompt, gen = d(PROMPT_TOKENS), d(GEN_TOKENS)
    duration = last.t - first.t

    return {
        "available": True,
        "model_name": model_name,
        "window": {
            "duration_s": duration,
            "t_first_wall": first.wall,
            "t_last_wall": last.wall,
            "n_scrapes": len(snaps),
            "complete": complete,
            "counter_resets": counter_resets(snaps, PROMPT_TOKENS),
        },
        "prefix_cache": {"hit_rate": _ratio(prefix_hits, prefix_queries),
                         "hits": prefix_hits, "queries": prefix_queries},
        "external_cache": {"hit_rate": _ratio(ext_hits, ext_queries),
                           "hits": ext_hits, "queries": ext_queries},
        **_tokens_by_source(snaps, flt, prefix_hits, ext_hits),
        "prompt_tokens_by_source": counter_delta_by_label(snaps, PROMPT_BY_SOURCE, "source", **flt) or None,
        "prompt_tokens_cached": d(PROMPT_CACHED),
        "kv_cache": _gauge_stats(snaps, KV_USAGE, flt, per_engine="mean", prefix="usage_"),
        "running": _gauge_stats(snaps, RUNNING, flt, per_engine="sum"),
        "waiting": _gauge_stats(snaps, WAITING, flt, per_engine="sum"),
        "kv_fetch_waiting": _by_label_stats(snaps, vn.KV_FETCH_BY_STAGE, "stage", flt),
        "preemptions": d(PREEMPTIONS),
        "prompt_tokens": prompt,
        "generation_tokens": gen,
        "rates": {
            "prompt_tokens_per_s": _ratio(prompt, duration),
            "generation_tokens_per_s": _ratio(gen, duration),
        },
        "requests_by_finish_reason": counter_delta_by_label(
            snaps, REQUEST_SUCCESS, "finished_reason", **flt) or None,
        "spec_decode": _spec_decode(snaps, flt),
        **kv_pool(last),
        "offload": _offload(snaps, flt),
        "server_latency_mean": {key: _ratio(d(fam + "_sum"), d(fam + "_count"))
                                for key, fam in LATENCY_HISTOGRAMS.items()},
        "metric_families_present": sorted(
            f for f in last.family_names() if not f.startswith(_IGNORED_FAMILY_PREFIXES)),
    }


def _unavailable() -> dict:
    """Shape of server_metrics when /metrics was never scraped successfully."""
    return {"available": False, "window": {"complete": False, "n_scrapes": 0},
            "prefix_cache": {"hit_rate": None}, "external_cache": {"hit_rate": None},
            "kv_cache": {"usage_mean": None, "usage_max": None},
            "spec_decode": {"acceptance_length": None, "per_position": None, "num_drafts": None},
            "preemptions": None, "kv_pool_tokens": None, "metric_families_present": []}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _tokens_by_source(snaps: list[Snapshot], flt: dict, prefix_hits: float | None,
                      ext_hits: float | None) -> dict:
    """Cached prompt tokens by where they came from (device, host, disk, ...).

    vLLM ≥ 0.2x exposes the split directly; older servers only have device
    (prefix cache) and external (connector) hit counters, so derive from those.
    """
    by_src = counter_delta_by_label(snaps, CACHED_BY_SOURCE, "source", **flt)
    if by_src:
        return {"tokens_by_source": by_src, "tokens_by_source_origin": CACHED_BY_SOURCE}
    if prefix_hits is None and ext_hits is None:
        return {"tokens_by_source": None, "tokens_by_source_origin": None}
    return {"tokens_by_source": {"device": prefix_hits, "external": ext_hits},
            "tokens_by_source_origin": "derived"}


def _engine_value(snap: Snapshot, name: str, flt: dict, how: str) -> float | None:
    return snap.mean(name, **flt) if how == "mean" else snap.sum(name, **flt)


def _gauge_stats(snaps: list[Snapshot], name: str, flt: dict, per_engine: str,
                 prefix: str = "") -> dict:
    """Time-weighted mean and max of a gauge over the series.

    Per scrape, label sets are combined by ``per_engine`` ("mean" for ratios
    like KV usage where each data-parallel engine has its own pool, "sum" for
    counts). The mean weights each scrape by trapezoids over the scrape times,
    so irregular spacing (start/stop scrapes) does not bias it.
    """
    pts = [(s.t, v) for s in snaps
           if (v := _engine_value(s, name, flt, per_engine)) is not None and not math.isnan(v)]
    out: dict = {f"{prefix}mean": None, f"{prefix}max": None, "samples": len(pts)}
    if not pts:
        return out
    out[f"{prefix}max"] = max(v for _, v in pts)
    span = pts[-1][0] - pts[0][0]
    if len(pts) == 1 or span <= 0:
        out[f"{prefix}mean"] = sum(v for _, v in pts) / len(pts)
    else:
        area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:]))
        out[f"{prefix}mean"] = area / span
    if per_engine == "mean":
        peaks = [m for s in snaps if (m := s.max(name, **flt)) is not None]
        out[f"{prefix}max_any_engine"] = max(peaks) if peaks else None
    return out


def _by_label_stats(snaps: list[Snapshot], name: str, label: str, flt: dict) -> dict | None:
    """`_gauge_stats` (summed over engines) for each value of `label`; None if not exposed."""
    values = sorted({lb[label] for s in snaps for lb, _ in s.select(name, **flt) if label in lb})
    return {v: _gauge_stats(snaps, name, {**flt, label: v}, per_engine="sum")
            for v in values} or None


def _spec_decode(snaps: list[Snapshot], flt: dict) -> dict:
    """AL = 1 + Δaccepted / Δdrafts (references §2); per position = Δaccepted[i] / Δdrafts."""
    drafts = counter_delta(snaps, SPEC_DRAFTS, **flt)
    draft_tokens = counter_delta(snaps, SPEC_DRAFT_TOKENS, **flt)
    accepted = counter_delta(snaps, SPEC_ACCEPTED, **flt)
    per_pos = counter_delta_by_label(snaps, SPEC_PER_POS, "position", **flt)
    have_drafts = drafts is not None and drafts > 0
    al = 1.0 + accepted / drafts if have_drafts and accepted is not None else None
    positions = sorted(per_pos, key=_pos_key)
    per_position = [per_pos[p] / drafts for p in positions] if have_drafts and per_pos else None
    return {
        "acceptance_length": al,
        "per_position": per_position,
        "accepted_per_position": [per_pos[p] for p in positions] if per_pos else None,
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "draft_acceptance_rate": _ratio(accepted, draft_tokens),
    }


def _pos_key(p: str) -> tuple[int, str]:
    try:
        return (int(p), "")
    except ValueError:
        return (1 << 30, p)


def kv_pool(snap: Snapshot) -> dict:
    """KV pool from ``vllm:cache_config_info`` labels: num_gpu_blocks × block_size.

    Falls back to the ``kv_cache_size_tokens`` label (vLLM 0.32 exposes both).
    Engines (data-parallel ranks) each have a pool; ``kv_pool_tokens`` is their
    total and the per-engine values are kept alongside.
    """
    per_engine: dict[str, int] = {}
    block_size: int | None = None
    for labels, _ in snap.select(CACHE_CONFIG):  # carries no model_name label
        blocks, bs = int_label(labels, "num_gpu_blocks"), int_label(labels, "block_size")
        tokens = blocks * bs if blocks is not None and bs is not None else int_label(
            labels, "kv_cache_size_tokens")
        if tokens is None:
            continue
        per_engine[labels.get("engine", str(len(per_engine)))] = tokens
        block_size = bs if bs is not None else block_size
    if not per_engine:
        return {"kv_pool_tokens": None, "kv_pool_tokens_per_engine": None, "kv_block_size": None}
    return {"kv_pool_tokens": sum(per_engine.values()),
            "kv_pool_tokens_per_engine": per_engine, "kv_block_size": block_size}


def _offload(snaps: list[Snapshot], flt: dict) -> dict:
    """Signals that KV came back from an offload tier: vLLM's generic ones, then each
    connector's own (agentx.offload: `Connector.loads` / `.stores`).

    ``hits_observed`` is True if any load signal moved, False if signals exist but
    stayed flat, None if the server exposes none of them. The generic one is
    ``vllm:external_prefix_cache_hits`` (the only one SimpleCPUOffload moved in
    vLLM 0.24, docs/references.md §5, and the only one LMCache moves in 0.32); the
    connector-specific ones confirm which tier.
    """
    signals: dict[str, float | None] = {
        "external_prefix_cache_hits": counter_delta(snaps, EXT_HITS, **flt),
        "cached_tokens_not_device": _non_device(counter_delta_by_label(
            snaps, CACHED_BY_SOURCE, "source", **flt)),
        "prompt_tokens_external_kv_transfer": counter_delta(
            snaps, PROMPT_BY_SOURCE, source="external_kv_transfer", **flt),
        "kv_offload_load_bytes": _first_not_none(
            counter_delta(snaps, OFFLOAD_LOAD_BYTES, **flt),
            counter_delta(snaps, OFFLOAD_LEGACY_BYTES, transfer_type="CPU_to_GPU", **flt)),
    }
    stores: dict[str, float | None] = {
        "kv_offload_store_bytes": _first_not_none(
            counter_delta(snaps, OFFLOAD_STORE_BYTES, **flt),
            counter_delta(snaps, OFFLOAD_LEGACY_BYTES, transfer_type="GPU_to_CPU", **flt)),
    }
    for c in offload.CONNECTORS:
        for out, declared in ((signals, c.loads), (stores, c.stores)):
            for s in declared:
                out[s.key] = counter_delta(snaps, s.sample, **s.labels, **flt)
    present = [v for v in signals.values() if v is not None]
    return {
        "hits_observed": (any(v > 0 for v in present) if present else None),
        "loads": signals,
        "stores": stores,
    }


def _non_device(by_src: dict[str, float]) -> float | None:
    if not by_src:
        return None
    return sum(v for src, v in by_src.items() if src != "device")


def _first_not_none(*vals: float | None) -> float | None:
    return next((v for v in vals if v is not None), None)
