"""A multi-node Ray cluster on one machine, for the Ray launcher's tests and benchmark.

Nodes get distinct loopback aliases (all of 127.0.0.0/8 is on ``lo``), so each
has its own IP and ``node:<ip>`` resource. As root, ``private_cluster`` runs
the cluster, this process's driver and everything started meanwhile from the
calling thread inside a private network namespace with only ``lo``: nothing
Ray starts can reach an address off the machine (Ray looks up a route to
8.8.8.8 to guess an interface; there is none). Ray's files go to a private
temp dir (``RAY_TMPDIR``), so the machine's ``/tmp/ray`` pointer to "the"
cluster is never touched. Health checks are tuned (1 s x 3): a lost node is
declared dead in ~3 s instead of ~14 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from walkserve.testing.netns import inside, is_root, private_netns

OBJECT_STORE = 75 * 2**20
HEALTH = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@dataclass
class LocalCluster:
    address: str
    cluster: object  # ray.cluster_utils.Cluster
    nodes: dict[str, object]  # ip -> ray._private.node.Node, the worker nodes
    netns: str | None
    start_s: float  # cluster up and this driver connected
    shm_before: set[str] = field(default_factory=set)  # /dev/shm segments when it started

    def pids(self) -> list[int]:
        """Every process of every node (raylets, GCS, agents, workers) as Ray lists them."""
        out = []
        for node in [self.cluster.head_node, *self.cluster.worker_nodes]:
            for infos in node.all_processes.values():
                out += [i.process.pid for i in infos if i.process is not None]
        return out


@contextlib.contextmanager
def ray_env(tmp: Path) -> Iterator[None]:
    """Ray's files (session dirs, the ray_current_cluster pointer) under ``tmp``, no usage reports."""
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_USAGE_STATS_ENABLED", "RAY_ADDRESS")}
    os.environ.update(RAY_TMPDIR=str(tmp), RAY_USAGE_STATS_ENABLED="0")
    os.environ.pop("RAY_ADDRESS", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_cluster(head: tuple[str, int], nodes: dict[str, int], netns: str | None = None,
                  labels: dict[str, dict[str, str]] | None = None) -> LocalCluster:
    """``head``: (ip, cpus); ``nodes``: ip -> cpus; ``labels``: ip -> Ray node labels. Connects this process as a driver."""
    import ray
    from ray.cluster_utils import Cluster

    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head[1], "node_ip_address": head[0], "include_dashboard": False,
        "object_store_memory": OBJECT_STORE, "_system_config": HEALTH,
    })
    labels = labels or {}
    workers = {ip: cluster.add_node(num_cpus=cpus, node_ip_address=ip, object_store_memory=OBJECT_STORE,
                                    labels=labels.get(ip, {}))
               for ip, cpus in nodes.items()}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="walkserve-tests", logging_level=logging.WARNING, log_to_driver=False)
    from walkserve.transport import shm

    return LocalCluster(cluster.address, cluster, workers, netns, time.monotonic() - t0, set(shm.segments()))


@contextlib.contextmanager
def private_cluster(head: tuple[str, int], nodes: dict[str, int],
                    labels: dict[str, dict[str, str]] | None = None) -> Iterator[LocalCluster]:
    """The cluster, inside a private network namespace when root; the calling thread stays inside meanwhile."""
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="wsray-", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    ns_cm = private_netns(f"wsray-{os.getpid()}") if is_root() else contextlib.nullcontext(None)
    with ns_cm as ns, inside(ns), ray_env(tmp):
        lc = start_cluster(head, nodes, ns, labels)
        try:
            yield lc
        finally:
            ray.shutdown()
            lc.cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
