"""Futures: outputs of firings handed to the compute thread that have not run yet."""

from __future__ import annotations

from typing import Any

PENDING, READY, FAILED = 0, 1, 2


class Future:
    """An output of a firing that has not run yet. Written by the compute thread only.

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
