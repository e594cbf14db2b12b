"""The compute thread: runs engine steps while the worker's main thread routes, receives and schedules.

The main thread hands over firings whose inputs may be Futures: outputs of
firings handed over earlier that have not run yet. The compute thread only
submits a firing to its engine once every Future it reads is resolved, so a
dependency is never crossed, and the main thread can prepare batch N+1 (and
launch a loop's next iteration) while batch N runs. Only this thread ever
touches an engine, so engines need no locks.

    main thread:   fire(f1) fire(f2<-f1) ... collect() -> results -> route
    compute thread:        submit f1, step -> resolve f1's futures -> submit f2, step ...
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict, deque
from typing import Any

from walkserve.engines.base import Engine, Firing, FiringResult

log = logging.getLogger(__name__)

PENDING, READY, FAILED = 0, 1, 2


class Future:
    """An output of a firing that has not run yet. Written and read by the compute thread only.

    ``waiters`` holds the handed-over firings that found this future pending;
    they are looked at again once it resolves, not on every pass. A future of a
    released request never resolves (its firing is dropped), so firings parked
    on it go with it.
    """

    __slots__ = ("state", "value", "waiters")

    def __init__(self) -> None:
        self.state = PENDING
        self.value: Any = None
        self.waiters: list | None = None


class ComputeThread:
    def __init__(self, engines: dict[str, Engine]):
        self.engines = engines
        self._commands: deque = deque()
        self._wake = threading.Event()
        self._results: deque = deque()
        self._notify_r, self._notify_w = os.pipe()
        os.set_blocking(self._notify_r, False)
        os.set_blocking(self._notify_w, False)
        self._waiting: list[tuple[str, Firing, dict[str, Future]]] = []
        self._futures: dict[int, tuple[str, dict[str, Future]]] = {}
        self._order = list(engines)
        self._next = 0
        self._stop = False
        self._idle = False
        self.busy_s: dict[str, float] = defaultdict(float)
        self.steps: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)
        self._thread = threading.Thread(target=self._run, name="compute", daemon=True)

    @property
    def notify_fd(self) -> int:
        """Readable when results are waiting (for the main thread's poller)."""
        return self._notify_r

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    # ---- main thread side --------------------------------------------------------------------
    def fire(self, component: str, firing: Firing, futures: dict[str, Future]) -> None:
        self._commands.append(("fire", component, firing, futures))
        if self._idle:
            self._wake.set()

    def fire_many(self, items: list[tuple[str, Firing, dict[str, Future]]]) -> None:
        """Hand over several firings as one command, so one step can batch them all."""
        self._commands.append(("many", items))
        if self._idle:
            self._wake.set()

    def release(self, request_id: str) -> None:
        self._commands.append(("release", request_id))
        if self._idle:
            self._wake.set()

    def collect(self) -> list[tuple[str, FiringResult | str]]:
        """Results so far: (component, FiringResult) or (component, engine error message)."""
        try:
            while os.read(self._notify_r, 4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while self._results:
            out.append(self._results.popleft())
        return out

    # ---- compute thread side -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._drain_commands()
            self._submit_resolved()
            name = self._pick()
            if name is None:
                self._idle = True
                if not self._commands and not self._stop:
                    self._wake.wait(0.05)
                self._wake.clear()
                self._idle = False
                continue
            self._step(name)

    def _drain_commands(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if cmd[0] == "many":
                self._waiting.extend(cmd[1])
            elif cmd[0] == "fire":
                _, component, firing, futures = cmd
                self._waiting.append((component, firing, futures))
            else:
                rid = cmd[1]
                self._waiting = [w for w in self._waiting if w[1].request_id != rid]
                self._futures = {k: v for k, v in self._futures.items() if v[0] != rid}
                for engine in self.engines.values():
                    try:
                        engine.release(rid)
                    except Exception:
                        log.exception("engine %s failed to release %s", engine.component, rid)

    def _submit_resolved(self) -> None:
        """Submit each waiting firing whose inputs are all resolved; park the others on a pending future."""
        waiting, self._waiting = self._waiting, []
        for item in waiting:
            component, firing, futures = item
            state, pending = READY, None
            for v in firing.inputs.values():
                if isinstance(v, Future) and v.state != READY:
                    if v.state == FAILED:
                        state = FAILED
                        break
                    state, pending = PENDING, v
            if state == PENDING:
                if pending.waiters is None:
                    pending.waiters = []
                pending.waiters.append(item)
                continue
            if state == FAILED:
                self._publish(
                    component, FiringResult(firing, error="an input of this firing failed"), futures
                )
                self._signal()
                continue
            firing.inputs = {
                k: (v.value if isinstance(v, Future) else v) for k, v in firing.inputs.items()
            }
            self._futures[firing.id] = (firing.request_id, futures)
            self.engines[component].submit(firing)

    def _pick(self) -> str | None:
        for i in range(len(self._order)):
            name = self._order[(self._next + i) % len(self._order)]
            if self.engines[name].has_work():
                self._next = (self._next + i + 1) % len(self._order)
                return name
        return None

    def _step(self, name: str) -> None:
        engine = self.engines[name]
        t0 = time.perf_counter()
        try:
            results = engine.step()
        except Exception as e:
            log.exception("engine %s failed a step", name)
            self._results.append((name, f"engine {name!r} failed: {type(e).__name__}: {e}"))
            self._signal()
            return
        self.busy_s[name] += time.perf_counter() - t0
        self.steps[name] += 1
        self.items[name] += len(results)
        for r in results:
            self._publish(name, r, self._futures.pop(r.firing.id, ("", {}))[1])
        if results:
            self._signal()

    def _publish(self, name: str, result: FiringResult, futures: dict[str, Future]) -> None:
        for out, fut in futures.items():
            if result.error is None and result.outputs is not None and out in result.outputs:
                fut.value, fut.state = result.outputs[out], READY
            else:
                fut.state = FAILED
            if fut.waiters:  # parked firings: look at them again on the next pass
                self._waiting.extend(fut.waiters)
                fut.waiters = None
        self._results.append((name, result))

    def _signal(self) -> None:
        try:
            os.write(self._notify_w, b"x")
        except BlockingIOError:
            pass
