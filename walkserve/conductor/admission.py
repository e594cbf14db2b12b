"""Admission: a bound on running requests, then a bounded queue, then a clear rejection."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from walkserve.core.request import RequestSpec


@dataclass
class Admission:
    max_running: int
    max_waiting: int
    queue: deque[tuple[RequestSpec, float]] = field(default_factory=deque)

    def decide(self, running: int) -> str:
        """'run', 'queue' or 'reject' for a new request, given how many are running now."""
        if running < self.max_running and not self.queue:
            return "run"
        if len(self.queue) < self.max_waiting:
            return "queue"
        return "reject"

    def enqueue(self, spec: RequestSpec) -> None:
        self.queue.append((spec, time.monotonic()))

    def next_ready(self, running: int) -> tuple[RequestSpec, float] | None:
        if self.queue and running < self.max_running:
            return self.queue.popleft()
        return None

    def remove(self, request_id: str) -> bool:
        for i, (spec, _) in enumerate(self.queue):
            if spec.id == request_id:
                del self.queue[i]
                return True
        return False

    def retry_after(self) -> float:
        """A hint for clients: about one second per queue's worth of requests ahead."""
        return max(1.0, min(30.0, len(self.queue) / max(1, self.max_running)))
