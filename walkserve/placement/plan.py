"""The placement file and the validated plan built from it.

    launcher: ray               # optional: local (every rank on this host) or ray; default: ray
                                # when a rank names another host or node labels, else local
    ranks:                      # one worker process per rank
      - id: 0
        device: cpu             # cpu | cuda | cuda:N
        memory: 16GiB           # optional budget for the memory check (and Ray's reservation)
        host: 10.0.0.7          # optional: the Ray node (by IP) this rank runs on
        node_labels: {zone: a}  # optional: or any Ray node with these labels
        transport: tcp          # optional: ipc (default on this host) or tcp (other hosts, Ray)
      - id: 1
        device: cuda:0
    nodes:                      # node groups -> ranks
      - nodes: [lm]
        ranks: [0]
        walks: [prefill]        # optional: only for these walks (disaggregation)
      - nodes: [lm]
        ranks: [1]
        walks: [decode]
      - nodes: [snac]
        ranks: [1]              # several ranks = replicas; requests are spread over them

An entry with ``walks`` overrides an entry without for those walks; two
entries that place the same node for the same walk conflict. Loading against
a model checks that every node of every walk is placed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from walkserve.core.errors import PlacementError

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise PlacementError(f"{where}: memory {value!r} is not a size like 16GiB or 8000000000")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()])


LOCAL_HOSTS = (None, "localhost", "127.0.0.1", "::1")
LAUNCHERS = ("local", "ray")


@dataclass(frozen=True)
class RankSpec:
    id: int
    device: str
    host: str | None = None
    memory: int | None = None  # bytes
    transport: str = "ipc"  # "ipc": unix sockets + shared memory; "tcp": control over TCP, tensors by node
    node_labels: tuple[tuple[str, str], ...] = ()  # Ray node labels the rank's node must carry
    index: int = 0  # position in the file's ranks list, for messages (``ranks[2]``)

    @property
    def remote(self) -> bool:
        return self.host not in LOCAL_HOSTS


@dataclass(frozen=True)
class Placement:
    """Validated placement: ranks and, per (walk, node), the ranks that may run it."""

    source: str
    ranks: dict[int, RankSpec]
    # (walk, node) -> ranks; walk None = every walk not listed explicitly
    entries: dict[tuple[str | None, str], tuple[int, ...]] = field(default_factory=dict)
    launcher: str = "local"  # "local": forked on this host; "ray": Ray actors in one placement group

    def ray_reason(self) -> str:
        """Why this placement starts its ranks through Ray (for messages); '' when it does not."""
        if self.launcher != "ray":
            return ""
        for spec in sorted(self.ranks.values(), key=lambda s: s.index):
            if spec.remote:
                return f"ranks[{spec.index}] is on host {spec.host}"
            if spec.node_labels:
                return f"ranks[{spec.index}] asks for node labels"
        return "it says launcher: ray"

    def ranks_for(self, walk: str, node: str) -> tuple[int, ...]:
        ranks = self.entries.get((walk, node)) or self.entries.get((None, node))
        if not ranks:
            raise PlacementError(f"{self.source}: node {node!r} of walk {walk!r} is not placed")
        return ranks

    def check_covers(self, walks: Mapping[str, list[str]]) -> None:
        """``walks``: walk name -> its node names. Every node of every walk must be placed."""
        known = {n for nodes in walks.values() for n in nodes}
        for (walk, node) in self.entries:
            if node not in known:
                raise PlacementError(f"{self.source}: unknown node {node!r} (nodes: {', '.join(sorted(known))})")
            if walk is not None and walk not in walks:
                raise PlacementError(f"{self.source}: node {node!r} placed for unknown walk {walk!r} (walks: {', '.join(walks)})")
        for walk, nodes in walks.items():
            for node in nodes:
                if (walk, node) not in self.entries and (None, node) not in self.entries:
                    raise PlacementError(f"{self.source}: node {node!r} of walk {walk!r} is not placed on any rank")

    def nodes_on(self, rank: int, walks: Mapping[str, list[str]]) -> set[tuple[str, str]]:
        """(walk, node) pairs that may run on ``rank``."""
        return {(w, n) for w, nodes in walks.items() for n in nodes if rank in self.ranks_for(w, n)}

    def check_memory(self, demands: Mapping[int, list[tuple[str, int]]]) -> None:
        """``demands``: rank -> [(what, bytes)]. Raise if a rank with a budget cannot hold its share."""
        for rank, items in demands.items():
            spec = self.ranks[rank]
            total = sum(b for _, b in items)
            if spec.memory is not None and total > spec.memory:
                detail = ", ".join(f"{what} {b / 2**30:.2f} GiB" for what, b in items)
                raise PlacementError(
                    f"{self.source}: rank {rank} ({spec.device}) needs {total / 2**30:.2f} GiB "
                    f"({detail}) but has a budget of {spec.memory / 2**30:.2f} GiB"
                )


def _wants_ray(entry: Any) -> bool:
    return isinstance(entry, dict) and (entry.get("host") not in LOCAL_HOSTS or bool(entry.get("node_labels")))


def _labels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in value.items()):
        raise PlacementError(f"{where}: node_labels must map label names to values, e.g. {{zone: a}}")
    return tuple(sorted((k, str(v)) for k, v in value.items()))


def _launcher(data: dict, source: str) -> str:
    launcher = data.get("launcher")
    wants = [i for i, r in enumerate(data.get("ranks") or []) if _wants_ray(r)] if isinstance(data.get("ranks"), list) else []
    if launcher is None:
        return "ray" if wants else "local"
    if launcher not in LAUNCHERS:
        raise PlacementError(f"{source}: launcher {launcher!r} is not local or ray")
    if launcher == "local" and wants:
        raise PlacementError(
            f"{source}: ranks[{wants[0]}] is on another host or asks for node labels, which only launcher: ray can start"
        )
    return launcher


def _rank(entry: Any, i: int, source: str, ray: bool = False) -> RankSpec:
    where = f"{source}: ranks[{i}]"
    if not isinstance(entry, dict):
        raise PlacementError(f"{where}: must be a mapping with id and device")
    unknown = set(entry) - {"id", "device", "host", "memory", "transport", "node_labels"}
    if unknown:
        raise PlacementError(f"{where}: unknown field(s) {sorted(unknown)}")
    rid = entry.get("id", i)
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise PlacementError(f"{where}: id must be a non-negative integer, got {rid!r}")
    device = entry.get("device")
    if device is None:
        raise PlacementError(f"{where}: rank {rid} has no device (cpu, cuda or cuda:N)")
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise PlacementError(f"{where}: device {device!r} is not cpu, cuda or cuda:N")
    memory = parse_bytes(entry["memory"], where) if entry.get("memory") is not None else None
    host = entry.get("host")
    if host is not None and not isinstance(host, str):
        raise PlacementError(f"{where}: host must be a node's IP address as a string, got {host!r}")
    remote = host not in LOCAL_HOSTS
    transport = entry.get("transport", "tcp" if remote or ray else "ipc")
    if transport not in ("ipc", "tcp"):
        raise PlacementError(f"{where}: transport {transport!r} is not ipc or tcp")
    if remote and transport == "ipc":
        raise PlacementError(f"{where}: rank {rid} is on host {host!r}, which IPC cannot reach; use transport: tcp")
    if ray and transport == "ipc":
        raise PlacementError(f"{where}: rank {rid} is started through Ray, whose ranks talk TCP; remove transport: ipc")
    labels = _labels(entry.get("node_labels"), where)
    return RankSpec(rid, device, host, memory, transport, labels, i)


def _names(value: Any, where: str, what: str) -> list:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise PlacementError(f"{where}: {what} must be a non-empty list")
    return value


def parse_placement(data: Any, source: str = "<placement>") -> Placement:
    """Validate a placement mapping (as loaded from YAML); errors name ``source`` and the entry."""
    if not isinstance(data, dict):
        raise PlacementError(f"{source}: must be a mapping with 'ranks' and 'nodes'")
    unknown = set(data) - {"ranks", "nodes", "launcher"}
    if unknown:
        raise PlacementError(f"{source}: unknown top-level field(s) {sorted(unknown)}")
    launcher = _launcher(data, source)
    ranks: dict[int, RankSpec] = {}
    for i, r in enumerate(_names(data.get("ranks"), source, "ranks")):
        spec = _rank(r, i, source, ray=launcher == "ray")
        if spec.id in ranks:
            raise PlacementError(f"{source}: ranks[{i}]: duplicate rank id {spec.id}")
        ranks[spec.id] = spec
    entries: dict[tuple[str | None, str], tuple[int, ...]] = {}
    for i, e in enumerate(_names(data.get("nodes"), source, "nodes")):
        where = f"{source}: nodes[{i}]"
        if not isinstance(e, dict):
            raise PlacementError(f"{where}: must be a mapping with nodes and ranks")
        unknown = set(e) - {"nodes", "ranks", "walks"}
        if unknown:
            raise PlacementError(f"{where}: unknown field(s) {sorted(unknown)}")
        nodes = _names(e.get("nodes"), where, "nodes")
        rank_ids = _names(e.get("ranks"), where, "ranks")
        for r in rank_ids:
            if r not in ranks:
                raise PlacementError(f"{where}: unknown rank {r!r} (ranks: {sorted(ranks)})")
        if len(set(rank_ids)) != len(rank_ids):
            raise PlacementError(f"{where}: a rank is listed twice")
        walks = _names(e["walks"], where, "walks") if "walks" in e else [None]
        for node in nodes:
            for walk in walks:
                key = (walk, str(node))
                if key in entries:
                    scope = f"walk {walk!r}" if walk else "all walks"
                    raise PlacementError(f"{where}: node {node!r} is already placed for {scope} (conflicting entries)")
                entries[key] = tuple(rank_ids)
    return Placement(source, ranks, entries, launcher)


def load_placement(path: str | Path) -> Placement:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlacementError(f"{path}: cannot read placement file: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlacementError(f"{path}: not valid YAML: {e}") from None
    return parse_placement(data, str(path))
