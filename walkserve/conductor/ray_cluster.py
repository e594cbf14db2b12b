"""The Ray cluster as the conductor sees it: joining, one bundle per rank, and why a placement cannot be met.

Every rank becomes one bundle of the run's placement group:

    rank with host: 10.0.0.7     {"node:10.0.0.7": 0.001, "CPU": 1}     (cuda: "GPU": 1; memory: "memory": bytes)
    rank with node_labels        {"CPU": 1} + bundle_label_selector {zone: a}
    rank with neither            pinned to the conductor's node

Ray gives every node a ``node:<ip>`` resource, so a bundle that asks for a
sliver of it can only land on that node. A placement group never fails by
itself (it stays PENDING), so walkserve first checks the request against the
live nodes and refuses at once what no node can hold, then waits a bounded
time for the rest, and on failure explains per rank what is missing.

The planning and explaining functions are pure (tested without Ray); only
``join`` and ``nodes`` call it. Ray is imported here and nowhere else in the
conductor's process, lazily.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from walkserve.core.errors import PlacementError, WalkserveError
from walkserve.placement.plan import Placement

log = logging.getLogger(__name__)

PIN = 0.001  # the sliver of a node's ``node:<ip>`` resource a bundle asks for


@dataclass(frozen=True)
class Bundle:
    rank: int
    index: int  # the rank's position in the placement file (``ranks[2]``)
    resources: dict[str, float]
    host: str | None = None  # the node it must land on (by IP), if any
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def needs(self) -> dict[str, float]:
        return {k: v for k, v in self.resources.items() if not k.startswith("node:")}


@dataclass(frozen=True)
class NodeInfo:
    ip: str
    node_id: str
    alive: bool
    total: dict[str, float]
    available: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)


def require_ray(placement: Placement) -> None:
    """Fail in one line when the placement needs Ray and it is not installed."""
    if placement.launcher == "ray" and importlib.util.find_spec("ray") is None:
        raise PlacementError(
            f"{placement.source}: this placement starts its ranks through Ray ({placement.ray_reason()}), "
            "but ray is not installed: pip install 'walkserve[ray]'"
        )


def plan_bundles(placement: Placement, conductor_host: str) -> list[Bundle]:
    """One bundle per rank, in rank-id order (bundle i hosts the i-th rank id)."""
    bundles = []
    for rid in sorted(placement.ranks):
        spec = placement.ranks[rid]
        needs: dict[str, float] = {"GPU": 1.0} if spec.device.startswith("cuda") else {"CPU": 1.0}
        if spec.memory is not None:
            needs["memory"] = float(spec.memory)
        labels = dict(spec.node_labels)
        host = spec.host if spec.host is not None else (None if labels else conductor_host)
        if host is not None:
            needs[f"node:{host}"] = PIN
        bundles.append(Bundle(rid, spec.index, needs, host, labels))
    return bundles


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"memory {value / 2**30:.2f} GiB"
    return f"{name} {value:g}"


def _ranks(bundles: list[Bundle]) -> str:
    indices = sorted(b.index for b in bundles)
    return f"ranks[{indices[0]}]" if len(indices) == 1 else f"ranks[{', '.join(map(str, indices))}]"


def _matches(node: NodeInfo, b: Bundle) -> bool:
    return (b.host is None or node.ip == b.host) and all(node.labels.get(k) == v for k, v in b.labels.items())


def check_feasible(source: str, bundles: list[Bundle], nodes: list[NodeInfo]) -> None:
    """Raise PlacementError naming every rank no live node can hold (a host or labels missing, too few resources)."""
    live = [n for n in nodes if n.alive]
    alive = ", ".join(sorted(n.ip for n in live)) or "none"
    problems = []
    per_host: dict[str, list[Bundle]] = defaultdict(list)
    for b in bundles:
        if b.host is not None and not any(n.ip == b.host for n in live):
            problems.append(f"ranks[{b.index}]: host {b.host} is not in the Ray cluster (alive: {alive})")
        elif b.labels and not any(_matches(n, b) for n in live):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(b.labels.items()))
            problems.append(f"ranks[{b.index}]: no live node in the Ray cluster has node labels {wanted} (alive: {alive})")
        elif b.host is not None:
            per_host[b.host].append(b)
        elif not any(all(n.total.get(k, 0) >= v for k, v in b.needs.items()) for n in live if _matches(n, b)):
            wanted = ", ".join(_amount(k, v) for k, v in b.needs.items())
            problems.append(f"ranks[{b.index}]: needs {wanted}, more than any matching node has")
    for host, group in per_host.items():
        node = next(n for n in live if n.ip == host)
        total: dict[str, float] = defaultdict(float)
        for b in group:
            for k, v in b.needs.items():
                total[k] += v
        for k, v in total.items():
            if node.total.get(k, 0.0) + 1e-9 < v:
                verb = "needs" if len(group) == 1 else "need"
                problems.append(f"{_ranks(group)}: {verb} {_amount(k, v)} on host {host}, which has {_amount(k, node.total.get(k, 0.0))}")
    if problems:
        raise PlacementError(f"{source}: " + "; ".join(problems))


def explain_pending(source: str, bundles: list[Bundle], nodes: list[NodeInfo], waited_s: float) -> str:
    """Why a feasible placement group was not reserved in time: what each pinned host has free."""
    live = {n.ip: n for n in nodes if n.alive}
    parts = []
    per_host: dict[str, list[Bundle]] = defaultdict(list)
    for b in bundles:
        if b.host is not None:
            per_host[b.host].append(b)
    for host, group in per_host.items():
        node = live.get(host)
        if node is None:
            parts.append(f"{_ranks(group)}: host {host} left the Ray cluster")
            continue
        for k in sorted({k for b in group for k in b.needs}):
            need = sum(b.needs.get(k, 0.0) for b in group)
            free = node.available.get(k, 0.0)
            if free + 1e-9 < need:
                parts.append(f"{_ranks(group)}: host {host} has {_amount(k, free)} free of the {_amount(k, need)} needed "
                             f"(other work holds the rest)")
    detail = "; ".join(parts) or "the cluster did not place every bundle (see `ray status`)"
    return f"{source}: Ray could not reserve the ranks' resources within {waited_s:.0f} s: {detail}"


# ---- calls into Ray ------------------------------------------------------------------------------


def join(address: str | None) -> str:
    """Connect this process, as a driver, to a running Ray cluster; returns this node's IP as Ray knows it.

    ``address``: ``auto`` (the cluster this machine is a node of) or ``HOST:PORT``;
    None: ``$RAY_ADDRESS`` (Ray's own variable), else ``auto``. walkserve never
    starts a cluster, so disconnecting (``ray.shutdown``) never stops one.
    """
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    if address == "local" or address.startswith("ray://"):
        raise WalkserveError(f"--ray-address {address!r}: walkserve joins a running cluster (auto or HOST:PORT) as a driver "
                             "on one of its nodes; it neither starts one nor connects through Ray Client")
    try:
        import ray
    except ImportError:
        raise WalkserveError("ray is not installed: pip install 'walkserve[ray]'") from None
    on_term = signal.getsignal(signal.SIGTERM)  # ray.init replaces it with sys.exit; the conductor drains instead
    try:
        ray.init(address=address, namespace="walkserve", logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WalkserveError(
            f"cannot join the Ray cluster at {address!r}: {first} (start one with `ray start --head` on this "
            "machine, or pass --ray-address HOST:PORT of its head)"
        ) from None
    finally:
        if threading.current_thread() is threading.main_thread() and on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    return ray.util.get_node_ip_address()


def nodes() -> list[NodeInfo]:
    """Every node the cluster knows, with its total and (where Ray tells) available resources."""
    import ray

    try:
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
    except Exception:  # a private API; the messages only lose the "free" figures without it
        free = {}
    out = []
    for n in ray.nodes():
        node_id = n.get("NodeID", "")
        out.append(NodeInfo(n.get("NodeManagerAddress", ""), node_id, bool(n.get("Alive")), dict(n.get("Resources") or {}),
                            dict(free.get(node_id, {})), dict(n.get("Labels") or {})))
    return out
