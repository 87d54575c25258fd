#!/usr/bin/env python3
"""Replay a finished run's records through the tiered prefix-cache model and print where the
prediction departs from the server's `cached_tokens`.

For each run (a `*requests.jsonl` with its `*summary.json` beside it) the records' requests are
re-derived from the trace (agentx.cache_theory.tiers.replay_theory: the engine's block keys, sent at
`start_ns`, finished at `end_ns`) and replayed three times: looking each request up at its send
(the model before 2026-12-02: it must reproduce the recorded `cached_expected_pool` when the run's
client modelled the same tier), in the server's waiting queue (looked up when admitted, today's
model), and at each request's first token (`answered`: the order the server computed the prompts
in, one of the replays validation's band spans). Prints, over the measured window: achieved vs
predicted hit rate, the per-request error, and the error by time and by prompt size; then the
server's own split of cached tokens (GPU prefix cache vs connector, whole run).

The tier's store mode is the run's (`cache.offload_eager` of its summary) unless `--store`
says: `eager` (every computed block stored; the client's model of Mooncake), `mooncake`
(MooncakeStoreConnector as its source does it: the store's own leading hit from the first
block, every block of the prompt it lacks saved, `TieredCache(whole=True)`), `lazy`
(SimpleCPUOffload's `lazy_offload: true`). Clients before 2026-12-03 recorded a Mooncake server
given `--offload-tokens` as lazy.

Run: python bench/tier_replay.py [REQUESTS.jsonl ...] [--offload-tokens N]
     [--store eager|lazy|mooncake]
(default: tests/data/h200-runs-2/offb-requests.jsonl and tests/data/h200-runs/offB/requests.jsonl,
whose older client did not record the tier: 436,906 tokens, from its server log).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentx.cache_theory.tiers import replay_theory
from agentx.trace.load import load_traces

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = [REPO / "tests/data/h200-runs-2/offb-requests.jsonl",
                REPO / "tests/data/h200-runs/offB/requests.jsonl"]
OFFB_TIER_TOKENS = 436_906  # 27,306 CPU blocks x 16 (offB's server.log)


def run_files(requests: Path) -> tuple[list[dict], dict]:
    summary = requests.with_name(requests.name.replace("requests.jsonl", "summary.json"))
    records = [json.loads(line) for line in requests.read_text().splitlines() if line.strip()]
    return records, json.loads(summary.read_text())


def window(records: list[dict]) -> list[dict]:
    return [r for r in records if r["ok"] and not r["warmup"] and r["cached_tokens"] is not None]


def rates(recs: list[dict], pred: dict[str, tuple[int, int]]) -> tuple[float, float]:
    """(achieved, predicted) hit rates of `recs`, as summary.py computes them."""
    achieved = sum(r["cached_tokens"] for r in recs) / max(1, sum(r["isl"] for r in recs))
    predicted = (sum(pred[r["request_id"]][0] for r in recs)
                 / max(1, sum(r["isl_intended"] for r in recs)))
    return achieved, predicted


def per_request(recs: list[dict], pred: dict[str, tuple[int, int]]) -> tuple[float, float]:
    """(mean |predicted - achieved| / prompt, share of requests within 10% of their prompt)."""
    err = [abs(pred[r["request_id"]][0] - r["cached_tokens"]) / r["isl"] for r in recs]
    return sum(err) / len(err), sum(e <= 0.10 for e in err) / len(err)


def replay(records: list[dict], summary: dict, tier_tokens: int | None, traces, queue: bool,
           eager: bool | None = None, whole: bool = False, server_order: bool = False):
    """The run's predictions; `eager` None: the store mode its summary recorded."""
    cfg, cache = summary["config"], summary["cache"]
    return replay_theory(records, traces, context_scale=cfg["context_scale"],
                         pool_tokens=cache["kv_pool_tokens"], tier_tokens=tier_tokens,
                         eager=bool(cache.get("offload_eager")) if eager is None else eager,
                         queue=queue, shared_prefix=cfg.get("shared_prefix", "none"),
                         whole=whole, server_order=server_order)


def report(path: Path, tier_override: int | None, traces_cache: dict,
           store: str | None = None) -> None:
    records, summary = run_files(path)
    cfg = summary["config"]
    tier = tier_override or summary["cache"].get("offload_tokens")
    recorded = bool(summary["cache"].get("offload_eager"))
    eager = recorded if store is None else store != "lazy"
    whole = store == "mooncake"
    if cfg["trace"] not in traces_cache:
        traces_cache[cfg["trace"]] = load_traces(cfg["trace"])
    traces = traces_cache[cfg["trace"]]
    recs = window(records)
    name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"== {name}: {len(recs)} measured requests, pool "
          f"{summary['cache']['kv_pool_tokens']:,} tokens, tier {tier or 0:,} tokens, "
          f"{store if whole else 'eager' if eager else 'lazy'} store"
          + ("" if eager == recorded else f" (the run recorded {'eager' if recorded else 'lazy'})"))
    at_send = replay(records, summary, tier, traces, queue=False, eager=eager, whole=whole)
    queued = replay(records, summary, tier, traces, queue=True, eager=eager, whole=whole)
    answered = replay(records, summary, tier, traces, queue=True, eager=eager, whole=whole,
                      server_order=True)
    if summary["cache"].get("offload_tokens") == tier and eager == recorded and not whole:
        same = sum(at_send[r["request_id"]] == (r["cached_expected_pool"],
                                                r["cached_expected_offload"]) for r in records)
        print(f"  looked up at send, the replay reproduces the recorded prediction of "
              f"{same}/{len(records)} requests")
    for name, pred in (("at send", at_send), ("queued", queued), ("answered", answered)):
        a, p = rates(recs, pred)
        off = (sum(pred[r["request_id"]][1] for r in recs)
               / max(1, sum(r["isl_intended"] for r in recs)))
        mae, within = per_request(recs, pred)
        print(f"  {name:8s} achieved {a:.4f} predicted {p:.4f} (tier {off:.4f}) error "
              f"{p - a:+.4f}; per request: mean |error| {mae:.3f} of the prompt, "
              f"{within:.0%} within 10%")
    t0 = min(r["start_ns"] for r in recs)
    t1 = max(r["start_ns"] for r in recs) + 1
    thirds = [[r for r in recs if (r["start_ns"] - t0) * 3 // (t1 - t0) == k] for k in range(3)]
    print("  queued, by send time (thirds of the window): " + "; ".join(
        "{:+.4f} ({} req)".format(rates(t, queued)[1] - rates(t, queued)[0], len(t))
        for t in thirds if t))
    sizes = [("< 10k", 0, 10_000), ("10k-30k", 10_000, 30_000), (">= 30k", 30_000, 1 << 62)]
    print("  queued, by prompt tokens: " + "; ".join(
        "{} {:+.4f} ({} req)".format(n, rates(s, queued)[1] - rates(s, queued)[0], len(s))
        for n, lo, hi in sizes if (s := [r for r in recs if lo <= r["isl"] < hi])))
    sm = summary.get("server_metrics") or {}
    src = sm.get("prompt_tokens_by_source") or {}
    if src:
        total = sum(src.values())
        print(f"  server, whole run: GPU prefix hits {src.get('local_cache_hit', 0):,.0f} "
              f"({src.get('local_cache_hit', 0) / total:.1%} of prompt tokens; vLLM counts "
              f"those of new requests as prefix_cache hits: "
              f"{(sm.get('prefix_cache') or {}).get('hits', 0):,.0f}, so all came after a "
              f"preemption), connector loads {src.get('external_kv_transfer', 0):,.0f}, "
              f"preemptions {sm.get('preemptions', 0):,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests", nargs="*", type=Path)
    ap.add_argument("--offload-tokens", type=int, default=None,
                    help="the tier's size when the summary does not record it")
    ap.add_argument("--store", choices=("eager", "lazy", "mooncake"), default=None,
                    help="the tier's store mode (default: the run's): mooncake = "
                    "MooncakeStoreConnector's lookup and save")
    args = ap.parse_args()
    runs = args.requests or DEFAULT_RUNS
    traces: dict = {}
    for path in runs:
        tier = args.offload_tokens
        if not args.requests and path.parent.name == "offB":
            tier = OFFB_TIER_TOKENS
        report(path.resolve(), tier, traces, args.store)


if __name__ == "__main__":
    main()
