"""One request's walk on one rank: which local node instance can fire, and where outputs go.

The big idea: every local node has a *cursor*, the next path it will fire
at (iteration indices of its scopes, outermost first). A node fires at its
cursor when every input slot has a value for that path and every dynamic
loop around it allows that iteration; firing moves the cursor one
iteration on. Loop instances end by a stop rule, a bound, or an exhausted
stream; an ended instance moves cursors past it. A DynamicLoop's iteration
k may run before the stop rule for k-1 is known (speculation, one step at
most); outputs that leave the iteration (to the client, a stream, a walk
output or out of the loop) are held until the iteration is known to be
exposed, and dropped if it is not.

Values are opaque here (tensors in practice, or Futures of in-flight
firings for consumers on this rank); this module never imports torch, so
its bookkeeping tests in milliseconds.

    values[(producer, output, path)]      a produced value, keyed at the producer's path
    values[("input", name, ())]           a walk input
    cont[(scope, outer)] = k              iterations <= k of that loop instance are known to continue
    end[(scope, outer)] = n               that instance exposed exactly n iterations

A value at its producer's own path is dropped after its last local read when
the plan says how many reads it gets (``PlanIndex.once_readers``): a loop's
per-iteration values do not pile up over a long walk. Walk inputs, exit values
and values that consumers nested deeper read at every iteration stay until the
walk ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from walkserve.graph.plan import (
    INPUT,
    ToClient,
    ToOutput,
    ToStream,
    WalkPlan,
)
from walkserve.graph.stop import resolve_count
from walkserve.streaming.buffer import EXHAUSTED, StreamBuffer, StreamOverflow
from walkserve.worker.plan_index import EDGE, STREAM, DataflowError, index_of, value_key
from walkserve.worker.walk_cohort import CohortSide
from walkserve.worker.walk_exits import LoopExits
from walkserve.worker.walk_streams import StreamSide
from walkserve.worker.walk_values import ValueReads

Path = tuple[int, ...]
DONE = None
_MISSING = object()


class Sink(Protocol):
    """Where a WalkState's effects go; the worker implements it."""

    def fire(
        self, ws: WalkState, node: str, path: Path, inputs: dict, spans: dict, speculative: bool
    ) -> None: ...

    def send(self, rank: int, kind: str, ws: WalkState, **fields: Any) -> None: ...

    def report(self, kind: str, ws: WalkState, **fields: Any) -> None: ...


class WalkState(StreamSide, LoopExits, ValueReads, CohortSide):
    """The dataflow of one (request, walk) on one rank."""

    def __init__(
        self,
        plan: WalkPlan,
        request_id: str,
        rank: int,
        ranks: Mapping[str, int],
        params: Mapping[str, Any],
        sink: Sink,
        concat: Callable[[list, Any], Any],
        speculate: bool = True,
        cohorts: bool = False,
    ):
        self.plan, self.idx = plan, index_of(plan)
        self.request_id, self.walk = request_id, plan.name
        self.rank, self.ranks, self.params = rank, dict(ranks), params
        self.sink, self.concat = sink, concat
        self.speculate = speculate
        self.local = [n for n in plan.nodes if self.ranks.get(n) == rank]
        self.values: dict[tuple, Any] = {}
        self._init_reads()
        self._launched: set[tuple[str, Path]] = set()  # firings whose futures consumers saw, not yet completed
        self.cursor: dict[str, Path | None] = {n: (0,) * len(plan.chains[n]) for n in self.local}
        self.inflight: dict[str, int] = defaultdict(int)
        self.fired: dict[str, int] = defaultdict(int)
        self.cont: dict[tuple[str, Path], int] = {}
        self.end: dict[tuple[str, Path], int] = {}
        self.bounds: dict[str, int] = {}
        self.buffers: dict[tuple[int, Path], StreamBuffer] = {}
        self.reorder: dict[tuple[int, Path], dict[int, Any]] = defaultdict(dict)
        self.templates: dict[tuple[int, Path], Any] = {}
        self.held: list[tuple[str, Path, dict]] = []
        self.items_sent: dict[tuple[int, Path], int] = defaultdict(int)
        self.prefixes: dict[int, set[Path]] = defaultdict(
            set
        )  # producer side: stream -> outer instances seen
        self.stream_ended: set[tuple[int, Path]] = set()
        self.paused: set[tuple[int, Path]] = set()  # producer side: streams a consumer paused
        self.pausing: set[tuple[int, Path]] = set()  # consumer side: streams we asked to pause
        self.agg: dict[tuple, dict[int, Any]] = {}
        self.done: set[str] = set()
        self.hit_bound: set[str] = set()
        self.failed = False
        self._scope_ranks: dict[str, list[int]] = {}
        self._dirty: dict[str, None] = {}
        self._stale: set[str] = set()  # nodes whose cursor may lie past a loop's (new) limit
        self._draining = False
        self._producers = [n for n in self.local if n in self.idx.produces]
        self.wasted: dict[tuple, int] = defaultdict(int)  # (node, loop instance) -> firings not exposed
        self._init_cohorts(cohorts)

    # ---- entry points (called by the worker) ----------------------------------------------
    def start(self, inputs: Mapping[str, Any]) -> None:
        for name, value in inputs.items():
            self.values[(INPUT, name, ())] = value
        self._guard(self._try_all)

    def deliver(self, node: str, output: str, path: Path, value: Any) -> None:
        self._store((node, output, tuple(path)), value)
        self._guard(self._try_consumers, node)

    def launched(self, node: str, path: Path, futures: Mapping[str, Any]) -> None:
        """A local firing was handed to an engine: its outputs exist as futures for local consumers."""
        self._launched.add((node, path))
        for out, fut in futures.items():
            key = (node, out, path)
            if key not in self.values and self._store(key, fut):
                self._awaiting.add(key)
        self._guard(self._try_consumers, node)

    def completed(self, node: str, path: Path, outputs: Mapping[str, Any]) -> None:
        self._guard(self._completed, node, path, outputs)

    def stream_item(self, stream: int, prefix: Path, index: int, value: Any) -> None:
        self._guard(self._stream_item, stream, tuple(prefix), index, value)

    def stream_end(self, stream: int, prefix: Path, n_items: int) -> None:
        self._guard(self._stream_end, stream, tuple(prefix), n_items)

    def loop_event(self, scope: str, outer: Path, k: int, end: int) -> None:
        outer = tuple(outer)
        if end >= 0:
            self._guard(self._claim_end, scope, outer, end, False)
        else:
            key = (scope, outer)
            if self.cont.get(key, -1) < k:
                self.cont[key] = k
            self._guard(self._loop_changed, scope, outer, False)

    def flow(self, stream: int, prefix: Path, pause: bool) -> None:
        key = (stream, tuple(prefix))
        (self.paused.add if pause else self.paused.discard)(key)
        if not pause:
            self._guard(self._try, self.plan.streams[stream].producer)

    def is_done(self) -> bool:
        return len(self.done) == len(self.local)

    # ---- firing ----------------------------------------------------------------------------
    def _guard(self, fn: Callable, *args: Any) -> None:
        """Run one event, then every node it may have made ready; a request error fails this walk only."""
        if self.failed:
            return
        try:
            fn(*args)
            if self._draining:
                return  # an event raised inside a firing: the outer drain picks its nodes up
            self._draining = True
            try:
                while self._dirty and not self.failed:
                    node, _ = self._dirty.popitem()
                    self._try_now(node)
            finally:
                self._draining = False
        except (DataflowError, StreamOverflow, ValueError) as e:
            self.failed = True
            self.sink.report("failed", self, error=str(e))

    def _try_all(self) -> None:
        for node in self.local:
            self._try(node)

    def _try_consumers(self, node: str) -> None:
        for consumer in self.idx.consumers.get(node, ()):
            if self.ranks.get(consumer) == self.rank:
                self._try(consumer)

    def _try(self, node: str) -> None:
        """Mark ``node`` to be tried when the current event is done."""
        self._dirty[node] = None

    def _try_now(self, node: str) -> None:
        """Fire ``node`` at its cursor, repeatedly, while it can."""
        while not self.failed and self._try_once(node):
            pass
        if self.cursor[node] is DONE:
            self._check_done(node)

    def _try_once(self, node: str) -> bool:
        if node in self._stale:
            self._stale.discard(node)
            path = self._normalize(node)
        else:
            path = self.cursor[node]
        if path is DONE:
            return False
        speculative = self._permission(node, path) if self.idx.dynamic_levels[node] else False
        if speculative is None or (self.paused and self._paused_producer(node, path)):
            return False
        if node in self._cohort_of and self._to_cohort(node, path, speculative):
            return False
        gathered = self._gather(node, path)
        if gathered is None:
            return False
        inputs, spans = gathered
        if path:
            self.cursor[node] = (*path[:-1], path[-1] + 1)
            self._stale.add(node)
        else:
            self.cursor[node] = DONE
        for info in self.idx.produces.get(node, ()):
            self.prefixes[info.index].add(path[:-1])
        self.inflight[node] += 1
        self.fired[node] += 1
        self.sink.fire(self, node, path, inputs, spans, speculative)
        return self.cursor[node] is not DONE

    def _gather(self, node: str, path: Path) -> tuple[dict, dict] | None:
        inputs, spans = {}, {}
        values, read = self.values, []
        for slot, recipe in self.idx.recipes[node]:
            if recipe[0] == STREAM:
                source = recipe[1]
                info = self.plan.streams[source.stream]
                d = self.idx.depth[info.consumer_scope]
                key, k = (source.stream, path[:d]), path[d]
                chunk = self._buffer(key).chunk(k)
                if chunk is None:
                    return None
                if chunk is EXHAUSTED:
                    self._claim_end(info.consumer_scope, path[:d], k, True)
                    return None
                inputs[slot] = self.concat(list(chunk.items), self.templates.get(key))
                spans[slot] = chunk.span
                continue
            key = (recipe[1], recipe[2], path[: recipe[3]]) if recipe[0] == EDGE else value_key(recipe, path)
            value = values.get(key, _MISSING)
            if value is _MISSING:
                return None
            inputs[slot] = value
            read.append(key)
        if self.reads_left:
            self._read(read)
        return inputs, spans

    def _permission(self, node: str, path: Path) -> bool | None:
        """None: must wait; else whether firing at ``path`` is speculative."""
        speculative = False
        for d, sid in self.idx.dynamic_levels[node]:
            k = path[d]
            if k == 0:
                continue
            key = (sid, path[:d])
            if key in self.end:
                continue
            c = self.cont.get(key, -1)
            if c >= k - 1:
                continue
            if self.speculate and self.idx.speculate[node] and c >= k - 2:
                speculative = True
                continue
            return None
        return speculative

    def _paused_producer(self, node: str, path: Path) -> bool:
        if not self.paused:
            return False
        return any(
            (info.index, path[:-1]) in self.paused for info in self.idx.produces.get(node, ())
        )

    # ---- loop bookkeeping ------------------------------------------------------------------
    def _bound(self, scope: str) -> int:
        if scope not in self.bounds:
            try:
                self.bounds[scope] = resolve_count(
                    self.idx.bound_spec[scope], self.params, f"loop {scope!r}"
                )
            except ValueError as e:
                raise DataflowError(str(e)) from None
        return self.bounds[scope]

    def _limit(self, scope: str, outer: Path) -> int | None:
        """How many iterations of this loop instance run, if known."""
        end = self.end.get((scope, outer))
        if self.idx.stream_scope[scope]:
            return end
        bound = self.bounds.get(scope)
        if bound is None:
            bound = self._bound(scope)
        return bound if end is None or end > bound else end

    def _normalize(self, node: str) -> Path | None:
        path = self.cursor[node]
        chain = self.plan.chains[node]
        if not chain:
            return path
        while path is not DONE:
            for d in range(len(chain) - 1, -1, -1):
                limit = self._limit(chain[d], path[:d])
                if limit is not None and path[d] >= limit:
                    path = (
                        DONE
                        if d == 0
                        else (*path[: d - 1], path[d - 1] + 1, *(0,) * (len(chain) - d))
                    )
                    break
            else:
                break
        self.cursor[node] = path
        return path

    def _claim_end(self, scope: str, outer: Path, n: int, broadcast: bool) -> None:
        key = (scope, outer)
        if key in self.end and self.end[key] <= n:
            return
        self.end[key] = n
        self._stale.update(self.idx.scope_nodes[scope])
        for node in self.idx.scope_nodes[scope]:
            for info in self.idx.produces.get(node, ()):
                if info.producer_scope == scope and self.ranks.get(node) == self.rank:
                    self.prefixes[info.index].add(outer)
        if broadcast:
            self._broadcast(scope, outer, n - 1, n)
        self._loop_changed(scope, outer)

    def _broadcast(self, scope: str, outer: Path, k: int, end: int) -> None:
        ranks = self._scope_ranks.get(scope)
        if ranks is None:
            ranks = self._scope_ranks[scope] = sorted(
                {self.ranks[n] for n in self.idx.scope_nodes[scope]} - {self.rank}
            )
        for rank in ranks:
            self.sink.send(rank, "loop", self, scope=scope, outer=outer, k=k, end=end)

    def _loop_changed(self, scope: str, outer: Path, ended: bool = True) -> None:
        if self.held:
            self._flush_held()
        if self.agg:
            self._flush_exits()
        for node in self.idx.scope_nodes[scope]:
            if self.ranks.get(node) == self.rank:
                self._try(node)
        if ended:
            for node in self.local:
                self._check_done(node)

    def _exposed(self, node: str, path: Path) -> bool | None:
        """Whether the iteration ``path`` of ``node`` is real (True), dropped (False) or not known yet (None)."""
        for d, sid, stream in self.idx.exposure[node]:
            key, k = (sid, path[:d]), path[d]
            end = self.end.get(key)
            if end is not None:
                if k >= end:
                    return False
                continue
            if stream or self.cont.get(key, -1) >= k:
                continue
            return None
        return True

    def _decide(self, node: str, path: Path, outputs: Mapping[str, Any]) -> None:
        """The stop node of a DynamicLoop finished an iteration: continue, stop, or hit the bound."""
        scope, out, rule = self.idx.stop_of[node]
        d = self.idx.depth[scope]
        outer, k = path[:d], path[d]
        end = self.end.get((scope, outer))
        if end is not None and k >= end:
            return
        try:
            stop = rule.should_stop(outputs[out], self.params, k)
        except Exception as e:
            raise DataflowError(
                f"stop rule of loop {scope!r} failed: {type(e).__name__}: {e}"
            ) from None
        if stop:
            self._claim_end(scope, outer, k + 1 if rule.include_stopping else k, True)
        elif k + 1 >= self._bound(scope):
            self.hit_bound.add(node)
            self._claim_end(scope, outer, k + 1, True)
        else:
            self.cont[(scope, outer)] = k
            self._broadcast(scope, outer, k, -1)
            self._loop_changed(scope, outer, False)

    # ---- outputs ---------------------------------------------------------------------------
    def _completed(self, node: str, path: Path, outputs: Mapping[str, Any]) -> None:
        self.inflight[node] -= 1
        idx = self.idx
        for out, value in outputs.items():
            self._completed_value((node, out, path), value)
        if path and self._exposed(node, path) is False:
            self.wasted[(node, path[:-1])] += 1
        if idx.stream_slots[node]:
            self._consumed_chunks(node, path)
        held = False
        for out, value in outputs.items():
            sent: set[int] = set()
            for consumer in idx.forward.get((node, out), ()):
                rank = self.ranks[consumer]
                if rank != self.rank and rank not in sent:
                    sent.add(rank)
                    self.sink.send(
                        rank, "deliver", self, node=node, output=out, path=path, value=value
                    )
            for r in idx.exit_routes.get((node, out), ()):
                self._aggregate(r, node, out, path, value)
            held = held or (node, out) in idx.held_routes
        if held:
            self.held.append((node, path, dict(outputs)))
        if node in idx.stop_of:
            self._decide(node, path, outputs)
        if self.held:
            self._flush_held()
        if self.agg:
            self._flush_exits()
        if (node, path) in self._launched:
            # its consumers here saw its futures at launch and were tried then; a value
            # replacing a future makes nothing new ready, but the node may now be done
            self._launched.discard((node, path))
            if self.cursor[node] is DONE:
                self._try(node)
        else:
            self._try(node)
            self._try_consumers(node)

    def _flush_held(self) -> None:
        keep = []
        for node, path, outputs in self.held:
            exposed = self._exposed(node, path)
            if exposed is None:
                keep.append((node, path, outputs))
            elif exposed:
                for out, value in outputs.items():
                    for r in self.idx.held_routes.get((node, out), ()):
                        self._emit(r, node, out, path, value)
        self.held = keep
        if self._producers:
            self._end_streams()

    def _emit(self, route: Any, node: str, out: str, path: Path, value: Any) -> None:
        if isinstance(route, ToClient):
            fields = {"node": node, "modality": route.modality, "path": path, "output": out}
            self.sink.report("client", self, value=value, **fields)
        elif isinstance(route, ToOutput):
            self.sink.report("output", self, name=route.name, value=value)
        elif isinstance(route, ToStream):
            info = self.plan.streams[route.stream]
            key = (route.stream, path[:-1])
            self.items_sent[key] += 1
            rank = self.ranks[info.consumer]
            if rank == self.rank:
                self._stream_item(route.stream, path[:-1], path[-1], value)
            else:
                self.sink.send(
                    rank,
                    "item",
                    self,
                    stream=route.stream,
                    prefix=path[:-1],
                    index=path[-1],
                    value=value,
                )

    def _held_for(self, node: str) -> bool:
        return any(n == node for n, _, _ in self.held)

    # ---- completion ------------------------------------------------------------------------
    def _check_done(self, node: str) -> None:
        if node in self.done or self.cursor.get(node) is not DONE or self.inflight[node] > 0:
            return
        if self._held_for(node) or any(self.idx.route_src[key[0]][0] == node for key in self.agg):
            return
        for info in self.idx.produces.get(node, ()):
            if any(key not in self.stream_ended for key in self._prefixes(info)):
                return
        self.done.add(node)
        self.sink.report(
            "done", self, node=node, firings=self.fired[node], hit_bound=node in self.hit_bound
        )

