"""Waiting for a condition in tests that watch another process or thread."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
