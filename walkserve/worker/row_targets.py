"""The members a peer's batched messages reached, by request id, so a step's rows skip most of the lookups.

A split loop's rank gets one Values (and one LoopEvents) message per step from its peer, with rows for
the same requests step after step. Finding a row's member the long way takes three dict lookups and a
key built per row (request -> walk -> (level, outer path) -> member). Kept here, per message key (walk,
node and output; or walk and scope): request id -> the member its last row reached. A row whose kept
member has ended since, or is another instance than the row's outer path, goes the long way
(``Executor.on_values``, ``on_loops``), and what it reaches is kept instead.

    (walk, node, output) ─▶ {request id: member}      ("loops", walk, scope) ─▶ {request id: member}

A released request's entries go (``forget``). Bookkeeping only: the rows' values are not touched here.
"""

from __future__ import annotations

from walkserve.worker.state import Member


class RowTargets:
    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict[tuple, dict[str, Member]] = {}

    def members(self, key: tuple, request_ids: list[str]) -> list[Member | None]:
        """The member kept for each row's request under ``key`` (None: none yet)."""
        known = self.known.get(key)
        if known is None:
            return [None] * len(request_ids)
        get = known.get
        return [get(rid) for rid in request_ids]

    def keep(self, key: tuple, request_ids: list[str], members: list[Member | None], rows: list[int]) -> None:
        """What rows ``rows`` reached the long way (``members[i]`` None: none, and none is kept for row i)."""
        known = self.known.setdefault(key, {})
        for i in rows:
            member = members[i]
            if member is not None:
                known[request_ids[i]] = member
            else:
                known.pop(request_ids[i], None)

    def forget(self, request_id: str) -> None:
        for known in self.known.values():
            known.pop(request_id, None)
