"""Starts, watches and restarts the worker processes (one per rank).

Workers are fresh interpreters (``python -m walkserve.worker.main``), so
nothing of the parent's state or ``__main__`` leaks into them, and the
conductor itself never loads torch. Each worker is watched through a pidfd
that becomes readable the moment it exits.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from walkserve.core.proc import describe_exit

log = logging.getLogger(__name__)


class Child:
    """A child process with a pidfd for the poller."""

    def __init__(self, argv: list[str]):
        self.popen = subprocess.Popen(argv, close_fds=True)
        self.pid = self.popen.pid
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Supervisor:
    def __init__(self, spec_path: str, ranks: list[int]):
        self.spec_path = spec_path
        self.ranks = ranks
        self.procs: dict[int, Child] = {}
        self.restarts: dict[int, int] = {r: 0 for r in ranks}

    def start(self, rank: int) -> None:
        argv = [sys.executable, "-m", "walkserve.worker.main", self.spec_path, str(rank), str(os.getpid())]
        self.procs[rank] = child = Child(argv)
        log.info("started worker rank %d (pid %d)", rank, child.pid)

    def start_all(self) -> None:
        for rank in self.ranks:
            self.start(rank)

    def sentinels(self) -> list[int]:
        """pidfds of running workers, for the conductor's poller (readable when one exits)."""
        return [c.pidfd for c in self.procs.values() if c.pidfd is not None and c.exitcode is None]

    def dead(self) -> list[tuple[int, str]]:
        return [(r, f"pid {c.pid} {describe_exit(c.exitcode)}") for r, c in self.procs.items() if c.exitcode is not None]

    def restart(self, rank: int) -> None:
        self.forget(rank)
        self.restarts[rank] += 1
        self.start(rank)

    def forget(self, rank: int) -> None:
        child = self.procs.pop(rank, None)
        if child is not None:
            child.wait(1)
            child.close()

    def stop_all(self, grace_s: float = 3.0) -> None:
        deadline = time.monotonic() + grace_s
        for child in self.procs.values():
            child.wait(max(0.0, deadline - time.monotonic()))
        for child in self.procs.values():
            child.kill()
            child.wait(5)
            child.close()
        self.procs.clear()
