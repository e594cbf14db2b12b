"""TimingLog: a process's timing records (``Timing``) until its next send, for the per-request traces.

The conductor and each worker hold one when ``RuntimeConfig.timings`` is on (else None, and no
call site pays more than that check). A record costs one tuple; ``take`` builds the message.
"""

from __future__ import annotations

import os

from walkserve.protocol import messages as m


class TimingLog:
    __slots__ = ("_records", "pid", "rank")

    def __init__(self, rank: int):
        self.rank, self.pid = rank, os.getpid()
        self._records: list[tuple] = []

    def __bool__(self) -> bool:
        return bool(self._records)

    def add(self, kind: str, name: str, walk: str, start_ns: int, end_ns: int, request_ids: list[str],
            attrs: dict | None = None) -> None:
        self._records.append((kind, name, walk, start_ns, end_ns, list(request_ids), attrs or {}))

    def take(self) -> m.Timings | None:
        """The records since the last take, as one message (None when there are none)."""
        if not self._records:
            return None
        records, self._records = self._records, []
        return m.Timings(self.rank, self.pid, [m.Timing(*r) for r in records])
