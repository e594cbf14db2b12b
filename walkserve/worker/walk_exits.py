"""Values leaving loops: per-iteration outputs gathered, then the last or the concatenation delivered.

A mixin of WalkState; it reads and writes the walk state's fields.
"""

from __future__ import annotations

from typing import Any

from walkserve.graph.compose import LAST
from walkserve.graph.plan import ToOutput
from walkserve.worker.plan_index import DataflowError, Path


class LoopExits:
    def _aggregate(self, route: Any, node: str, out: str, path: Path, value: Any) -> None:
        if self._exposed(node, path) is False:
            return
        scope = route.exits[0]
        d = self.idx.depth[scope]
        self.agg.setdefault((route, 0, path[:d]), {})[path[d]] = value

    def _flush_exits(self) -> None:
        progress = True
        while progress:
            progress = False
            for (route, level, outer), per_iter in list(self.agg.items()):
                scope = route.exits[level]
                limit = self._limit(scope, outer)
                if limit is None or any(k not in per_iter for k in range(limit)):
                    continue
                del self.agg[(route, level, outer)]
                value = self._combine(route, scope, [per_iter[k] for k in range(limit)])
                progress = True
                self._exit_value(route, level, outer, value)

    def _exit_value(self, route: Any, level: int, outer: Path, value: Any) -> None:
        """A loop's combined value at exit level ``level``: on to the next enclosing loop, or delivered."""
        if level + 1 < len(route.exits):
            d = self.idx.depth[route.exits[level + 1]]
            self.agg.setdefault((route, level + 1, outer[:d]), {})[outer[d]] = value
        else:
            self._deliver_exit(route, outer, value)

    def _combine(self, route: Any, scope: str, values: list) -> Any:
        src = self.idx.route_src[route]
        mode = self.plan.loop(scope).outputs[f"{src[0]}.{src[1]}"]
        if mode == LAST:
            if not values:
                raise DataflowError(
                    f"loop {scope!r} exposed no iteration, so {src[0]}.{src[1]} has no last value"
                )
            return values[-1]
        return self.concat(values, None)

    def _deliver_exit(self, route: Any, outer: Path, value: Any) -> None:
        src = self.idx.route_src[route]
        if isinstance(route, ToOutput):
            self.sink.report("output", self, name=route.name, value=value)
            return
        rank = self.ranks[route.node]
        if rank == self.rank:
            self.values[(src[0], src[1], outer)] = value
            self._try(route.node)
        else:
            self.sink.send(
                rank, "deliver", self, node=src[0], output=src[1], path=outer, value=value
            )
