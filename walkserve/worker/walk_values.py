"""How long a walk keeps a produced value: until its last local read, when the plan can count them.

A mixin of WalkState; it reads and writes the walk state's fields. The plan
(``PlanIndex.once_readers``) says which consumers read each per-iteration
value exactly once; this rank counts those placed on it. A value is stored
with that count, each firing that takes it counts one down, and the last read
drops it. A launched firing's future may be read before the firing completes:
then the key stays in ``reads_left`` at 0 so the completed value is not
stored again. Other values (read an unknown number of times) stay until the
walk ends.
"""

from __future__ import annotations

from typing import Any


class ValueReads:
    def _init_reads(self) -> None:
        self.reads_left: dict[tuple, int] = {}  # reads a stored value still has coming on this rank
        self._awaiting: set[tuple] = set()  # keys holding a launched firing's future, not yet completed
        self._local_reads = {
            src: sum(1 for c in names if self.ranks.get(c) == self.rank)
            for src, names in self.idx.once_readers.items()
        }

    def _store(self, key: tuple, value: Any) -> bool:
        """Keep a produced value for local consumers; False when none will ever read it here."""
        node, out, path = key
        reads = self._local_reads.get((node, out))
        if reads is None or len(path) != self.idx.chain_len[node]:
            self.values[key] = value  # read an unknown number of times: kept until the walk ends
            return True
        if reads == 0:
            return False
        if key not in self.reads_left:
            self.reads_left[key] = reads
        self.values[key] = value
        return True

    def _completed_value(self, key: tuple, value: Any) -> None:
        """A local firing's output replaces its future (or arrives, when none was exposed)."""
        self._awaiting.discard(key)
        if self.reads_left.get(key) == 0:  # every local reader took the future already
            del self.reads_left[key]
        else:
            self._store(key, value)

    def _read(self, keys: list[tuple]) -> None:
        """A firing took these values: drop each one whose last local read this was."""
        left = self.reads_left
        for key in keys:
            n = left.get(key)
            if n is None:
                continue
            if n > 1:
                left[key] = n - 1
                continue
            del self.values[key]
            if key in self._awaiting:
                left[key] = 0  # its firing's completion is still to come: drop the value then too
            else:
                del left[key]
