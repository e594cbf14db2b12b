"""One KV context of a request: its token history and how much of it is in the pool."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from walkserve.engines.kv.block_manager import ContextKey


@dataclass
class PendingFiring:
    """A submitted firing whose tokens end at context position ``end``; its result is due then."""

    firing: Any  # walkserve.engines.base.Firing (kept untyped: this module stays torch-free)
    end: int


@dataclass
class Context:
    """Token history of ``key`` = (request_id, tag) and its progress.

    ``token_ids[:num_computed]`` have their KV in the pool (while the block
    manager holds a table for ``key``); the rest still has to run. Firings
    append tokens and queue in ``pending`` in order. ``sampled`` lists the
    tokens this engine drew for the context (the "output" of penalties and
    the step counter of seeded draws). ``order`` is the admission priority:
    lower runs first and is preempted last; a preempted context keeps it.
    ``embeds`` holds input embeddings that replace the token embeddings of
    some positions (``start -> [n, D]`` tensor); positions from
    ``cache_limit`` on are never shared through the prefix cache.
    """

    key: ContextKey
    order: int
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    sampled: list[int] = field(default_factory=list)
    pending: deque[PendingFiring] = field(default_factory=deque)
    embeds: dict[int, Any] = field(default_factory=dict)
    cache_limit: int | None = None

    @property
    def request_id(self) -> str:
        return self.key[0]

    @property
    def has_work(self) -> bool:
        return bool(self.pending)

    @property
    def target(self) -> int:
        """Where the current step must stop: the end of the oldest pending firing."""
        return self.pending[0].end

    @property
    def remaining(self) -> int:
        """Tokens to compute before the oldest pending firing is answered."""
        return self.target - self.num_computed

    @property
    def cacheable(self) -> int:
        """How many leading tokens may be shared through the prefix cache."""
        return len(self.token_ids) if self.cache_limit is None else self.cache_limit

    def append(self, firing: Any, token_ids: list[int], embeds: Any = None) -> PendingFiring:
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        if embeds is not None:
            self.embeds[start] = embeds
            self.cache_limit = start if self.cache_limit is None else min(self.cache_limit, start)
        pending = PendingFiring(firing, len(self.token_ids))
        self.pending.append(pending)
        return pending
