"""EventMerger: several async iterators at once (the n choices of a request), in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

_DONE = object()


class EventMerger:
    """Yields ``(index, item)`` from every source; ``close(i)`` stops one source early.

    Each source runs in its own task, so one slow choice does not hold the
    others. An exception from any source ends the merge and is re-raised;
    leaving the iteration cancels every source task (which closes the
    sources, and so aborts their requests).
    """

    def __init__(self, sources: list[AsyncIterator[Any]], queue_size: int = 64):
        self._sources = sources
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=queue_size)
        self._tasks: list[asyncio.Task] = []
        self._done: set[int] = set()

    async def _pump(self, index: int, source: AsyncIterator[Any]) -> None:
        try:
            async for item in source:
                await self._queue.put((index, item, None))
        except Exception as e:
            await self._queue.put((index, None, e))
            return
        finally:
            if hasattr(source, "aclose"):
                with contextlib.suppress(Exception):
                    await source.aclose()
        await self._queue.put((index, _DONE, None))

    def close(self, index: int) -> None:
        """Stop source ``index`` (its queued items are dropped)."""
        self._done.add(index)
        if index < len(self._tasks):
            self._tasks[index].cancel()

    async def items(self) -> AsyncIterator[tuple[int, Any]]:
        self._tasks = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(self._sources)]
        try:
            while len(self._done) < len(self._sources):
                index, item, error = await self._queue.get()
                if index in self._done:
                    continue
                if error is not None:
                    raise error
                if item is _DONE:
                    self._done.add(index)
                    continue
                yield index, item
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
