"""`--ray`: worker processes as Ray actors, on a private single-node Ray (`--ray local`) and on
a two-node cluster started on this machine with Ray's `cluster_utils.Cluster`, one node of
which is removed mid-run.

The embedded simulator's truth log is the referee: every request the actors sent reached the
server and is in the merged records exactly once, lanes are split over the actors as with
local workers, and the gathered timestamps are in the driver's clock (causal against the
server's arrival times). Multi-host clock handling is checked on its own pure function.
"""
from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

ray = pytest.importorskip("ray")

from agentx.engine.ray_pool import INSTANT_FIELDS, pack, shift_record_line, unpack  # noqa: E402
from agentx.records import read_records  # noqa: E402
from agentx.run import RunConfig, run  # noqa: E402
from agentx.targets.embedded import EmbeddedSim  # noqa: E402
from helpers import write_trace  # noqa: E402

pytestmark = pytest.mark.slow


def _trace(path: Path) -> Path:
    return write_trace(path, sessions=4, turns=6, think=0.05, out=8)


@pytest.fixture(scope="module")
def ray_local():
    """One private Ray for the module's `--ray local` tests (a Ray start costs 10-30 s of CI
    CPU): the run never shuts down a Ray it finds running, as a user's driver would want."""
    yield "local"
    if ray.is_initialized():
        ray.shutdown()


def test_ray_actors_run_the_lanes_and_records_are_gathered(tmp_path, ray_local):
    truth = tmp_path / "truth.jsonl"
    cfg = RunConfig(trace=str(_trace(tmp_path / "tr")), conc=4, duration_s=4.0, seed=2,
                    workers="2", ray=ray_local, output_dir=str(tmp_path / "out"),
                    progress=False, scrape_interval_s=1.0, drain_timeout_s=10.0)
    sim = EmbeddedSim({"fixed_ttft_ms": 20, "fixed_itl_ms": 5, "truth_log": str(truth),
                       "profile": "cpu-tiny"})
    s = run(cfg, sim)
    recs = read_records(tmp_path / "out" / "requests.jsonl")
    assert s["client"]["backend"] == "ray" and s["client"]["workers"] == 2
    assert s["client"]["hosts"] and s["failed"] == 0 and s["completed"] > 10
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids))
    with open(truth, "rb") as f:
        arrived = {d["request_id"]: d for d in map(orjson.loads, f) if d}
    assert set(ids) == set(arrived)
    assert {r["lane"] for r in recs} == {0, 1, 2, 3}
    # the gathered timestamps are on the driver's (here: the server's) monotonic clock
    for r in recs:
        assert r["start_ns"] <= arrived[r["request_id"]]["arrival_ns"] <= r["end_ns"]
    # both actors started at the shared instant: their first requests are close together
    firsts = {}
    for r in recs:
        firsts[r["lane"] % 2] = min(firsts.get(r["lane"] % 2, r["start_ns"]), r["start_ns"])
    # one gate (RayPool._open_gate), 0.5 s ahead; an actor's process woke 115 ms late once on
    # the loaded CI machine (4 test workers on 2 cores beside Ray's own processes)
    assert abs(firsts[0] - firsts[1]) < 0.25e9
    assert (tmp_path / "out" / "summary.json").exists()


def test_an_actor_that_fails_while_starting_does_not_hold_the_others(tmp_path, ray_local):
    """The driver starts the actors once every one still running is ready (RayPool._open_gate):
    an actor whose run fails before it is ready (here: a tokenizer directory its host does not
    have) is reported and left out, and the other starts and runs its lanes to the end."""
    import asyncio

    from agentx.client.config import ClientConfig
    from agentx.engine.drive import DriveShare, workload_of
    from agentx.engine.ray_pool import RayPool
    from agentx.sim.config import SimConfig
    from agentx.targets.embedded import start_in_process

    sim = start_in_process(SimConfig(port=0, profile="cpu-tiny", fixed_ttft_ms=20, fixed_itl_ms=5))
    try:
        cfg = RunConfig(trace=str(_trace(tmp_path / "tr")), conc=4, duration_s=3.0, seed=2,
                        drain_timeout_s=10.0)
        specs = [DriveShare(workload=workload_of(cfg, "t"),
                            client=ClientConfig(base_url=sim.base_url, model="agentx-sim"),
                            lanes=[w, w + 2], max_requests=None,
                            records_path=str(tmp_path / f"requests.w{w}.jsonl"),
                            token_info={"mode": "builtin"}, max_model_len=None,
                            pool_blocks=None, worker=w) for w in range(2)]
        specs[1].token_info = {"mode": "hf", "tokenizer": str(tmp_path / "no-such-tokenizer")}
        pool = RayPool(ray_local, specs)
        pool.start()
        results = asyncio.run(asyncio.wait_for(pool.wait(), 120))
    finally:
        sim.stop()
    assert [r.worker for r in results] == [0] and "no-such-tokenizer" in pool.errors[1]
    assert results[0].stop_reason == "duration"
    recs = read_records(tmp_path / "requests.w0.jsonl")
    assert recs and {r["lane"] for r in recs} == {0, 2} and all(r["ok"] for r in recs)


def test_an_actor_that_dies_before_its_first_answer_is_placed_again(tmp_path, ray_local):
    """RayPool._place: a fresh actor that dies before it answers (clean-clone CI once saw Ray
    report one dead as "all references removed" on a loaded host) is replaced; the run goes on
    with one actor per spec. Here the first actor to start exits in its constructor."""
    from agentx.engine.ray_pool import LaneWorker, RayPool

    marker = tmp_path / "first-died"

    class DiesOnce(LaneWorker):  # local: Ray ships it by value
        def __init__(self) -> None:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return super().__init__()
            os.close(fd)
            os._exit(1)

    pool = RayPool(ray_local, [])
    pool.specs = [None, None]  # _place only counts them
    actors, clocks = pool._place(ray.remote(num_cpus=1)(DiesOnce))
    assert marker.exists() and len(actors) == 2 and len(clocks) == 2
    assert all(c["host"] for c in clocks)
    assert len({a._actor_id for a in actors}) == 2
    for a in actors:  # their CPUs, for the module's next test on this Ray
        ray.kill(a)


def test_records_from_another_host_move_into_the_drivers_clock(tmp_path):
    rec = {"request_id": "a", "start_ns": 5_000, "end_ns": 9_000, "first_token_ns": 6_000,
           "first_content_ns": 0, "intended_send_ns": 4_000, "chunk_offsets_ns": [1_000]}
    out = orjson.loads(shift_record_line(orjson.dumps(rec), -1_000))
    for k in INSTANT_FIELDS:
        assert out[k] == (rec[k] - 1_000 if rec[k] else 0)  # 0 means "never happened"
    assert out["chunk_offsets_ns"] == [1_000]  # offsets are relative: unchanged
    # files travel as bytes: a trace directory round-trips through pack/unpack
    src = _trace(tmp_path / "tr")
    name, data = pack(str(src))
    dest = tmp_path / "dest"
    dest.mkdir()
    back = Path(unpack(name, data, str(dest)))
    assert sorted(p.name for p in back.iterdir()) == sorted(p.name for p in src.iterdir())
    one = "trace_0000.json"
    assert (back / one).read_bytes() == (src / one).read_bytes()


@pytest.fixture()
def two_node_cluster():
    """A Ray cluster of two nodes on this machine (Ray's own test harness), one CPU each: one
    lane actor fits per node, so the two actors must land on different nodes."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # the module's local Ray: this test's driver joins the cluster
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_ray_cluster_lanes_on_two_nodes_and_a_node_dies(tmp_path, two_node_cluster, capfd):
    """Lanes on two nodes, records and /metrics gathered from both; then the second node is
    removed mid-run: its actor is reported dead (naming its node), the records it had finished
    are kept, the other node's lanes run to the end and the run still writes its summary."""
    import threading
    import time

    cluster, worker_node = two_node_cluster
    out = tmp_path / "out"
    truth = tmp_path / "truth.jsonl"
    cfg = RunConfig(trace=str(_trace(tmp_path / "tr")), conc=4, duration_s=8.0, seed=2,
                    workers="2", ray=cluster.address, output_dir=str(out), progress=False,
                    scrape_interval_s=1.0, drain_timeout_s=5.0)
    sim = EmbeddedSim({"fixed_ttft_ms": 20, "fixed_itl_ms": 5, "truth_log": str(truth),
                       "profile": "cpu-tiny"})
    parts = [out / "requests.w0.jsonl", out / "requests.w1.jsonl"]
    seen: dict[str, int] = {}

    def kill_second_node() -> None:
        # once both actors have streamed finished records to the driver, remove a node
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and min(_lines(p) for p in parts) < 3:
            time.sleep(0.1)
        seen.update({p.name: _lines(p) for p in parts})
        cluster.remove_node(worker_node, allow_graceful=False)

    killer = threading.Thread(target=kill_second_node, daemon=True)
    killer.start()
    t0 = time.monotonic()
    s = run(cfg, sim)
    took = time.monotonic() - t0
    killer.join(5)
    assert seen and min(seen.values()) >= 3, seen  # both nodes were sending before the kill
    err = capfd.readouterr().err
    assert "agentx: worker w" in err and "on Ray node" in err
    dead = 0 if "agentx: worker w0 (lanes 0, 2) lost: " in err else 1
    assert s["stop_reason"].startswith(f"error: worker w{dead} ")  # a lost worker fails the run
    # the survivor ran on another node than the dead actor: hosts carry the Ray node id
    (host,) = s["client"]["hosts"]
    dead_node = err.split("on Ray node ")[1].split(":")[0]
    assert host.split("/")[1] != dead_node
    recs = read_records(out / "requests.jsonl")
    lanes_dead = set(range(dead, 4, 2))
    mine = [r for r in recs if r["lane"] in lanes_dead]
    # what the dead node had finished and streamed before it went is in the merged records
    assert len(mine) >= seen[f"requests.w{dead}.jsonl"]
    others = [r for r in recs if r["lane"] not in lanes_dead]
    assert max(r["end_ns"] for r in others) > max(r["end_ns"] for r in mine)  # the rest went on
    with open(truth, "rb") as f:
        arrived = {d["request_id"] for d in map(orjson.loads, f) if d}
    assert {r["request_id"] for r in recs} <= arrived  # every gathered record reached the server
    assert s["server_metrics"]["available"]  # /metrics scraped over the whole run
    assert (out / "summary.json").exists() and took < 80  # no hang on the dead actor
