"""What a pass may do to the rank: the one object ``cohort``, ``iteration`` and ``streams`` act through.

    out       messages leaving the rank, gathered per destination (``outgoing``)
    touch     a cohort may move: the next pass looks at it (``dirty``)
    fail      a request cannot go on: reported once, its members stop (their cohorts look again)
    stash     a row for a level instance that has not joined here yet
    walk_done a walk whose last local instance ended: queued in ``done`` for the
              executor, which reports it or starts the next walk after the pass
    counters  this rank's counters (firings, contexts moved, walks started here)

Nothing here knows the executor: the calls of a pass go down only, and what
must go up (a finished walk) is queued, not called.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from walkserve.protocol import messages as m
from walkserve.worker.outgoing import Outgoing

if TYPE_CHECKING:
    from walkserve.worker.rows import Row
    from walkserve.worker.state import WalkRun


class Effects:
    __slots__ = ("concat", "counters", "dirty", "done", "hand_off", "out", "rank")

    def __init__(self, rank: int, concat: Callable[[list, Any], Any]):
        """``concat`` joins stream items and accumulated exits (tensors, in practice)."""
        self.rank, self.concat = rank, concat
        self.out = Outgoing()
        self.dirty: dict[Any, None] = {}  # cohorts the next pass looks at, in order
        self.done: list[WalkRun] = []  # walks that ended here, for the executor
        self.counters: dict[str, int] = defaultdict(int)
        self.hand_off: Callable[[], None] | None = None  # sends the rows for other ranks now (the worker's)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def touch(self, cohort: Any) -> None:
        self.dirty[cohort] = None

    def take_dirty(self) -> dict[Any, None]:
        """The cohorts touched so far, in order, for a pass; touches from now on are for the next one."""
        dirty, self.dirty = self.dirty, {}
        return dirty

    def forget(self, cohort: Any) -> None:
        """A cohort that is gone (its request released, with loop cohorts off)."""
        self.dirty.pop(cohort, None)

    def hand_off_now(self) -> None:
        """A step's rows for other ranks are complete: send them before this rank's own bookkeeping of the step,
        so the next rank starts while this one goes on (a no-op without a ``hand_off``, or with no rows)."""
        if self.hand_off is not None and self.out.rows_for_ranks:
            self.hand_off()

    def fail(self, run: WalkRun, error: str) -> None:
        """The request cannot go on: report it once; its members stop (the conductor releases it)."""
        req = run.request
        if req.failed:
            return
        for member in req.fail():  # a cohort whose members inside an iteration all ended admits its joiners
            self.touch(member.cohort)
        self.out.conductor(m.Failed(req.id, error))

    def stash(self, run: WalkRun, key: tuple, row: Row) -> None:
        """A row for a level instance that has not joined on this rank yet."""
        run.stash(key, row)

    def walk_done(self, run: WalkRun) -> None:
        """Every local node of ``run`` finished; the executor takes it from ``done`` after the pass."""
        run.finish()
        self.done.append(run)
