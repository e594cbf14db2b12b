"""Ranks on three Ray nodes of one machine (loopback aliases 127.0.0.2-4), against the single-process reference.

What research/ray_multihost.md §7 asks, in the order the module runs it:
(f) a placement the cluster cannot meet fails start at once, naming the rank and the host, and
    leaves nothing; one whose resources are held elsewhere fails after the placement timeout,
    saying what is free;
(b, h) every differential fixture and the tiny Orpheus, spread over the nodes (two engines at a
    time), give the reference's outputs; each clean shutdown leaves no actor, placement group,
    process or segment, and the cluster running;
(a, c) a four-rank engine (rank 3 placed by node labels): each rank on its host, bound there, the
    conductor without torch; a frame without the run token dropped; tensors between nodes inline,
    within a node through shared memory;
(d) SIGKILL of a remote worker, and of a remote rank's actor: its requests end within 1 s naming
    the rank and host, the rank restarts in its bundle, the next request is served;
(e) a removed node: its requests fail within 5 s, the server stays degraded with a message (no
    hang, new requests fail at once), a new placement on that host is refused; the node comes
    back and so does the rank;
(g) SIGKILL of the conductor takes every actor and worker down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import msgspec
import pytest

from tests.polling import alive, wait_for
from tests.ray.conftest import (
    CPUS,
    HEAD,
    NODE_A,
    NODE_B,
    OBJECT_STORE,
    leaves_nothing_behind,
    named_actors,
    ray,
    ray_placement,
)
from tests.runtime.conftest import comparable_events, comparable_reference, reference
from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import WalkserveError
from walkserve.core.finish import FinishReason
from walkserve.entrypoint.sync import Engine
from walkserve.protocol.rank_stats import RuntimeSnapshot
from walkserve.testing.fixtures.requests import fixture_request
from walkserve.transport import shm

pytestmark = pytest.mark.slow
HOSTS = {0: None, 1: NODE_A, 2: NODE_B}  # rank -> host (None: the conductor's node, the head)
START_S = 240.0  # a loaded 2-core machine imports torch slowly; nothing here waits this long when it works


def config(cluster, **kw) -> RuntimeConfig:
    return RuntimeConfig(ray_address=cluster.address, start_timeout_s=START_S, **kw)


def cpu_ranks(n: int) -> list[dict]:
    return [{"id": r, "device": "cpu", **({"host": HOSTS[r]} if HOSTS[r] else {})} for r in range(n)]


def four_ranks() -> list[dict]:
    """Ranks 0-2 by host; rank 3 by node labels (only 127.0.0.4 carries zone=b)."""
    return [*cpu_ranks(3), {"id": 3, "device": "cpu", "node_labels": {"zone": "b"}}]


def stats_of(engine: Engine) -> RuntimeSnapshot:
    engine.stats()
    return engine.status.stats


def by_rank(d: dict) -> dict[int, object]:
    return {int(k): v for k, v in d.items()}


# ---- (f) placements the cluster cannot meet ---------------------------------------------------------


def test_an_infeasible_host_fails_start_at_once_naming_rank_and_host(local_cluster):
    print(f"figure: three-node cluster up and this driver connected in {local_cluster.start_s:.1f} s")
    before = set(ray.util.placement_group_table())
    place = ray_placement([{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu", "host": "127.0.0.9"}],
                          [{"nodes": ["lm"], "ranks": [0, 1]}])
    t0 = time.monotonic()
    with pytest.raises(WalkserveError) as err:
        Engine.start("fixture-lm", placement=place, config=config(local_cluster))
    message = str(err.value)
    assert time.monotonic() - t0 < 60  # the conductor's start (imports ray), not a placement wait
    assert f"ranks[1]: host 127.0.0.9 is not in the Ray cluster (alive: {HEAD}, {NODE_A}, {NODE_B})" in message
    assert set(ray.util.placement_group_table()) == before  # refused before any placement group existed
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("ws-")]


def test_resources_held_elsewhere_fail_after_the_placement_timeout_saying_what_is_free(local_cluster):
    from ray.util.placement_group import placement_group, remove_placement_group

    free = ray._private.state.available_resources_per_node()
    node_a = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == NODE_A and n["Alive"])
    hog = placement_group([{"CPU": free[node_a]["CPU"], f"node:{NODE_A}": 0.001}])
    assert hog.wait(30)
    try:
        place = ray_placement(cpu_ranks(2), [{"nodes": ["lm"], "ranks": [0, 1]}])
        t0 = time.monotonic()
        with pytest.raises(WalkserveError) as err:
            Engine.start("fixture-lm", placement=place, config=config(local_cluster, placement_timeout_s=2))
        message = str(err.value)
        assert "within 2 s" in message and f"ranks[1]: host {NODE_A} has CPU 0 free of the CPU 1 needed" in message
        assert time.monotonic() - t0 < 90
        table = ray.util.placement_group_table()
        assert all(v["state"] == "REMOVED" for k, v in table.items() if v["name"].startswith("ws-"))
    finally:
        remove_placement_group(hog)


# ---- (b, h) every differential fixture and the tiny Orpheus, spread over the nodes -------------------

SPREAD = {  # family -> (node -> rank, per-walk overrides), on two ranks; fixture-image: the four-rank engine below
    "fixture-lm": ({"lm": 0}, {("decode", "lm"): 1}),
    "fixture-tts": ({"lm": 0, "codec": 1}, {}),
    "fixture-omni": ({"thinker": 0, "talker": 1, "code2wav": 1}, {}),
    "fixture-rollout": ({"encoder": 1, "predictor": 0}, {}),
    "fixture-nested": ({"a": 0, "b": 1, "c": 1}, {}),
    "fixture-multimodal": ({"vision": 1, "audio_enc": 1, "lm": 0}, {("decode", "lm"): 1}),
}
AT_ONCE = 3  # engines started and served side by side (their rank 0s fill the head's CPUS): much of each start is waiting


def two_ranks(second: str) -> list[dict]:
    return [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu", "host": second}]


def spread(family: str, second: str) -> dict:
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    assign, per_walk = SPREAD[family]
    nodes = [{"nodes": [node], "ranks": [r]} for node, r in assign.items()]
    nodes += [{"nodes": [node], "ranks": [r], "walks": [walk]} for (walk, node), r in per_walk.items()]
    rest = [x for x in load_model(ModelRef(family)).graph().node_names() if x not in assign]
    if rest:
        nodes.append({"nodes": rest, "ranks": [0]})
    return ray_placement(two_ranks(second), nodes)


def serve_and_close(cluster, model: str, place: dict, requests: list, **kw) -> tuple[list, RuntimeSnapshot]:
    """Results of ``requests`` on an engine over the cluster; after its clean shutdown nothing of it is left."""
    engine = Engine.start(model, placement=place, config=config(cluster, cohorts=model != "fixture-lm"), **kw)
    try:
        results = engine.run(requests, timeout=120)
        stats = stats_of(engine)
    finally:
        engine.close(drain_s=5)
    leaves_nothing_behind(stats, engine.engine.spec.run_id)
    second = place["ranks"][1]["host"]
    assert stats.hosts == {0: HEAD, 1: second}
    return results, stats


def fixture_job(cluster, family: str, second: str) -> None:
    ref = reference(family)
    requests = [fixture_request(family, 100 + i) for i in range(8)]
    results, _ = serve_and_close(cluster, family, spread(family, second), requests)
    for req, res in zip(requests, results, strict=True):
        want = ref.run(req)
        assert res.finished is not None and res.finished.reason == want.finish, (req.id, res.finished)
        assert comparable_events(res.events) == comparable_reference(want), req.id


def orpheus_job(cluster, path: str) -> None:
    """The tiny Orpheus split over the head and 127.0.0.4 gives the audio of one local process, bit for bit."""
    import walkserve.placements
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    proc = load_model(ModelRef("orpheus", path)).processor()
    texts = ("Hello there, how are you today?", "One, two, three, four.", "A short one.")
    specs = [proc.build_request("speech", {"input": t, "voice": proc.voices[i]},
                                proc.sampling(temperature=0.0 if i < 2 else 0.6, max_tokens=40 + 7 * i, seed=100 + i), proc.check_params({}))
             for i, t in enumerate(texts)]
    with Engine.start("orpheus", model_path=path, placement=str(walkserve.placements.path("orpheus-colocated"))) as local:
        want = local.run(specs, timeout=120)
    split = ray_placement(two_ranks(NODE_B), [{"nodes": ["lm"], "ranks": [0]}, {"nodes": ["codec"], "ranks": [1]}])
    got, _ = serve_and_close(cluster, "orpheus", split, specs, model_path=path)
    for w, g in zip(want, got, strict=True):
        assert g.finished.reason == w.finished.reason
        audio = [(e.index, e.data.data) for e in g.modality("audio")]
        assert audio and audio == [(e.index, e.data.data) for e in w.modality("audio")]


def test_every_differential_fixture_and_the_tiny_orpheus_match_the_reference_and_leave_nothing(local_cluster, tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    from walkserve.models.orpheus.tiny import write_tiny_orpheus

    path = str(write_tiny_orpheus(tmp_path_factory.mktemp("orpheus_ray"), lm="tiny", snac="tiny", seed=3))
    jobs = {family: (fixture_job, local_cluster, family, (NODE_A, NODE_B)[i % 2]) for i, family in enumerate(SPREAD)}
    jobs["orpheus"] = (orpheus_job, local_cluster, path)
    with ThreadPoolExecutor(AT_ONCE) as pool:  # threads made here, in the cluster's namespace: so are their engines
        futures = {name: pool.submit(*job) for name, job in jobs.items()}
    failures = {name: f"{type(e).__name__}: {e}" for name, f in futures.items() if (e := f.exception()) is not None}
    assert not failures, failures
    assert set(shm.segments()) <= local_cluster.shm_before
    assert sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]) == [HEAD, NODE_A, NODE_B]  # the cluster goes on


# ---- (a, c, d, e, g) one engine on four ranks over three nodes ------------------------------------

FOUR = ray_placement(four_ranks(), [
    {"nodes": ["encode", "vae"], "ranks": [0]},
    {"nodes": ["cond_text"], "ranks": [1]},
    {"nodes": ["cond_image", "combine"], "ranks": [2]},
    {"nodes": ["uncond"], "ranks": [3]},
])


@pytest.fixture(scope="module")
def four(local_cluster):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WALKSERVE_SHM_INLINE_BYTES", "0")  # every tensor above 0 bytes takes shm where it may (forwarded to the ranks)
        engine = Engine.start("fixture-image", placement=FOUR, config=config(local_cluster, placement_timeout_s=2))
    try:
        yield engine
    finally:
        engine.close(drain_s=0)


def long_requests(n: int, seed: int) -> list:
    reqs = [fixture_request("fixture-image", seed + i) for i in range(n)]
    for r in reqs:
        r.params = msgspec.structs.replace(r.params, steps=400, sleep_ms=10)
    return reqs


def run_in_background(engine: Engine, requests: list) -> tuple[threading.Thread, dict]:
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(results=engine.run(requests, timeout=60)), daemon=True)
    thread.start()
    assert wait_for(lambda: engine.stats(fresh=False).running == len(requests), timeout=30)
    time.sleep(0.5)  # in the denoise loop, on every rank
    return thread, box


def served(engine: Engine, seed: int) -> None:
    req = fixture_request("fixture-image", seed)
    res = engine.run([req], timeout=60)[0]
    assert comparable_events(res.events) == comparable_reference(reference("fixture-image").run(req))


def test_each_rank_runs_on_its_host_and_binds_that_address(four):
    stats = stats_of(four)
    hosts, workers, info = stats.hosts, stats.workers, stats.ray
    assert hosts == {0: HEAD, 1: NODE_A, 2: NODE_B, 3: NODE_B}
    assert info["conductor_address"].startswith(f"tcp://{HEAD}:")
    for rank, host in hosts.items():
        assert workers[rank].address.startswith(f"tcp://{host}:"), workers[rank].address
        assert workers[rank].host == host
    nodes = stats.nodes
    assert nodes[2] == nodes[3] and len({nodes[0], nodes[1], nodes[2]}) == 3
    pids, actors = stats.pids, by_rank(info["actor_pids"])
    for rank, pid in pids.items():  # the worker is the child of its rank's actor, under that node's raylet
        with open(f"/proc/{pid}/stat") as f:
            assert int(f.read().rpartition(")")[2].split()[1]) == actors[rank]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"walkserve" in f.read()
    with open(f"/proc/{four.engine.process.pid}/maps") as f:
        assert "libtorch" not in f.read()  # the conductor started the actors without loading torch


def test_a_frame_without_the_run_token_is_dropped_by_a_remote_rank(four):
    import zmq

    from walkserve.protocol import messages as m
    from walkserve.transport.ipc import Outbox

    address = stats_of(four).workers[2].address
    ctx = zmq.Context()
    out = Outbox(ctx, "not-the-run-token")
    try:
        out.connect("rank2", address)
        out.send_now("rank2", m.Stop())
        assert wait_for(lambda: stats_of(four).workers[2].bad_frames == 1, timeout=10)
    finally:
        out.close()
        ctx.term()
    assert four.health().ok  # the foreign Stop was not obeyed


def test_outputs_match_and_tensors_go_inline_between_nodes_and_through_shm_within_one(four):
    served(four, 500)
    reqs = [fixture_request("fixture-image", 300 + i) for i in range(8)]
    ref = reference("fixture-image")
    for req, res in zip(reqs, four.run(reqs, timeout=120), strict=True):
        assert comparable_events(res.events) == comparable_reference(ref.run(req))
    stats = stats_of(four)
    workers, nodes = stats.workers, stats.nodes
    for rank, w in workers.items():
        for peer, n in w.shm_to.items():
            assert nodes[peer] == nodes[rank], f"rank {rank} sent {n} tensors through shm to rank {peer} on another node"
    assert workers[3].shm_to.get(2, 0) > 0  # uncond -> combine, both on 127.0.0.4
    assert workers[2].shm_to.get(3, 0) > 0  # the carried latent back
    assert workers[1].inline_to.get(2, 0) > 0 and workers[2].inline_to.get(1, 0) > 0
    assert workers[0].inline_to.get(2, 0) > 0 and workers[2].inline_to.get(0, 0) > 0


def kill_and_time(engine: Engine, pid: int, n: int, seed: int) -> tuple[float, list]:
    thread, box = run_in_background(engine, long_requests(n, seed))
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=30)
    return time.monotonic() - killed, box["results"]


def test_sigkill_of_a_remote_worker_fails_its_requests_within_1s_then_it_restarts(four):
    pid = stats_of(four).pids[2]
    elapsed, results = kill_and_time(four, pid, 3, 700)
    print(f"figure: SIGKILL of rank 2's worker on {NODE_B} -> its requests ended in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0, elapsed
    for r in results:
        assert r.finished.reason == FinishReason.ERROR
        assert f"worker rank 2 died (pid {pid} on {NODE_B} killed by signal 9 (SIGKILL))" in r.finished.error
    assert wait_for(lambda: four.health().ok, timeout=START_S)
    stats = stats_of(four)
    assert stats.restarts == {0: 0, 1: 0, 2: 1, 3: 0}
    assert stats.hosts[2] == NODE_B and stats.pids[2] != pid
    served(four, 501)


def test_sigkill_of_a_remote_ranks_actor_fails_its_requests_within_1s_then_a_new_actor_serves(four):
    stats = stats_of(four)
    actor, worker = by_rank(stats.ray["actor_pids"])[1], stats.pids[1]
    elapsed, results = kill_and_time(four, actor, 3, 710)
    print(f"figure: SIGKILL of rank 1's actor on {NODE_A} -> its requests ended in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0, elapsed
    for r in results:
        assert r.finished.reason == FinishReason.ERROR
        assert "worker rank 1 died (its Ray actor" in r.finished.error and f"on {NODE_A} died" in r.finished.error
    assert wait_for(lambda: not alive(worker), timeout=5)  # the worker followed its actor
    assert wait_for(lambda: four.health().ok, timeout=START_S)
    stats = stats_of(four)
    assert stats.restarts[1] == 1 and by_rank(stats.ray["actor_pids"])[1] != actor
    assert stats.hosts[1] == NODE_A
    served(four, 502)


def test_a_lost_node_fails_its_requests_within_5s_and_leaves_the_server_degraded_not_hung(four, local_cluster):
    thread, box = run_in_background(four, long_requests(3, 720))
    removed = time.monotonic()
    local_cluster.cluster.remove_node(local_cluster.nodes.pop(NODE_A), allow_graceful=False)
    thread.join(timeout=30)
    elapsed = time.monotonic() - removed
    print(f"figure: {NODE_A} removed -> rank 1's requests ended in {elapsed * 1000:.0f} ms")
    assert elapsed < 5.0, elapsed
    for r in box["results"]:
        assert r.finished.reason == FinishReason.ERROR and "worker rank 1 died" in r.finished.error
        assert NODE_A in r.finished.error
    down = f"worker rank 1 cannot restart: host {NODE_A} is not in the Ray cluster"
    assert wait_for(lambda: down in four.health().detail, timeout=30), four.health()
    print(f"figure: {NODE_A} removed -> health names the lost host after {time.monotonic() - removed:.1f} s")
    assert four.health().state == "degraded" and not four.health().ok
    t0 = time.monotonic()
    res = four.run([fixture_request("fixture-image", 721)], timeout=10)[0]
    assert res.finished.reason == FinishReason.ERROR and down in res.finished.error
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(WalkserveError, match=rf"ranks\[1\]: host {NODE_A} is not in the Ray cluster"):
        Engine.start("fixture-lm", placement=ray_placement(cpu_ranks(2), [{"nodes": ["lm"], "ranks": [0, 1]}]),
                     config=config(local_cluster))
    # the node comes back (same IP): Ray reschedules the bundle, the waiting actor starts, the rank is back
    local_cluster.nodes[NODE_A] = local_cluster.cluster.add_node(num_cpus=CPUS, node_ip_address=NODE_A,
                                                                 object_store_memory=OBJECT_STORE)
    assert wait_for(lambda: four.health().ok, timeout=START_S), four.health()
    served(four, 722)


def test_killing_the_conductor_takes_every_actor_and_worker_down(four):
    stats = stats_of(four)
    pids = list(stats.pids.values()) + list(by_rank(stats.ray["actor_pids"]).values())
    assert len(pids) == 8 and all(alive(p) for p in pids)
    killed = time.monotonic()
    os.kill(four.engine.process.pid, signal.SIGKILL)
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=10, interval=0.01), [p for p in pids if alive(p)]
    elapsed = time.monotonic() - killed
    print(f"figure: conductor SIGKILLed -> its 4 actors and 4 workers gone in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0, elapsed
    run_id = four.engine.spec.run_id
    assert wait_for(lambda: not named_actors(run_id), timeout=10)
    with contextlib.suppress(Exception):
        four.close(drain_s=0)
