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

import itertools
import logging
import os
import threading
import time
from collections import defaultdict, deque

from walkserve.engines.base import Engine, Firing, FiringResult
from walkserve.engines.kv.ops import bind as bind_kv
from walkserve.worker.cohort import Cohort, Member
from walkserve.worker.cohort_plan import CohortPlan
from walkserve.worker.future import FAILED, PENDING, READY, Future

log = logging.getLogger(__name__)

LOOKAHEAD = 4  # cohort steps that may run before the main thread has read their reports

__all__ = ["FAILED", "PENDING", "READY", "ComputeThread", "Future"]


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
        self._cohorts: dict[tuple[str, str], Cohort] = {}
        self._cohort_firings: dict[int, Cohort] = {}  # firings a cohort gave an engine without run_group
        self._cohort_ids = itertools.count(-1, -1)
        self._unread = 0  # cohort reports the main thread has not collected yet
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
        """End the thread; it closes every engine after its last step (``Engine.close``)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    # ---- main thread side --------------------------------------------------------------------
    def fire_many(self, items: list[tuple[str, Firing, dict[str, Future]]]) -> None:
        """Hand over several firings as one command, so one step can batch them all."""
        self._commands.append(("many", items))
        if self._idle:
            self._wake.set()

    def join(self, plan: CohortPlan, member: Member) -> None:
        """A request's loop instance joins the cohort of that loop (see ``worker.cohort``)."""
        self._commands.append(("join", plan, member))
        if self._idle:
            self._wake.set()

    def release(self, request_id: str) -> None:
        self._commands.append(("release", request_id))
        if self._idle:
            self._wake.set()

    def cohort_members(self) -> int:
        """Requests' loop instances held by cohorts (joined or waiting to), for the stats; approximate while running."""
        return sum(not m.dead for c in list(self._cohorts.values()) for m in [*c.members, *c.joining])

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
        unread, self._unread = self._unread, 0
        if unread:
            self._wake.set()  # a cohort may be waiting (or about to wait) for its reports to be read
        return out

    # ---- compute thread side -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._close_engines()

    def _close_engines(self) -> None:
        """Engine.close, once each, on this thread after its last step (the worker is shutting down)."""
        for name, engine in self.engines.items():
            try:
                engine.close()
            except Exception:
                log.exception("engine %s failed to close", name)

    def _loop(self) -> None:
        """Each turn: new commands, one step of an engine with queued firings, then one step of every cohort.

        The engine step goes first so that a firing the main thread just handed
        over (a stream consumer's chunk, a new request's prefill) waits for at
        most the step in progress, not also for the cohorts' next step: with the
        cohorts first, a speech answer's first Code2Wav chunk waited one more
        talker and code-predictor step after its frames were there.
        """
        while not self._stop:
            self._drain_commands()
            self._submit_resolved()
            name = self._pick()
            if name is not None:
                self._step(name)
            moved = self._advance_cohorts()
            if name is None and not moved:
                self._idle = True
                if not self._commands and not self._stop:
                    self._wake.wait(0.05)
                self._wake.clear()
                self._idle = False

    def _drain_commands(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if cmd[0] == "many":
                self._waiting.extend(cmd[1])
            elif cmd[0] == "join":
                _, plan, member = cmd
                cohort = self._cohorts.get((plan.walk, plan.scope))
                if cohort is None:
                    cohort = self._cohorts[(plan.walk, plan.scope)] = Cohort(
                        plan, self.engines, self._cohort_firing, self._account
                    )
                cohort.join(member)
            else:
                rid = cmd[1]
                for cohort in self._cohorts.values():
                    cohort.release(rid)
                self._cohort_firings = {f: c for f, c in self._cohort_firings.items() if f in c.pending}
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
            engine = self.engines[component]
            if getattr(engine, "kv_contexts", False):
                try:
                    firing.kv = bind_kv(firing.node, firing.node_params, firing.inputs)
                except ValueError as e:
                    self._publish(component, FiringResult(firing, error=f"{component}: {e}"), futures)
                    self._signal()
                    continue
            self._futures[firing.id] = (firing.request_id, futures)
            engine.submit(firing)

    def _cohort_firing(self, cohort: Cohort) -> int:
        fid = next(self._cohort_ids)
        self._cohort_firings[fid] = cohort
        return fid

    def _advance_cohorts(self) -> bool:
        """One step (or as far as engine results allow) of every cohort; True if a step finished.

        Cohorts run at most LOOKAHEAD steps ahead of the main thread: with that
        many reports unread they wait, so the main thread gets the interpreter to
        route outputs and start new members (which then join a step or two later
        instead of trickling in one by one behind a cohort that races ahead), and
        the main thread sends a few steps' outputs as one message when it is behind.
        """
        if self._unread >= LOOKAHEAD:
            return False
        moved = False
        for cohort in self._cohorts.values():
            if not cohort.has_work() and not cohort.report.failed:
                continue
            report = cohort.advance()
            if report is not None:
                self._results.append(("cohort", report))
                self._unread += 1
                moved = True
        if moved:
            self._signal()
        return moved

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
            error = f"engine {name!r} failed: {type(e).__name__}: {e}"
            for cohort in self._cohorts.values():
                cohort.engine_failed(name, error)
            self._results.append((name, error))
            self._signal()
            return
        self._account(name, time.perf_counter() - t0, len(results))
        published = False
        for r in results:
            cohort = self._cohort_firings.pop(r.firing.id, None)
            if cohort is not None:
                cohort.on_result(r)
                continue
            self._publish(name, r, self._futures.pop(r.firing.id, ("", {}))[1])
            published = True
        if published:
            self._signal()

    def _account(self, name: str, seconds: float, items: int) -> None:
        """One engine call of component ``name``: a step, or a cohort's group run (``Engine.run_groups``)."""
        self.busy_s[name] += seconds
        self.steps[name] += 1
        self.items[name] += items

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
