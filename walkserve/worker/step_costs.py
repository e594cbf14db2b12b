"""What one step of a node costs on this rank, by batch size: learned online from the steps that ran.

One exponentially weighted mean per (node, batch bucket); buckets are powers of
two (1, 2, 4, 8 ...), so a batch of 5 shares the bucket of 8 with 6, 7 and 8.
A bucket not measured yet is estimated from the nearest measured one, scaled
linearly by the batch (a safe over-estimate for batched devices). The
deadline scheduler reads ``estimate``; the rank's stats report ``snapshot``.

Admission prices a stream from ``counts``: per (node, bucket) the cumulative
steps, members and busy seconds (``RankStats.step_counts``), so the conductor
sees each batch size's real step time, node by node (the 15 code-predictor
steps of a Qwen3-Omni frame apart from its talker step), not one mean per
component that mixes a prompt's prefill with decode steps at every batch.
"""

from __future__ import annotations

ALPHA = 0.2  # weight of the newest step


def bucket(batch: int) -> int:
    """The power of two at or above ``batch``."""
    return 1 << max(0, batch - 1).bit_length()


class StepCosts:
    def __init__(self) -> None:
        self.means: dict[str, dict[int, float]] = {}
        self.counts: dict[str, dict[int, list[float]]] = {}  # node -> bucket -> [steps, members, busy s]

    def observe(self, node: str, batch: int, seconds: float, busy_s: float | None = None) -> None:
        """A step of ``node`` for ``batch`` members took ``seconds``; ``busy_s``: the part of it that was this
        node's work (a call shared with other nodes: its members' share), for the counts."""
        by_size = self.means.setdefault(node, {})
        b = bucket(batch)
        old = by_size.get(b)
        by_size[b] = seconds if old is None else old + ALPHA * (seconds - old)
        count = self.counts.setdefault(node, {}).setdefault(b, [0.0, 0.0, 0.0])
        count[0] += 1
        count[1] += batch
        count[2] += seconds if busy_s is None else busy_s

    def estimate(self, node: str, batch: int) -> float:
        """Seconds one step of ``node`` at ``batch`` takes; 0 while it never ran here."""
        by_size = self.means.get(node)
        if not by_size:
            return 0.0
        b = bucket(batch)
        cost = by_size.get(b)
        if cost is not None:
            return cost
        near = min(by_size, key=lambda s: abs(s.bit_length() - b.bit_length()))
        return by_size[near] * max(1.0, b / near)

    def snapshot(self) -> dict[str, dict[int, float]]:
        return {node: dict(sorted(by_size.items())) for node, by_size in self.means.items()}

    def count_snapshot(self) -> dict[str, dict[int, list[float]]]:
        return {node: {b: list(c) for b, c in sorted(by_size.items())} for node, by_size in self.counts.items()}
