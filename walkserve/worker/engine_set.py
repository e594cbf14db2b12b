"""The rank's engines, as the executor drives them: group calls with their accounting, queued firings.

    call      one engine call for groups of one step; per group, its members'
              results (an engine that raises or miscounts fails the members)
    submit    a single firing queued on an engine without groups, with who waits for it
    step      one step of the next engine with queued firings (round robin); the
              answers come back as (waiter, outputs, error) for the executor to hand on
    drop      a released request's queued firings are forgotten

Busy seconds, steps and items per component count every call and step. This
module knows engines and firings, nothing of cohorts: a waiter is opaque here.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from walkserve.engines.base import Engine, Firing, Group

log = logging.getLogger(__name__)


class EngineSet:
    def __init__(self, engines: Mapping[str, Engine]):
        self.engines = dict(engines)
        self.busy_s: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)
        self.pending: dict[int, tuple[Any, str, Engine]] = {}  # firing id -> (who waits, its request, the engine)
        self._ids = itertools.count()
        distinct = {id(e): name for name, e in self.engines.items()}  # a KV share group's engine serves several names
        self._order, self._next = list(distinct.values()), 0

    def __getitem__(self, component: str) -> Engine:
        return self.engines[component]

    def call(self, engine: Engine, groups: list[Group]) -> list[list]:
        """Per group, its members' results (an engine that raises or miscounts fails the members)."""
        component = groups[0].component
        t0 = time.perf_counter()
        try:
            results = engine.run_groups(groups) if len(groups) > 1 else [engine.run_group(groups[0])]
        except Exception as e:
            log.exception("engine %s failed a group", component)
            return [[f"engine {component!r} failed: {type(e).__name__}: {e}"] * len(g.request_ids) for g in groups]
        self.busy_s[component] += time.perf_counter() - t0
        self.steps[component] += 1
        self.items[component] += sum(len(g.request_ids) for g in groups)
        if len(results) != len(groups):
            results = [[]] * len(groups)
        return [r if len(r) == len(g.request_ids) else
                [f"engine {component!r} returned {len(r)} results for {len(g.request_ids)} firings"] * len(g.request_ids)
                for g, r in zip(groups, results)]

    def next_id(self) -> int:
        return next(self._ids)

    def submit(self, engine: Engine, firing: Firing, waiter: Any) -> None:
        self.pending[firing.id] = (waiter, firing.request_id, engine)
        engine.submit(firing)

    def step(self) -> list[tuple[Any, dict | None, str | None]] | None:
        """One step of the next engine (round robin) with queued firings: (waiter, outputs, error) per answer;
        None if no engine has any. An engine that raises answers every firing waiting on it with the error."""
        name = self._pick()
        if name is None:
            return None
        engine = self.engines[name]
        t0 = time.perf_counter()
        try:
            results = engine.step()
        except Exception as e:
            log.exception("engine %s failed a step", name)
            return self._failed(name, f"engine {name!r} failed: {type(e).__name__}: {e}")
        self.busy_s[name] += time.perf_counter() - t0
        self.steps[name] += 1
        self.items[name] += len(results)
        pending, out = self.pending, []
        for r in results:
            rec = pending.pop(r.firing.id, None)
            if rec is not None:
                out.append((rec[0], r.outputs, r.error))
        return out

    def _pick(self) -> str | None:
        order = self._order
        for i in range(len(order)):
            name = order[(self._next + i) % len(order)]
            if self.engines[name].has_work():
                self._next = (self._next + i + 1) % len(order)
                return name
        return None

    def _failed(self, name: str, error: str) -> list[tuple[Any, dict | None, str | None]]:
        """Every firing waiting on the engine fails; the engine drops its requests' firings."""
        engine, out, failed = self.engines[name], [], set()
        for fid, (waiter, rid, on) in list(self.pending.items()):
            if on is engine:
                del self.pending[fid]
                failed.add(rid)
                out.append((waiter, None, error))
        for rid in failed:
            self.release_in(engine, rid)
        return out

    def drop(self, rid: str) -> None:
        self.pending = {f: rec for f, rec in self.pending.items() if rec[1] != rid}

    def release(self, rid: str) -> None:
        """The request ended: every engine frees its state (once per engine object is not needed: idempotent)."""
        self.drop(rid)
        for engine in self.engines.values():
            self.release_in(engine, rid)

    @staticmethod
    def release_in(engine: Engine, rid: str) -> None:
        try:
            engine.release(rid)
        except Exception:
            log.exception("engine %s failed to release %s", engine.component, rid)
