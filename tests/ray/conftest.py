"""A local multi-node Ray cluster for the Ray launcher's tests (walkserve/testing/ray_cluster.py).

The head on 127.0.0.2 and nodes on 127.0.0.3 and 127.0.0.4, each a loopback
alias; as root all of it (and the test's own driver, and every engine the
tests start) inside a private network namespace with only ``lo``.
"""

from __future__ import annotations

import pytest

from tests.polling import alive, wait_for
from walkserve.protocol.rank_stats import RuntimeSnapshot
from walkserve.testing.ray_cluster import OBJECT_STORE, private_cluster, ray_env  # noqa: F401  (used by the tests)

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'walkserve[ray]')")

HEAD, NODE_A, NODE_B = "127.0.0.2", "127.0.0.3", "127.0.0.4"
CPUS = 3


@pytest.fixture(scope="module")
def local_cluster():
    """The three-node cluster; the test thread stays in its namespace meanwhile. Nothing of it outlives the module."""
    # logical CPUs: one per rank of the engines the tests run side by side
    with private_cluster((HEAD, CPUS), {NODE_A: CPUS, NODE_B: CPUS}, labels={NODE_B: {"zone": "b"}}) as lc:
        pids = set(lc.pids())
        yield lc
        pids |= set(lc.pids())  # with nodes added meanwhile
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=10), "Ray processes outlived the cluster"


def ray_placement(ranks: list[dict], nodes: list[dict]) -> dict:
    return {"launcher": "ray", "ranks": ranks, "nodes": nodes}


def named_actors(run_id: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"ws-{run_id}-")]


def placement_group_state(pg_id: str) -> str:
    from ray.util.placement_group import placement_group_table

    return placement_group_table().get(pg_id, {}).get("state", "REMOVED")


def leaves_nothing_behind(engine_stats: RuntimeSnapshot, run_id: str, timeout: float = 10) -> None:
    """After an engine stopped: its placement group removed, no actor of its run alive, none of its pids alive."""
    info = engine_stats.ray
    pids = [*engine_stats.pids.values()] + [int(p) for p in info.get("actor_pids", {}).values()]
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=timeout), [p for p in pids if alive(p)]
    assert wait_for(lambda: not named_actors(run_id), timeout=timeout), named_actors(run_id)
    if info.get("placement_group"):
        assert wait_for(lambda: placement_group_state(info["placement_group"]) == "REMOVED", timeout=timeout)
