"""What the executor sends, gathered per destination until the next flush: one message per kind and key.

Per destination the messages leave in a fixed order: values, stream items,
then stream ends, loop decisions and flow control, then everything else in
the order it was put; to the conductor, client outputs before failures,
walk outputs and walk ends. A receiver therefore always sees a stream's
items before its end, and a failing request's earlier outputs before its
failure. Values stay raw (tensors) here; the worker's heartbeat packs them.
"""

from __future__ import annotations

from typing import Any

from walkserve.protocol import messages as m

CONDUCTOR = "conductor"


def to_rank(rank: int) -> tuple[str, int]:
    return ("rank", rank)


class Outgoing:
    __slots__ = ("_client", "_ends", "_flows", "_items", "_loops", "_other", "_values")

    def __init__(self) -> None:
        self._client: dict[tuple, tuple[list, list, list]] = {}
        self._values: dict[tuple, tuple[list, list, list]] = {}
        self._items: dict[tuple, tuple[list, list, list, list]] = {}
        self._ends: dict[tuple, tuple[list, list, list]] = {}
        self._loops: dict[tuple, tuple[list, list, list, list]] = {}
        self._flows: dict[tuple, tuple[list, list, list]] = {}
        self._other: list[tuple[Any, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._client or self._values or self._items or self._ends or self._loops or self._flows or self._other)

    def client_rows(self, walk: str, node: str, output: str, modality: str) -> tuple[list, list, list]:
        """(request ids, paths, values) of one ClientOuts, to append a step's rows to."""
        rows = self._client.get((walk, node, output, modality))
        if rows is None:
            rows = self._client[(walk, node, output, modality)] = ([], [], [])
        return rows

    def value_rows(self, rank: int, walk: str, node: str, output: str) -> tuple[list, list, list]:
        """(request ids, paths, values) of one Values message for ``rank``."""
        rows = self._values.get((rank, walk, node, output))
        if rows is None:
            rows = self._values[(rank, walk, node, output)] = ([], [], [])
        return rows

    def client(self, walk: str, node: str, output: str, modality: str, rid: str, path: tuple, value: Any) -> None:
        rows = self.client_rows(walk, node, output, modality)
        rows[0].append(rid)
        rows[1].append(path)
        rows[2].append(value)

    def value(self, rank: int, walk: str, node: str, output: str, rid: str, path: tuple, value: Any) -> None:
        rows = self.value_rows(rank, walk, node, output)
        rows[0].append(rid)
        rows[1].append(path)
        rows[2].append(value)

    def item(self, rank: int, walk: str, stream: int, rid: str, prefix: tuple, index: int, value: Any) -> None:
        rows = self._items.get((rank, walk, stream))
        if rows is None:
            rows = self._items[(rank, walk, stream)] = ([], [], [], [])
        rows[0].append(rid)
        rows[1].append(prefix)
        rows[2].append(index)
        rows[3].append(value)

    def stream_end(self, rank: int, walk: str, stream: int, rid: str, prefix: tuple, n_items: int) -> None:
        rows = self._ends.setdefault((rank, walk, stream), ([], [], []))
        rows[0].append(rid)
        rows[1].append(prefix)
        rows[2].append(n_items)

    def loop(self, rank: int, walk: str, scope: str, rid: str, outer: tuple, k: int, end: int) -> None:
        rows = self._loops.get((rank, walk, scope))
        if rows is None:
            rows = self._loops[(rank, walk, scope)] = ([], [], [], [])
        rows[0].append(rid)
        rows[1].append(outer)
        rows[2].append(k)
        rows[3].append(end)

    def flow(self, rank: int, walk: str, stream: int, rid: str, prefix: tuple, pause: bool) -> None:
        rows = self._flows.setdefault((rank, walk, stream), ([], [], []))
        rows[0].append(rid)
        rows[1].append(prefix)
        rows[2].append(pause)

    def conductor(self, message: Any) -> None:
        self._other.append((CONDUCTOR, message))

    def to(self, rank: int, message: Any) -> None:
        """A message for another rank that carries no rows (a request's moved state)."""
        self._other.append((to_rank(rank), message))

    @property
    def rows_for_ranks(self) -> bool:
        """Rows for other ranks wait here (``take_ranks`` has something)."""
        return bool(self._values or self._items or self._ends or self._loops or self._flows)

    def take(self) -> list[tuple[Any, Any]]:
        """Every message gathered since the last take, as (destination, message), in sending order."""
        out: list[tuple[Any, Any]] = []
        for (walk, node, output, modality), (rids, paths, values) in self._client.items():
            out.append((CONDUCTOR, m.ClientOuts(walk, node, modality, output, rids, paths, values=values)))
        out += self.take_ranks()
        out.extend(self._other)
        self._client, self._other = {}, []
        return out

    def take_ranks(self) -> list[tuple[Any, Any]]:
        """The rows for other ranks gathered since the last take, in sending order; the conductor's messages and
        the rankless ones (``to``) stay for ``take``. Rows taken early leave before any put later, so the order per
        destination holds: a value, item or decision never follows one put after it."""
        out: list[tuple[Any, Any]] = []
        for (rank, walk, node, output), (rids, paths, values) in self._values.items():
            out.append((to_rank(rank), m.Values(walk, node, output, rids, paths, values=values)))
        for (rank, walk, stream), (rids, prefixes, indices, values) in self._items.items():
            out.append((to_rank(rank), m.StreamItems(walk, stream, rids, prefixes, indices, values=values)))
        for (rank, walk, stream), (rids, prefixes, counts) in self._ends.items():
            out.append((to_rank(rank), m.StreamEnds(walk, stream, rids, prefixes, counts)))
        for (rank, walk, scope), (rids, outers, ks, ends) in self._loops.items():
            out.append((to_rank(rank), m.LoopEvents(walk, scope, rids, outers, ks, ends)))
        for (rank, walk, stream), (rids, prefixes, pauses) in self._flows.items():
            out.append((to_rank(rank), m.Flows(walk, stream, rids, prefixes, pauses)))
        self._values, self._items, self._ends, self._loops, self._flows = {}, {}, {}, {}, {}
        return out
