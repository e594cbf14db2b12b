"""Waiting for a condition in tests that watch another process or thread."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie. The process may go between any two reads, so it is read once."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # gone (ENOENT, or ESRCH while reading)
        return False
