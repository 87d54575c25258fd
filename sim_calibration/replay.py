"""Replay a real run's requests through the simulator on a virtual clock.

Each recorded request (agentx requests.jsonl: `start_ns`, `isl`, `osl`, `cached_tokens`) arrives
at its recorded send time at the modelled API server (sim/frontend.py: a queue shared by all
requests), leaves it when its work is done, and enters the engine built by `build.build_engine`
(the served simulator's engine). Hits are either exactly the recorded ones (its first
`cached_tokens` made resident just before it is queued) or, given block identities derived from
the trace (sim_calibration/realruns.py), decided by the simulator's own cache and offload tier. So the arrival
pattern, prompt sizes and output lengths are the real ones and only the server's timing is
modelled. `python -m sim_calibration.fit` fits the profile with it; bench/sim_vs_real.py compares
every real run under tests/data with it.
"""
from __future__ import annotations

import dataclasses
from bisect import insort
from collections.abc import Callable
from pathlib import Path

from agentx.distribution import dist
from agentx.rundir import RunDir, read_jsonl
from agentx.sim.build import build_engine, frontend
from agentx.sim.config import SimConfig
from agentx.sim.engine import SimEngine
from agentx.sim.request import SimRequest
from agentx.sim.timing import StepTiming


def replay(cfg: SimConfig, records: list[dict], calib: dict | None = None,
           keys: dict[str, list[int]] | None = None, recorded_hits: bool = False,
           stats: dict | None = None, setup: Callable[[SimEngine], None] | None = None,
           closed_loop: bool = False) -> list[dict]:
    """Modelled timings of every ok record, in record order (ms): ttft, tpot, e2e, frontend (time
    in the API server, waiting included), queue (engine core queued -> first scheduled), prefill
    (first scheduled -> first token), the chunk gaps `itl`, and `cached` prompt tokens as the real
    runs' vLLM 0.24 reports them (the hit of a request's latest admission before its first token:
    a request preempted mid-prefill reports its own blocks found again; docs/server-metrics.md),
    of which `cached_tier` came from the offload tier.

    `calib` overrides fields of the profile's calibration section (what the fits vary). Without
    `keys` each request gets exactly its recorded prefix hit (made resident just before it is
    queued); with `keys` (request_id -> block hashes, sim_calibration/realruns.py) the simulator's own KV
    cache and offload tier decide the hits, unless `recorded_hits`: then at each lookup before
    its first token a request finds its recorded hit, no more and no less (`_impose_hit`), in the
    tier when there is one, so loads, stores, evictions and preemptions still run as modelled and
    only the hit decision is the real run's. That separates the timing model from the tier's
    hit decision, which at 32 lanes on this pool is chaotic (docs/simulator-calibration-log.md).

    `stats`, if given, gets the tier's block totals at the end: `stored`, `loaded`, `cpu_evicted`,
    `gpu_evicted` and `gpu_evicted_unstored`, and the lazy walks: `walks` that stored blocks and
    `walk_restarts` from the free queue's head (what bench/stepprobe counts on a real server).
    `setup`, if given, is called with the engine before the first request (bench/tier_breaks.py
    follows the tier's content with it).

    `closed_loop` replays each lane as the client ran it (`lane` in requests.jsonl; a lane's
    requests never overlap): a request is sent the recorded gap (its send minus the previous
    request's end: think time and the client's own work) after the simulator finished the lane's
    previous one. A lane's first request, and its first measured one, keep their recorded send
    times, so the order in which the cold warm-up burst happened to be served does not shift a
    lane's whole measured window. Open loop (the default) sends every request at its recorded
    time whatever the simulator did: a simulator slightly faster or slower than the server then
    sees the arrivals of a slower or faster one, where the real client's lanes wait for each
    answer."""
    built = build_engine(cfg.model_copy(update={"time_scale": 1.0, "fixed_ttft_ms": None,
                                                "fixed_itl_ms": None}))
    eng, bs = built.engine, built.res.block_size
    if calib:
        eng.timing = timing_with(built, calib)
        cal = built.res.profile.calibration.model_copy(update=calib)
    else:
        cal = built.res.profile.calibration
    fe = frontend(cal)
    eng.use_virtual_clock()
    recs = [r for r in records if r.get("ok")]
    if setup is not None:
        setup(eng)
    if recorded_hits and keys is not None:
        want = {str(i): (r["cached_tokens"] or 0) // bs for i, r in enumerate(recs)}  # by SimRequest.rid
        eng.before_lookup = lambda req: _impose_hit(eng, req, want[req.rid])
    t0 = min(r["start_ns"] for r in recs)
    sessions: dict[str, int] = {}
    todo = []
    for i, r in enumerate(recs):
        if keys is not None:
            hashes, hit_blocks = keys[r["request_id"]], 0
        else:
            sid = sessions.setdefault(r["session_id"], len(sessions))
            hit_blocks = r["cached_tokens"] // bs
            # the hit prefix is the session's chain of blocks; the rest is new content
            hashes = [hash((sid, b)) for b in range(hit_blocks)]
            hashes += [hash((sid, b, i)) for b in range(hit_blocks, r["isl"] // bs)]
        req = SimRequest(rid=str(i), prompt_len=r["isl"], max_tokens=max(1, r["osl"]),
                         block_hashes=hashes, arrival_ns=r["start_ns"] - t0)
        todo.append((req.arrival_ns, hit_blocks, req))
    every = [q for _, _, q in todo]  # in record order
    todo.sort(key=lambda x: x[0])
    hits = {id(q): h for _, h, q in todo}
    # closed loop: request -> (the lane's next request in the same phase, warm-up or measured;
    # the recorded gap before it, ns)
    follow: dict[int, tuple[SimRequest, int]] = {}
    if closed_loop:
        if any(r.get("lane") is None or r.get("end_ns") is None for r in recs):
            raise ValueError("replay: closed_loop needs each ok record's `lane` and `end_ns`")
        lanes: dict = {}
        for r, q in sorted(zip(recs, every), key=lambda x: x[0]["start_ns"]):
            lanes.setdefault(r["lane"], []).append((r, q))
        for chain in lanes.values():
            for (a, qa), (b, qb) in zip(chain, chain[1:]):
                if bool(a.get("warmup")) == bool(b.get("warmup")):
                    follow[id(qa)] = (qb, max(0, b["start_ns"] - a["end_ns"]))
        later_reqs = {id(q) for q, _ in follow.values()}
        todo = [x for x in todo if id(x[2]) not in later_reqs]
    left_fe: dict[int, int] = {}
    emits: dict[int, list[int]] = {id(q): [] for q in every}
    active: list[SimRequest] = []
    nxt = 0
    while True:
        now = eng.virtual_ns
        done = []
        while nxt < len(todo) and todo[nxt][0] <= now:
            _, _, req = todo[nxt]
            done += fe.add(req.arrival_ns / 1e9, req, fe.work(req.prompt_len), fe.reads(req.prompt_len))
            nxt += 1
        done += fe.advance(now / 1e9)
        for t, req in done:
            _make_resident(eng.pool, req.block_hashes[:hits[id(req)]])
            eng.submit(req)
            req.queued_ns = left_fe[id(req)] = int(t * 1e9)
            active.append(req)
        if eng.step_offline():
            t = eng.virtual_ns
            for q in active:
                if len(emits[id(q)]) < len(q.events):
                    emits[id(q)] += [t] * (len(q.events) - len(emits[id(q)]))
                if q.finish is not None and id(q) in follow:
                    nq, gap = follow.pop(id(q))
                    nq.arrival_ns = q.last_token_ns + gap
                    insort(todo, (nq.arrival_ns, hits[id(nq)], nq), lo=nxt, key=lambda x: x[0])
            active = [q for q in active if q.finish is None]
            continue
        later = [x for x in (todo[nxt][0] / 1e9 if nxt < len(todo) else None, fe.next_finish()) if x is not None]
        if not later:
            break
        eng.virtual_ns = max(eng.virtual_ns, int(min(later) * 1e9) + 1)
    if stats is not None and eng.offload is not None:
        t = eng.offload
        stats.update(stored=t.stored_blocks, loaded=t.loaded_blocks, cpu_evicted=t.evicted_blocks,
                     gpu_evicted=t.gpu_evicted, gpu_evicted_unstored=t.gpu_evicted_unstored,
                     walks=t.walks, walk_restarts=t.walk_restarts)
    out = []
    for q in every:
        first, last = q.first_token_ns - q.arrival_ns, q.last_token_ns - q.arrival_ns
        times = [t for t, ev in zip(emits[id(q)], q.events) if ev[0] > 0]
        out.append({"ttft_ms": first / 1e6, "e2e_ms": last / 1e6,
                    "tpot_ms": (last - first) / 1e6 / (q.num_out - 1) if q.num_out > 1 else None,
                    "frontend_ms": (left_fe[id(q)] - q.arrival_ns) / 1e6,
                    "queue_ms": (q.scheduled_ns - q.queued_ns) / 1e6,
                    "prefill_ms": (q.first_token_ns - q.scheduled_ns) / 1e6,
                    "itl": [(b - a) / 1e6 for a, b in zip(times, times[1:])],
                    "cached": q.hit_last_admission, "cached_tier": q.hit_last_tier, "end_ns": q.last_token_ns + t0,
                    "preemptions": q.preemptions})
    return out


def timing_with(built, calib: dict) -> StepTiming:
    """The step timing of `built` with some calibration constants replaced."""
    prof = built.res.profile
    prof = prof.model_copy(update={"calibration": prof.calibration.model_copy(update=calib)})
    return StepTiming(dataclasses.replace(built.res, profile=prof), built.cfg.spec_k,
                      offload=built.cfg.kv_offload)


def _impose_hit(eng, req: SimRequest, hit: int | None) -> None:
    """Before `req`'s lookup (until its first token, as vLLM 0.24 reports the hit of the latest
    admission): its first `hit` blocks in the tier (or still on the GPU) and the next one nowhere,
    so the lookup finds exactly the recorded hit."""
    if hit is None or req.num_out:
        return
    hashes = req.block_hashes
    cut = hashes[hit] if hit < len(hashes) else None
    if eng.offload is not None:
        eng.offload.impose(hashes[:hit], cut)
    if cut is not None:
        eng.pool.forget(cut)


def _make_resident(pool, hashes: list[int]) -> None:
    """Cache these blocks in the pool (as earlier turns of the session left them)."""
    new = [h for h in hashes if h not in pool.cached]
    blocks = pool.allocate(len(new)) if new else []
    if blocks is None:
        raise RuntimeError("replay: the recorded prefix hits do not fit the KV pool")
    for b, h in zip(blocks, new):
        pool.commit(b, h)
    pool.release(blocks)


def measured(records: list[dict]) -> list[dict]:
    """The records a summary counts: finished ok, not warm-up."""
    return [r for r in records if r.get("ok") and not r.get("warmup")]


def figures(rows: list[dict]) -> dict:
    """TTFT p50/p90, TPOT p50, E2E p50 (ms) of per-request rows, as the summary computes them."""
    ttft = dist([r["ttft_ms"] for r in rows])
    return {"ttft_p50": ttft["p50"], "ttft_p90": ttft["p90"],
            "tpot_p50": dist([r["tpot_ms"] for r in rows if r["tpot_ms"]])["p50"],
            "e2e_p50": dist([r["e2e_ms"] for r in rows])["p50"]}


def replay_figures(cfg: SimConfig, records: list[dict], calib: dict | None = None) -> dict:
    """`figures` of the measured requests of a replay."""
    ok = [r for r in records if r.get("ok")]
    rows = replay(cfg, records, calib)
    return figures([m for r, m in zip(ok, rows) if not r.get("warmup")])


def per_seq_for_anchor(cfg: SimConfig, attn_mbu: float, anchor: tuple[int, int, float]) -> float:
    """The per-sequence overhead (us) at which the steady decode step of `anchor` = (streams,
    context, TPOT ms) is exact, given the KV-read efficiency `attn_mbu`."""
    t = timing_with(build_engine(cfg.model_copy(update={"spec_k": 0})),
                {"attn_mbu": attn_mbu, "per_seq_overhead_us": 0.0})
    b = t.new_batch()
    for _ in range(anchor[0]):
        b.add_decode(None, anchor[1], 1)
    return (anchor[2] / 1e3 - t.step_seconds(b)) / anchor[0] * 1e6


def h200_runs(data: Path) -> list[tuple[str, SimConfig, list[dict], dict]]:
    """(name, simulator config, records, summary) of the H200 base and EAGLE3 runs."""
    import orjson

    out = []
    for name, spec in (("base", {}), ("spec", {"spec_k": 3, "synthetic_al": 2.78})):
        d = RunDir(data / name)
        recs = read_jsonl(d.requests, strict=True)[0]
        cfg = SimConfig(profile="h200-qwen3-8b-bf16", **spec)
        out.append((name, cfg, recs, orjson.loads(d.summary.read_bytes())))
    return out


# the steady decode step the per-sequence overhead is tied to: 8 streams of 2,000 + 128 tokens
# at TPOT 6.12 ms (docs/references.md §5)
DECODE_ANCHOR = (8, 2128, 6.12)
