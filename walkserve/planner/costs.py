"""Measured node costs: what one engine step of a node costs at a batch size and a thread count, cached on disk.

A profile (``planner.profile``) runs the model on one rank and reads the
runtime's per-node counters (steps, items, busy seconds); each run at one
concurrency and one thread count gives one sample per node: the mean batch
size and the mean seconds per step. ``NodeCost`` keeps, of the repeats at one
concurrency, the fastest (on a shared host the noise is time taken by other
work, which only ever adds), steps a batch the profile measured at what it
measured, interpolates between those batches, and beyond the largest extends
by the slope of ``seconds(batch) = fixed + per_item * batch`` fitted through
them; for a
thread count never measured, scales the nearest measured one by the ratio of
threads (a CPU step's compute divides over its threads; the fixed part too:
on a tiny model it is mostly the same kernels' launch overhead).

Beside the nodes' steps the profile measures what a rank and the frontend
spend outside them: ``loop`` (a worker's loop time outside its engine
calls, per step: receiving, scheduling, routing, sending outputs; fitted
against the batch like a node) and ``frontend_s`` (the CPU seconds the
conductor's process and the client's process spend per request). A profile
cached before these were measured reads them as zero. For the host's
cores, shared by its CPU ranks, it records how many cores the profiling
process could run on (``cores``) and how many cores a worker at each
thread count wants while it works (``worker_cpu``: its process's seconds
running or ready to run, every thread, over its active seconds); a profile without them
reads the planning host's cores and a worker's threads. On a CPU host with a
core for each node group, a second run puts every group on a rank of its own:
its messages between ranks give ``hop_s``.

The cache file is keyed by model (family and a fingerprint of the
checkpoint's config files), device kind and dtype, so planning after one
profile is instant.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from walkserve.core import env
from walkserve.core.errors import ConfigError

FORMAT = 1


@dataclass
class NodeCost:
    """One node's step cost samples: threads -> [(requests at once, mean batch, seconds per step)]."""

    samples: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)
    _fits: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)  # threads -> fit
    _curves: dict[int, list[tuple[float, float]]] = field(default_factory=dict, repr=False, compare=False)

    def add(self, threads: int, concurrency: float, batch: float, seconds: float) -> None:
        self.samples.setdefault(threads, []).append((concurrency, batch, seconds))
        self._fits.clear()
        self._curves.clear()

    def _nearest(self, threads: int) -> int:
        return min(self.samples, key=lambda t: (abs(t - threads), -t))

    def batch_at(self, concurrency: float, threads: int) -> float:
        """The mean batch the node ran at ``concurrency`` requests at once: interpolated between the profiled
        concurrencies, and in proportion to the concurrency beyond them."""
        if not self.samples:
            return 1.0
        by: dict[float, list[float]] = {}
        for c, b, _ in self.samples[self._nearest(threads)]:
            by.setdefault(c, []).append(b)
        pts = sorted((c, sum(bs) / len(bs)) for c, bs in by.items())
        if concurrency <= pts[0][0]:
            return max(1.0, pts[0][1] * concurrency / pts[0][0])
        for (c0, b0), (c1, b1) in itertools.pairwise(pts):
            if concurrency <= c1:
                return max(1.0, b0 + (b1 - b0) * (concurrency - c0) / (c1 - c0))
        return max(1.0, pts[-1][1] * concurrency / pts[-1][0])

    def fastest(self, threads: int) -> list[tuple[float, float, float]]:
        """``threads``' samples, of each concurrency only its fastest repeat (the fewest seconds per item: each
        repeat ran the same requests). Another process's load on the host only ever adds time, so the fastest of
        runs that did the same work is the truest; a slow repeat at a large batch would steepen the line."""
        best: dict[float, tuple[float, float, float]] = {}
        for c, b, s in self.samples[threads]:
            if c not in best or s / max(b, 1e-9) < best[c][2] / max(best[c][1], 1e-9):
                best[c] = (c, b, s)
        return list(best.values())

    def fit(self, threads: int) -> tuple[float, float]:
        """(fixed seconds, seconds per item) at ``threads``, least squares over that count's fastest repeats."""
        found = self._fits.get(threads)
        if found is None:
            found = self._fits[threads] = self._fit([(b, s) for _, b, s in self.fastest(threads)])
        return found

    @staticmethod
    def _fit(pts: list[tuple[float, float]]) -> tuple[float, float]:
        if len({b for b, _ in pts}) < 2:
            return sum(s for _, s in pts) / len(pts), 0.0  # one batch size seen: the step cost does not depend on the batch as far as we know
        n = len(pts)
        mb, ms = sum(b for b, _ in pts) / n, sum(s for _, s in pts) / n
        var = sum((b - mb) ** 2 for b, _ in pts)
        slope = max(0.0, sum((b - mb) * (s - ms) for b, s in pts) / var)
        fixed = max(0.0, ms - slope * mb)
        if fixed == 0.0:  # the line crossed below zero: all of the cost is per item
            slope = ms / mb
        return fixed, slope

    def step_seconds(self, batch: float, threads: int) -> float:
        """Seconds one step of ``batch`` items takes on a rank with ``threads`` threads: between the batches the
        profile measured, interpolated between the fastest repeats' steps (never less than at a smaller batch);
        beyond the largest, that step and the fitted line's seconds per item. The line alone was pulled by its
        largest batch (the most leverage, and the repeat a burst of other work most often slowed) away from the
        small batches the placements run at (docs/placement.md, "Orpheus's three best")."""
        if not self.samples:
            return 0.0
        measured = self._nearest(threads)
        return self._measured_step(batch, measured) * measured / max(1, threads)

    def _measured_step(self, batch: float, threads: int) -> float:
        pts = self._curves.get(threads)
        if pts is None:
            pts = self._curves[threads] = sorted((b, s) for _, b, s in self.fastest(threads))
            for i in range(1, len(pts)):  # a larger batch never steps faster (noise again)
                pts[i] = (pts[i][0], max(pts[i][1], pts[i - 1][1]))
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, s0), (b1, s1) in itertools.pairwise(pts):
            if batch <= b1:
                return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
        return pts[-1][1] + self.fit(threads)[1] * (batch - pts[-1][0])


@dataclass
class RequestItems:
    """One request of the workload, run alone: its kind and the items it made of each unit."""

    kind: str
    items: dict[str, float] = field(default_factory=dict)


@dataclass
class CostTable:
    """Every profiled node of one model on one device kind and dtype.

    ``items_per_request[node]``: how many items (firings) of the node one
    request of the workload makes, on average over the mix (a decode node
    fires once per token, a codec once per window). ``requests``: the
    workload's first requests, each run alone, with the items each made (a
    spoken answer and a text answer apart, in the mix's order; empty in a
    profile cached before they were measured). ``first_output_s``: the
    measured time to the first client output of one request alone, ``threads``
    -> seconds (TTFA on an idle rank). ``hop_s``: seconds one cross-rank
    message costs its sender and its receiver (the sender's measured seconds
    per message where the profile ran its stage run, else a constant);
    ``hop_latency_s``: how long it takes to arrive (a constant). ``loop``: a
    rank's loop seconds outside its engine calls, per step, as a ``NodeCost``
    (batch: the mean members of the rank's steps). ``frontend_s``: CPU seconds
    the conductor and the client spend per request, on the host's cores beside
    the ranks (0: not measured). ``cores``: the cores the profiling process
    could run on (its CPU affinity; 0: not recorded, the planning host's are
    taken). ``worker_cpu``: threads -> cores a CPU worker with that many torch
    threads wants while it is active (steps and its loop around them; not
    measured: its threads).
    """

    key: str
    nodes: dict[str, NodeCost] = field(default_factory=dict)
    items_per_request: dict[str, float] = field(default_factory=dict)
    first_output_s: dict[int, float] = field(default_factory=dict)
    hop_s: float = 2e-4
    workload: str = ""
    hop_latency_s: float = 1e-3
    loop: NodeCost = field(default_factory=NodeCost)
    frontend_s: float = 0.0
    requests: list[RequestItems] = field(default_factory=list)
    cores: int = 0
    worker_cpu: dict[int, float] = field(default_factory=dict)

    def demand(self, threads: int) -> float:
        """Cores a CPU worker of ``threads`` torch threads wants while active: measured at the nearest thread
        count (scaled by the ratio of threads), else ``threads``."""
        if not self.worker_cpu:
            return float(threads)
        measured = min(self.worker_cpu, key=lambda t: (abs(t - threads), -t))
        return self.worker_cpu[measured] * threads / measured

    def loop_seconds(self, batch: float, threads: int) -> float:
        """A rank's loop seconds outside one step of ``batch`` members at ``threads`` (0 where never measured)."""
        return self.loop.step_seconds(batch, threads)

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "key": self.key, "hop_s": self.hop_s, "hop_latency_s": self.hop_latency_s,
            "workload": self.workload,
            "items_per_request": self.items_per_request,
            "first_output_s": {str(t): s for t, s in self.first_output_s.items()},
            "nodes": {n: _samples(c) for n, c in self.nodes.items()},
            "loop": _samples(self.loop), "frontend_s": self.frontend_s,
            "requests": [{"kind": r.kind, "items": r.items} for r in self.requests],
            "cores": self.cores, "worker_cpu": {str(t): c for t, c in self.worker_cpu.items()},
        }

    @classmethod
    def from_json(cls, data: dict, source: str = "<costs>") -> CostTable:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{source}: not a walkserve profile (format {FORMAT}); profile again")
        try:
            nodes = {n: _node_cost(per) for n, per in data["nodes"].items()}
            return cls(data["key"], nodes, {k: float(v) for k, v in data["items_per_request"].items()},
                       {int(t): float(s) for t, s in data.get("first_output_s", {}).items()},
                       float(data.get("hop_s", 2e-4)), str(data.get("workload", "")),
                       float(data.get("hop_latency_s", 1e-3)), _node_cost(data.get("loop", {})),
                       float(data.get("frontend_s", 0.0)),
                       [RequestItems(str(r["kind"]), {u: float(n) for u, n in r["items"].items()})
                        for r in data.get("requests", [])],
                       int(data.get("cores", 0)), {int(t): float(c) for t, c in data.get("worker_cpu", {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{source}: a damaged profile ({type(e).__name__}: {e}); profile again") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> CostTable:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read profile: {e.strerror}") from None
        except ValueError as e:
            raise ConfigError(f"{path}: not JSON: {e}") from None
        return cls.from_json(data, str(path))


def _samples(cost: NodeCost) -> dict[str, list[list[float]]]:
    return {str(t): [list(p) for p in pts] for t, pts in cost.samples.items()}


def _node_cost(per: dict) -> NodeCost:
    return NodeCost({int(t): [(float(c), float(b), float(s)) for c, b, s in pts] for t, pts in per.items()})


def model_fingerprint(path: str | None, options: dict | None = None) -> str:
    """A short hash of a checkpoint's config files (and the model options): another checkpoint, another profile."""
    h = hashlib.sha256(json.dumps(options or {}, sort_keys=True, default=str).encode())
    if path:
        root = Path(path)
        for f in sorted(root.rglob("*.json")):
            if f.stat().st_size < 1 << 20:
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        for f in sorted(root.rglob("*.safetensors")):
            h.update(f"{f.relative_to(root)}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def cache_key(family: str, path: str | None, device_kind: str, dtype: str, options: dict | None = None,
              workload: str = "default") -> str:
    """The profile's cache key: model, device kind, dtype, workload."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in f"{family}-{workload}")
    return f"{safe}-{model_fingerprint(path, options)}-{device_kind}-{dtype}"


def cache_path(key: str, cache_dir: Path | None = None) -> Path:
    root = cache_dir if cache_dir is not None else env.WALKSERVE_CACHE_DIR.get() / "profiles"
    return Path(root) / f"{key}.json"
