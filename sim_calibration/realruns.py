"""The real H200 runs shipped under tests/data (and the H100 runs, `h100_timed`), with the simulator
config each was served with.

Each entry names a run's records and summary and the vLLM server flags its README states (speculative
decoding, forced pool size, offload connector); the pool size itself is the one the run's summary
recorded. `keys()` re-derives every request's KV block identities from the trace (as
agentx.cache_theory.tiers does for the client's cache model), so a replay can let the simulator's own
prefix cache decide hits where the pool is far smaller than the working set. `jittered()` gives
the send times of one replay of an ensemble (bench/sim_vs_real.py --replays).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import orjson

from agentx.prompt.synth import Conversation, SynthConfig
from agentx.prompt.token_model import builtin_model
from agentx.rundir import RunDir, read_jsonl
from agentx.sim.config import SimConfig
from agentx.sim.profile import load_profile
from agentx.trace.model import Turn

PROFILE = "h200-qwen3-8b-bf16"
# the runs ship with the repository, not the package: found from this file in a checkout (or an
# editable install of one), whatever the working directory
DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


@dataclass
class RealRun:
    name: str
    requests: Path
    summary: Path
    server: dict  # SimConfig fields of the server flags (beyond the pool size)
    small_pool: bool  # pool far below the working set: hits come from the simulated cache
    group: str = ""  # runs of one configuration share a group (their run-to-run spread); "" = name
    device: str = "H200"  # the GPU it ran on; the profile (PROFILE) times an H200

    def __post_init__(self) -> None:
        self.group = self.group or self.name

    @property
    def calib(self) -> dict[str, float]:
        """The profile's calibration constants to replace for this run's GPU (`device_calib`)."""
        return device_calib(self.device)

    def load(self) -> tuple[SimConfig, list[dict], dict]:
        recs = read_jsonl(self.requests, strict=True)[0]
        summ = orjson.loads(self.summary.read_bytes())
        cfg = SimConfig(profile=PROFILE, kv_pool_tokens=summ["cache"]["kv_pool_tokens"], **self.server)
        return cfg, recs, summ


# HBM bandwidth per GPU (TB/s), NVIDIA's H100 SXM and H200 datasheets. Both are the same die with
# the same dense BF16 peak (989 TFLOPS): an H100's steps are the H200 profile's with the parts that
# read memory slower by this ratio.
HBM_TBPS = {"H200": 4.8, "H100": 3.35}


def device_calib(device: str) -> dict[str, float]:
    """Calibration overrides that price PROFILE's steps on `device`: its weight and KV reads
    (`mbu`, `attn_mbu`) scaled by the GPU's HBM bandwidth over the profile's; {} on the profile's
    own GPU. Everything else stays the H200's: the FLOP efficiencies (the same die), the host-side
    constants and the front end (fitted on the H200's host), the copy rates (measured there)."""
    prof = load_profile(PROFILE)
    ratio = HBM_TBPS[device] / prof.hardware.hbm_tbps
    if ratio == 1:
        return {}
    cal = prof.calibration
    return {"mbu": cal.mbu * ratio, "attn_mbu": cal.attn_mbu * ratio}


# vLLM 0.24.0's SimpleCPUOffloadConnector, cpu_bytes_to_use 64,424,509,440, lazy_offload: true,
# whose lazy store is a walk over the GPU free queue holding the blocks it copies
# (offload_store_walk; the simulator's default stores on eviction, see docs/simulator.md)
_OFFLOAD = {"kv_offload": "simple-cpu", "offload_gb": 64.424509440, "offload_store": "lazy",
            "offload_store_walk": True}


def _files(folder: Path, prefix: str = "") -> tuple[Path, Path]:
    """A run's records and summary: a run directory's (RunDir names), or copies of them named
    `<prefix>requests.jsonl` and `<prefix>summary.json` side by side."""
    return folder / f"{prefix}{RunDir.REQUESTS}", folder / f"{prefix}{RunDir.SUMMARY}"


def runs(data: Path) -> list[RealRun]:
    """Every run under data/h200-runs, h200-runs-2, -3, -5, -6, -7 and -8 (READMEs there give the
    flags); offb-r1, offb-r2 (h200-runs-3), o32 (h200-runs-5), offbp, offbp2 (h200-runs-6) and
    offbp3 (h200-runs-7) repeat offb's configuration on the same server: one group. cap32
    (h200-runs-6), cap32p and cap32p2 (h200-runs-7) are that pool without a connector: another.
    off54, off68 and off75 (h200-runs-8) are offb's configuration with a 54, 68 and 75 GB tier;
    off68b repeats off68; h200-runs-9 repeats offb (offbp4), off54 (off54b, off54c), off68 (off68c)
    and off75 (off75b), so each tier size is a group: off54 and off68 of three, off75 of two."""
    a, b, c = data / "h200-runs", data / "h200-runs-2", data / "h200-runs-3"
    e, f, g = data / "h200-runs-5", data / "h200-runs-6", data / "h200-runs-7"
    h, i = data / "h200-runs-8", data / "h200-runs-9"
    out = [RealRun("base", *_files(a / "base"), {}, False),
           RealRun("spec", *_files(a / "spec"), {"spec_k": 3, "synthetic_al": 2.78}, False),
           RealRun("offA", *_files(a / "offA"), {}, True),
           RealRun("offB", *_files(a / "offB"), _OFFLOAD, True),
           RealRun("spec32", *_files(b, "spec32-"), {"spec_k": 3, "synthetic_al": 2.5}, False),
           RealRun("offb", *_files(b, "offb-"), _OFFLOAD, True),
           *(RealRun(f"offb-{r}", *_files(c, f"offb-{r}-"), _OFFLOAD, True, group="offb")
             for r in ("r1", "r2")),
           RealRun("o32", *_files(e, "o32-"), _OFFLOAD, True, group="offb"),
           *(RealRun(r, *_files(f, f"{r}-"), _OFFLOAD, True, group="offb")
             for r in ("offbp", "offbp2")),
           RealRun("offbp3", *_files(g, "offbp3-"), _OFFLOAD, True, group="offb"),
           RealRun("offbp4", *_files(i, "offbp4-"), _OFFLOAD, True, group="offb"),
           RealRun("cap32", *_files(f, "cap32-"), {}, True),
           *(RealRun(r, *_files(g, f"{r}-"), {}, True, group="cap32") for r in ("cap32p", "cap32p2")),
           # offb's configuration with other tier sizes (54, 68 and 75 GB), each with its repeats
           *(RealRun(name, *_files(d, f"{name}-"), {**_OFFLOAD, "offload_gb": gb}, True, group=f"off{gb:.0f}")
             for d, name, gb in ((h, "off54", 54.0), (i, "off54b", 54.0), (i, "off54c", 54.0),
                                 (h, "off68", 68.0), (h, "off68b", 68.0), (i, "off68c", 68.0),
                                 (h, "off75", 75.0), (i, "off75b", 75.0)))]
    return [r for r in out if r.requests.exists()]


def h100_timed(data: Path) -> list[RealRun]:
    """Every run under data/h100-runs, -2 and -3, judged on their timing by bench/sim_vs_real.py
    --device H100 (the profile priced for an H100: `device_calib`): `h100_runs`' three tier runs
    (h100-off75 and h100-off75b one group); h100-runs-2's base at 8 lanes twice (one group),
    EAGLE3 at 8 and 32 lanes, and the capped pool without a tier; h100-runs-3's cold starts of
    offA's and offB's configurations and a second EAGLE3 run at 32 lanes (120 s where h100-spec32
    ran 90 s: not one group). On an H100's pool EAGLE3's 32 lanes overflow it (5-6 % hits): those
    runs let the simulated cache decide."""
    b, c = data / "h100-runs-2", data / "h100-runs-3"
    spec = {"spec_k": 3, "synthetic_al": 2.5}
    out = [*(RealRun(f"h100-{n}", *_files(b, f"h100-{n}-"), {}, False, group="h100-base8", device="H100")
             for n in ("base8", "base8b")),
           RealRun("h100-spec8", *_files(b, "h100-spec8-"), spec, False, device="H100"),
           RealRun("h100-cap32", *_files(b, "h100-cap32-"), {}, True, device="H100"),
           RealRun("h100-spec32", *_files(b, "h100-spec32-"), spec, True, device="H100"),
           RealRun("h100-offA", *_files(c, "h100-offA-"), {}, True, device="H100"),
           RealRun("h100-offB", *_files(c, "h100-offB-"), _OFFLOAD, True, device="H100"),
           RealRun("h100-spec32b", *_files(c, "h100-spec32b-"), spec, True, device="H100")]
    return [r for r in out if r.requests.exists()] + h100_runs(data)


def jittered(records: list[dict], ms: float, replay: int) -> list[dict]:
    """The records as replay number `replay` of an ensemble sends them: replay 0 at the recorded
    send times (the records themselves), any other with each `start_ns` moved by a uniform draw in
    [-ms, +ms] milliseconds from a generator seeded with `replay` (so an ensemble is reproducible).

    Why: the runs with the offload connector are chaotic (32 lanes on a pool far smaller than the
    working set: a send time moved by a millisecond changes which request is admitted, preempted
    or evicted first), so a single replay of them moves by 10-20 points with any change and cannot
    say whether the model is within bounds; the median over slightly perturbed replays can."""
    if replay == 0:
        return records
    rng = random.Random(replay)
    return [r if r.get("start_ns") is None else {**r, "start_ns": r["start_ns"] + round(rng.uniform(-ms, ms) * 1e6)}
            for r in records]


def keys(records: list[dict], summary: dict, block_size: int, traces) -> dict[str, list[int]]:
    """request_id -> chained hashes of the request's full `block_size`-token blocks, derived from
    its trace turn (session instances namespaced as the client did), so equal prefixes share
    blocks exactly as the run's prompts did."""
    cfg = summary["config"]
    by_id = {t.id: t for t in traces.traces}
    turns = {tid: [s for s in t.steps if isinstance(s, Turn)] for tid, t in by_id.items()}
    trace_bs = traces.block_size * cfg["context_scale"]
    tm = builtin_model()
    convs: dict[str, Conversation] = {}
    out: dict[str, list[int]] = {}
    for r in sorted((r for r in records if r.get("start_ns")), key=lambda r: r["start_ns"]):
        sid = r["session_id"]
        if sid not in convs:
            salt, instance = sid.split("-", 1)
            sc = SynthConfig(run_ns=salt, shared_prefix=cfg.get("shared_prefix", "none"),
                             context_scale=cfg["context_scale"])
            convs[sid] = Conversation(by_id[r["trace_id"]], instance.split("/", 1)[0], sc, tm)
        ks = convs[sid].block_keys(turns[r["trace_id"]][r["turn"]].hash_ids)
        chain, h = [], 0
        for k in ks:
            h = hash((h, k))
            chain.append(h)
        n = r["isl"] // block_size
        out[r["request_id"]] = [hash((chain[min(len(chain) - 1, math.ceil((j + 1) * block_size / trace_bs) - 1)], j))
                                for j in range(n)] if chain else []
    return out


def h100_runs(data: Path) -> list[RealRun]:
    """The SimpleCPUOffload runs under data/h100-runs (h100-runs/README.md): offb's configuration
    and its 75 GB tier (h100-off75 and h100-off75b one group) on one H100, probed with the block
    fates (AGENTX_STEPLOG_FATES=1) that bench/tier_breaks.py counts (the tier's hit decision: which
    block a lookup stops at). Not in `runs`, the profile's own GPU's; bench/sim_vs_real.py
    --device H100 judges their timing with the other H100 runs (`h100_timed`)."""
    d = data / "h100-runs"
    out = [RealRun(f"h100-{name}", *_files(d, f"h100-{name}-"), {**_OFFLOAD, "offload_gb": gb}, True,
                   group=group, device="H100")
           for name, gb, group in (("offb", _OFFLOAD["offload_gb"], ""), ("off75", 75.0, "h100-off75"),
                                   ("off75b", 75.0, "h100-off75"))]
    return [r for r in out if r.requests.exists()]
