"""ProcessorLanes: where the API runs processor calls (chat templates, tokenization), off its event loop.

Two lanes of one thread each, first come first served within a lane: a payload carrying more than
``big_input`` characters of text (or token ids, or bytes of media) is built in the big lane, every other in
the small one. A long prompt's tokenization (seconds for megabytes) then never holds up the small requests
that arrive behind it, and the tokenizer lets go of the GIL while it works (``Tokenizer.encode``), so both
lanes and the event loop run at once. A request whose client went away while it waited in a lane is
dropped from it (its future is cancelled); one already being built runs to its end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

BIG_INPUT = 16_384  # about 15 ms of tokenizing with a byte-level BPE (docs/api.md: Limits)
T = TypeVar("T")


class ProcessorLanes:
    def __init__(self, big_input: int = BIG_INPUT):
        self.big_input = big_input
        self._small = ThreadPoolExecutor(1, thread_name_prefix="walkserve-processor")
        self._big = ThreadPoolExecutor(1, thread_name_prefix="walkserve-processor-big")

    def is_big(self, payload: dict[str, Any]) -> bool:
        return input_size(payload, self.big_input) > self.big_input

    async def run(self, payload: dict[str, Any], build: Callable[[], T]) -> T:
        """``build()`` in the lane ``payload``'s size picks."""
        lane = self._big if self.is_big(payload) else self._small
        return await asyncio.get_running_loop().run_in_executor(lane, build)


def input_size(value: Any, limit: int) -> int:
    """How much input a payload value carries: characters of text, numbers in a list (token ids), bytes of an
    array; counted until it passes ``limit`` (a body of many parts costs no more than that to size)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)  # ArrayData, numpy arrays
    if isinstance(nbytes, int):
        return nbytes
    items = list(value.values()) if isinstance(value, dict) else value
    if not isinstance(items, (list, tuple)):
        return 0
    if items and isinstance(items[0], (int, float)):
        return len(items)
    total = 0
    for item in items:
        total += input_size(item, limit - total)
        if total > limit:
            break
    return total
