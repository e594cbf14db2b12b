"""Paged-KV bookkeeping on plain ints: which blocks each context owns.

A *context* is one KV sequence, keyed by ``(request_id, tag)`` so one request
may hold several (the CFG conditions of an image generation) in one pool.
Its *block table* lists block ids; token position ``p`` lives in slot
``table[p // block_size] * block_size + p % block_size``.

    context ("r1", "main"), block_size 4, 10 tokens reserved:
        table  [5, 2, 7]
        tokens |0 1 2 3|4 5 6 7|8 9 . .|
                 full    full   partial

Blocks are reference counted. ``fork`` shares a whole table; the shared
partial last block is copied on the next write (copy-on-write: the copy is
queued in ``take_copies`` for the KV pool to perform). Prefix reuse: every
*full* block whose tokens were computed is registered under a digest of
its parent's digest and its own rows' keys (``row_digest.chain``: BLAKE2b, so
no client can make two different histories share a key, as it could with ``hash()``), so
another context starting with the same tokens attaches the same block instead
of computing it again (a row's key is its token id, or for rows filled by
media or placed at explicit positions a content key:
``sequence.Context.row_keys``). A
registered block whose last owner is freed stays *evictable* (LRU, the
tail of a freed context first) until it is attached again or its id is
needed for new data. New blocks come first from the never-registered free
list (FIFO), then from the least recently used evictable block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from walkserve.engines.kv import row_digest

ContextKey = tuple[str, str]


@dataclass
class _Block:
    id: int
    ref: int = 0
    key: bytes | None = None  # its digest (parent's digest, row keys) once registered


class BlockManager:
    """Block tables, free list and prefix cache of one KV pool. Pure integer bookkeeping."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._cached: dict[bytes, int] = {}  # digest -> block id
        self._tables: dict[ContextKey, list[int]] = {}
        self._reserved: dict[ContextKey, int] = {}
        self._chain: dict[ContextKey, list[bytes]] = {}  # digest of each leading full block registered (or attached)
        self._copies: list[tuple[int, int]] = []

    # ---- queries -------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free + evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one context."""
        return self.num_blocks - self.num_free

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def has(self, key: ContextKey) -> bool:
        return key in self._tables

    def keys(self) -> list[ContextKey]:
        return list(self._tables)

    def table(self, key: ContextKey) -> list[int]:
        return self._tables[key]

    def num_reserved(self, key: ContextKey) -> int:
        """Token slots reserved for ``key`` (computed or about to be)."""
        return self._reserved.get(key, 0)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref

    def slot(self, key: ContextKey, position: int) -> int:
        bs = self.block_size
        return self._tables[key][position // bs] * bs + position % bs

    def blocks_needed(self, key: ContextKey, num_tokens: int) -> int:
        """New blocks that appending ``num_tokens`` slots to ``key`` takes (copy-on-write included)."""
        table, used = self._tables.get(key, []), self._reserved.get(key, 0)
        fill = used % self.block_size
        cow = 1 if fill and num_tokens and self._blocks[table[-1]].ref > 1 else 0
        return _ceil_div(used + num_tokens, self.block_size) - len(table) + cow

    def can_append(self, key: ContextKey, num_tokens: int) -> bool:
        return self.blocks_needed(key, num_tokens) <= self.num_free

    def max_appendable(self, key: ContextKey) -> int:
        """The most token slots ``append_slots(key, n)`` can reserve right now."""
        table, used = self._tables.get(key, []), self._reserved.get(key, 0)
        fill = used % self.block_size
        room = self.block_size - fill if fill else 0
        free = self.num_free
        if fill and self._blocks[table[-1]].ref > 1:
            if free == 0:
                return 0
            free -= 1
        return room + free * self.block_size

    # ---- allocation ----------------------------------------------------
    def attach_prefix(self, key: ContextKey, row_keys: Sequence[Any], max_tokens: int) -> int:
        """Open an empty table for ``key`` holding the cached full blocks that prefix ``row_keys``.

        ``row_keys`` holds one key per row (a token id, or a content key: ``sequence.Context.row_keys``).
        At most ``max_tokens`` tokens are attached (rounded down to whole
        blocks). Returns how many tokens the attached blocks cover; their KV
        is already in the pool.
        """
        assert key not in self._tables, f"context {key} already has a block table"
        self._tables[key], self._reserved[key], self._chain[key] = [], 0, []
        return self.extend_prefix(key, row_keys, max_tokens)

    def extend_prefix(self, key: ContextKey, row_keys: Sequence[Any], max_tokens: int) -> int:
        """Append to ``key``'s table the cached full blocks that continue it, up to ``max_tokens`` rows.

        Only when its reserved slots are whole blocks, each registered or attached (a later firing of a
        context whose earlier rows ended on a block boundary). Returns how many tokens were attached.
        """
        table, chain, used, bs = self._tables[key], self._chain[key], self._reserved[key], self.block_size
        if not self.prefix_caching or used % bs or len(chain) != len(table):
            return 0
        parent = chain[-1] if chain else row_digest.ROOT
        for i in range(len(table), min(max_tokens, len(row_keys)) // bs):
            digest = row_digest.chain(parent, row_keys[i * bs : (i + 1) * bs])
            block_id = self._cached.get(digest)
            if block_id is None:
                break
            self._take(block_id)
            table.append(block_id)
            parent = digest
            chain.append(digest)
        self._reserved[key] = len(table) * bs
        return self._reserved[key] - used

    def cached_after_partial(self, key: ContextKey, row_keys: Sequence[Any], max_tokens: int) -> bool:
        """Whether, once ``key``'s partial last block is filled with its rows of ``row_keys``, the next block
        (within ``max_tokens`` rows) is in the cache: a chunk should then stop at the block boundary, so the
        next step can attach it (``extend_prefix``)."""
        table, chain, used, bs = self._tables[key], self._chain[key], self._reserved[key], self.block_size
        i = len(table) - 1
        if not self.prefix_caching or not used % bs or len(chain) != i or (i + 2) * bs > min(max_tokens, len(row_keys)):
            return False
        own = row_digest.chain(chain[-1] if chain else row_digest.ROOT, row_keys[i * bs : (i + 1) * bs])
        return row_digest.chain(own, row_keys[(i + 1) * bs : (i + 2) * bs]) in self._cached

    def append_slots(self, key: ContextKey, num_tokens: int) -> bool:
        """Reserve ``num_tokens`` more slots for ``key`` (opening its table if needed).

        All or nothing: returns False and changes nothing when the pool is short.
        """
        if not self.can_append(key, num_tokens):
            return False
        table = self._tables.setdefault(key, [])
        self._chain.setdefault(key, [])
        used = self._reserved.get(key, 0)
        if used % self.block_size and num_tokens and self._blocks[table[-1]].ref > 1:
            table[-1] = self._copy_on_write(table[-1])
        for _ in range(_ceil_div(used + num_tokens, self.block_size) - len(table)):
            table.append(self._new_block())
        self._reserved[key] = used + num_tokens
        return True

    def fork(self, src: ContextKey, dst: ContextKey) -> None:
        """Give ``dst`` a table sharing every block of ``src`` (copy-on-write on the next write)."""
        assert dst not in self._tables, f"context {dst} already has a block table"
        for block_id in self._tables[src]:
            self._blocks[block_id].ref += 1
        self._tables[dst] = list(self._tables[src])
        self._reserved[dst] = self._reserved[src]
        self._chain[dst] = list(self._chain[src])

    def truncate(self, key: ContextKey, num_tokens: int) -> None:
        """Keep only the first ``num_tokens`` slots of ``key``: later blocks are released.

        A kept partial block that only ``key`` holds leaves the prefix cache
        (its tail will be overwritten); a shared one is copied on the next
        write, as after a fork.
        """
        table, bs = self._tables[key], self.block_size
        num_tokens = min(num_tokens, self._reserved[key])
        keep = _ceil_div(num_tokens, bs)
        for block_id in reversed(table[keep:]):
            self._release(block_id)
        del table[keep:]
        self._reserved[key] = num_tokens
        del self._chain[key][num_tokens // bs :]
        if num_tokens % bs:
            block = self._blocks[table[-1]]
            if block.ref == 1 and block.key is not None:
                del self._cached[block.key]
                block.key = None

    def commit(self, key: ContextKey, row_keys: Sequence[Any], num_tokens: int) -> None:
        """Register for reuse every full block of ``key`` within ``row_keys[:num_tokens]`` (its rows' keys).

        Call after a forward wrote the KV of those tokens (``num_tokens`` is
        the context's computed count, or less to keep a tail out of the cache).
        """
        if not self.prefix_caching:
            return
        table, bs, chain = self._tables[key], self.block_size, self._chain[key]
        full = min(num_tokens // bs, len(table))
        for i in range(len(chain), full):
            block = self._blocks[table[i]]
            digest = row_digest.chain(chain[-1] if chain else row_digest.ROOT, row_keys[i * bs : (i + 1) * bs])
            if block.key is None and digest not in self._cached:
                block.key = digest
                self._cached[digest] = block.id
            chain.append(digest)

    def free(self, key: ContextKey) -> None:
        """Drop ``key``'s table; blocks nobody else references become free (or evictable if registered)."""
        table = self._tables.pop(key, None)
        self._reserved.pop(key, None)
        self._chain.pop(key, None)
        for block_id in reversed(table or []):
            self._release(block_id)

    def free_request(self, request_id: str) -> list[ContextKey]:
        """Free every context of ``request_id``; returns their keys."""
        keys = [k for k in self._tables if k[0] == request_id]
        for key in keys:
            self.free(key)
        return keys

    def take_copies(self) -> list[tuple[int, int]]:
        """Pending (src, dst) block copies from copy-on-write; the caller must perform them before writing."""
        copies, self._copies = self._copies, []
        return copies

    # ---- internals -----------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref == 0:
            del self._evictable[block_id]
        block.ref += 1

    def _new_block(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self._blocks[block_id]
            del self._cached[block.key]
            block.key = None
        self._blocks[block_id].ref = 1
        return block_id

    def _copy_on_write(self, shared: int) -> int:
        fresh = self._new_block()
        self._blocks[shared].ref -= 1
        self._copies.append((shared, fresh))
        return fresh

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref -= 1
        assert block.ref >= 0, f"block {block_id} freed more often than taken"
        if block.ref:
            return
        if block.key is not None:
            self._evictable[block_id] = None
        else:
            self._free.append(block_id)

    def check(self) -> None:
        """Assert the internal invariants (tests call it after every operation)."""
        refs = [0] * self.num_blocks
        for table in self._tables.values():
            for block_id in table:
                refs[block_id] += 1
        for block in self._blocks:
            assert block.ref == refs[block.id], f"block {block.id}: ref {block.ref} != {refs[block.id]}"
        idle = set(self._free) | set(self._evictable)
        assert idle == {b.id for b in self._blocks if b.ref == 0}, "free/evictable sets disagree with refs"
        assert all(self._blocks[b].key is not None for b in self._evictable)
        assert all(self._blocks[b].key is None for b in self._free)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)

