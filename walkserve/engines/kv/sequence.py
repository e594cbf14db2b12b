"""One KV context of a request: what was appended to it (segments) and how much of it is in the pool.

    context ("r1", "gen"):  token_ids / positions of every appended row, in segments
        | text (causal, running positions) | image block (full, one shared position) | text ... |
          ^ num_computed: rows before it have their KV in the pool (while the block manager holds a table)

A segment is one firing's chunk (adjacent plain token appends merge into one
segment, so a decoded history replays as one chunk). Preemption frees the
blocks and keeps the segments: the context is recomputed from them, with the
same masks, positions and embeddings.

Prefix-cache keys, one per row (``row_keys``): a plain row's key is its token
id; so is a content-keyed row (``ContextOp.keyed``) with content 0 at the
running position (what a plain row there would get). Any other content-keyed
row is keyed ``(token id, *content, positions)`` (content: the row's K ints):
a media row by its item's digest (128 bits, K = 2: ``models/common/content_key.py``;
bind refuses a narrower key on an embedded row), a row at an explicit
position by that position. A row of a ``full``
append is keyed ``(its key, digest of every row's key in the append)`` (``row_digest``): its K/V
depend on every row of the append, not only on those before it. A block's key chains
its parent's, so a row's key needs no more than that: the running position is
a function of the rows before it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from walkserve.engines.kv import row_digest


@dataclass
class PendingFiring:
    """A submitted firing whose chunk is context rows ``[start, end)``; its result is due at ``end``.

    ``firing`` is None for a restore marker (a query needs the context back in
    the pool). ``rows`` collects the chosen rows' outputs of earlier chunks.
    """

    firing: Any  # walkserve.engines.base.Firing
    end: int
    start: int = 0
    op: Any = None  # walkserve.engines.kv.ops.ContextOp
    rows: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class Segment:
    """Rows ``[start, start + n)`` appended together: their mask and how to rebuild their inputs.

    ``pos_base`` set: positions are ``pos_base + 0..n-1``; else ``positions`` holds
    them ([n] or [A, n]). ``embeds`` maps chunk rows to input embeddings
    (``embed_rows`` [N] int64, or None for every row). ``token_inputs`` are the
    extra per-token model inputs ([n, ...] each). ``component`` wrote the rows
    ("" = the context's own): components of a KV share group may append to one
    context (pi0's action expert writes its state token after the VLM's
    prefix), and each segment is computed, and recomputed, by its writer.
    """

    start: int
    n: int
    mask: str = "causal"
    frame: int = 0
    pos_base: int | None = None
    positions: Any = None
    embeds: Any = None
    embed_rows: Any = None
    token_inputs: dict[str, Any] = field(default_factory=dict)
    axes: int = 1  # position axes (1, or A for multi-axis rope)
    component: str = ""
    keyed: bool = False  # a content-keyed append: shareable through the prefix cache though not plain

    @property
    def end(self) -> int:
        return self.start + self.n

    @property
    def plain(self) -> bool:
        return self.mask == "causal" and self.pos_base is not None and self.embeds is None and not self.token_inputs

    def unit(self) -> int:
        """The smallest piece a chunk of this segment may be cut into (a full block runs whole)."""
        return self.frame if self.mask == "block_causal" else (self.n if self.mask == "full" else 1)

    def max_position(self) -> int | float:
        if self.pos_base is not None:
            return self.pos_base + self.n - 1
        top = self.positions.max()
        return float(top) if self.positions.is_floating_point() else int(top)


@dataclass
class Context:
    """The history of ``key`` = (request_id, name) and its progress.

    ``token_ids`` has one id per appended row (0 where embeddings stand in);
    ``token_ids[:num_computed]`` have their KV in the pool while the block
    manager holds a table for ``key``. Firings queue in ``pending`` in order.
    ``sampled`` lists the tokens drawn for the context (penalties, seeded draw
    counters). ``order`` is the admission priority (lower runs first, is
    preempted last). Rows from ``cache_limit`` on are never shared through the
    prefix cache. ``readers`` counts waiting queries that read the context (it
    is not preempted while any wait). ``next_position`` is the running position.
    """

    key: tuple[str, str]
    order: int
    component: str = ""
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    sampled: list[int] = field(default_factory=list)
    pending: deque[PendingFiring] = field(default_factory=deque)
    segments: list[Segment] = field(default_factory=list)
    cache_limit: int | None = None
    readers: int = 0
    next_position: int = 0
    axes: int = 1
    key_overrides: dict[int, tuple] = field(default_factory=dict)  # row -> its prefix-cache key, where not its id

    @property
    def request_id(self) -> str:
        return self.key[0]

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def has_work(self) -> bool:
        return bool(self.pending)

    @property
    def target(self) -> int:
        """Where the current step must stop: the end of the oldest pending firing."""
        return self.pending[0].end

    @property
    def remaining(self) -> int:
        return self.target - self.num_computed

    @property
    def cacheable(self) -> int:
        return self.length if self.cache_limit is None else self.cache_limit

    def row_keys(self) -> list[int] | RowKeys:
        """Each row's prefix-cache key (see the module docstring)."""
        return RowKeys(self.token_ids, self.key_overrides) if self.key_overrides else self.token_ids

    def segment_at(self, row: int) -> Segment:
        """The segment holding row ``row`` (the last one first: that is where work usually is)."""
        for seg in reversed(self.segments):
            if seg.start <= row:
                return seg
        raise IndexError(row)

    def append(self, firing: Any, token_ids: list[int], op: Any = None, component: str = "") -> PendingFiring:
        """Add an append's rows (``op`` the bound ContextOp; None: plain tokens) written by ``component``
        ("" or the context's own: the context's component); returns its pending entry."""
        start, n = self.length, len(token_ids)
        self.token_ids.extend(token_ids)
        component = "" if component == self.component else component
        last = self.segments[-1] if self.segments else None
        if (op is None or op.plain) and last is not None and last.plain and last.end == start \
                and last.pos_base + last.n == self.next_position and last.axes == self.axes \
                and last.component == component:
            last.n += n  # a decode step extends its plain segment (no new object)
            self.next_position += n
            pending = PendingFiring(firing, self.length, start, op)
            self.pending.append(pending)
            return pending
        seg = _segment(op, start, n, self.next_position, self.axes)
        seg.component = component
        self.axes = seg.axes
        last = self.segments[-1] if self.segments else None
        if seg.plain and last is not None and last.plain and last.end == start and last.pos_base + last.n == seg.pos_base \
                and last.component == component:
            last.n += n
        else:
            self.segments.append(seg)
        if op is not None and op.keyed and not op.plain:
            seg.keyed = True
            self._key_rows(op, start)
        elif not (op.plain if op is not None else True):
            self.cache_limit = start if self.cache_limit is None else min(self.cache_limit, start)
        self.next_position = max(self.next_position, seg.max_position() + 1)
        pending = PendingFiring(firing, self.length, start, op)
        self.pending.append(pending)
        return pending

    def _key_rows(self, op: Any, start: int) -> None:
        """Record the keys of a content-keyed chunk's rows that are not their token ids. In a ``full`` append
        every row's K/V depend on every row of it, so each row's key is paired with a digest of all of them."""
        ids, content = op.token_ids.tolist(), op.content.tolist()  # content: an int or a list of K ints per row
        nonzero = content if op.content.dim() == 1 else (op.content != 0).any(1).tolist()
        positions = None if op.positions is None else op.positions.tolist()
        running = self.next_position
        keys: list[Any] = []
        for i, (token, digest, keyed) in enumerate(zip(ids, content, nonzero)):
            if positions is None:
                at: tuple = (running,)
            else:
                at = tuple(axis[i] for axis in positions) if op.positions.dim() == 2 else (positions[i],)
            if keyed or any(p != running for p in at):
                keys.append((token, digest, at) if type(digest) is int else (token, *digest, at))
            else:
                keys.append(token)
            running = max(running, max(at) + 1)
        if op.mask == "full":
            whole = row_digest.chain(row_digest.ROOT, keys)
            keys = [(key, whole) for key in keys]
        for i, (token, key) in enumerate(zip(ids, keys)):
            if key != token:
                self.key_overrides[start + i] = key

    def restore(self) -> None:
        """Ask for the whole history back in the pool (a query will read it)."""
        if not self.pending:
            self.pending.append(PendingFiring(None, self.length, self.length))

    def truncate(self, n: int) -> None:
        """Forget rows from ``n`` on (the caller frees their blocks)."""
        n = min(n, self.length)
        del self.token_ids[n:]
        kept = []
        for seg in self.segments:
            if seg.start >= n:
                continue
            if seg.end > n:
                seg = _cut(seg, n - seg.start)
            kept.append(seg)
        self.segments = kept
        self.key_overrides = {row: key for row, key in self.key_overrides.items() if row < n}
        self.num_computed = min(self.num_computed, n)
        self.next_position = max((s.max_position() + 1 for s in kept), default=0)
        if self.cache_limit is not None and self.cache_limit >= n:
            self.cache_limit = None if all(s.plain or s.keyed for s in kept) else self.cache_limit
        if not kept:
            self.axes = 1

    def snapshot(self, key: tuple[str, str], order: int) -> Context:
        """A copy of this history under ``key`` (a fork); the copy has no pending work."""
        return Context(key, order, self.component, list(self.token_ids), self.num_computed, list(self.sampled),
                       deque(), [_copy(s) for s in self.segments], self.cache_limit, 0, self.next_position, self.axes,
                       dict(self.key_overrides))


class RowKeys:
    """Row keys as a read-only sequence: the token ids, with ``overrides`` at the rows they name."""

    def __init__(self, token_ids: list[int], overrides: dict[int, tuple]):
        self._ids, self._overrides = token_ids, overrides

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, rows: int | slice) -> Any:
        if isinstance(rows, int):
            return self._overrides.get(rows % len(self._ids), self._ids[rows])
        start, stop, _ = rows.indices(len(self._ids))
        return [self._overrides.get(r, self._ids[r]) for r in range(start, stop)]


def _segment(op: Any, start: int, n: int, next_position: int, axes: int) -> Segment:
    if op is None:
        return Segment(start, n, pos_base=next_position, axes=axes)
    seg = Segment(start, n, op.mask, op.frame, embeds=op.embeds, embed_rows=op.embed_rows,
                  token_inputs=dict(op.token_inputs), axes=axes)
    if op.positions is None:
        seg.pos_base = next_position
    else:
        seg.positions = op.positions
        seg.axes = 1 if op.positions.dim() == 1 else op.positions.shape[0]
    return seg


def _cut(seg: Segment, n: int) -> Segment:
    """The first ``n`` rows of ``seg``."""
    out = _copy(seg)
    out.n = n
    if seg.positions is not None:
        out.positions = seg.positions[..., :n]
    if seg.embeds is not None:
        if seg.embed_rows is None:
            out.embeds = seg.embeds[:n]
        else:
            keep = seg.embed_rows < n
            out.embeds, out.embed_rows = seg.embeds[keep], seg.embed_rows[keep]
    out.token_inputs = {k: v[:n] for k, v in seg.token_inputs.items()}
    return out


def _copy(seg: Segment) -> Segment:
    return Segment(seg.start, seg.n, seg.mask, seg.frame, seg.pos_base, seg.positions, seg.embeds, seg.embed_rows,
                   dict(seg.token_inputs), seg.axes, seg.component, seg.keyed)
