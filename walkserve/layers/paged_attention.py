"""Paged attention: keys and values live in a block pool shared by many sequences.

One model call computes a ragged batch of sequences. Sequence ``i`` brings
``query_lens[i]`` rows and is either

    an append:  its rows are written to ``block_tables[i]`` at positions
                kv_lens[i] - q .. kv_lens[i] - 1 and attend to the cached prefix
                (every key before them) plus the chunk under its mask;
    a query:    ``reads[i]`` lists (block table, length) of each context it reads,
                in order; its rows attend to all of them plus the chunk under its
                mask, and nothing is written.

    keys seen by a chunk row:   | cached prefix (all visible) | chunk rows (mask) |
    mask:  causal        row r sees chunk rows 0..r
           full          row r sees every chunk row
           block_causal  row r sees chunk rows of frames <= r // frame

Padding (a block's unwritten tail, the blocks of shorter sequences) is hidden
by a finite large negative bias or a False in a bool mask, never -inf, so no
row is ever NaN: every row sees at least itself.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from walkserve.layers.attention import AttentionContext
from walkserve.layers.decode_mirror import DecodeMirror

MASKS = ("causal", "full", "block_causal")
DECODES = ("mirror", "gather")  # how a CPU batch of decodes reads its keys (see TorchPagedAttention)
DECODE = "mirror"


@contextlib.contextmanager
def use_decode(name: str) -> Iterator[None]:
    """Run the block with CPU decode batches read the ``name`` way (benchmarks and tests compare them)."""
    global DECODE
    assert name in DECODES, name
    before, DECODE = DECODE, name
    try:
        yield
    finally:
        DECODE = before

Read = tuple[list[int], int]  # (block table, tokens) of one context a query reads


@dataclass(frozen=True)
class PagedBatch:
    """Which rows of which sequences one model call computes (plain ints, built per step).

    ``kv_lens[i]``: an append's tokens after the step (its prefix is
    ``kv_lens[i] - query_lens[i]``); a query's cached keys (the sum of its
    reads). ``block_tables[i]``: an append's table (``position // block_size``
    indexes it); ``[]`` for a query. ``masks``/``frames``: per sequence (None =
    all causal). ``reads``: per sequence, None for an append, the contexts read
    for a query (None = no queries at all).
    """

    query_lens: list[int]
    kv_lens: list[int]
    block_tables: list[list[int]]
    block_size: int
    masks: list[str] | None = None
    frames: list[int] | None = None
    reads: list[list[Read] | None] | None = None

    def __post_init__(self) -> None:
        assert len(self.query_lens) == len(self.kv_lens) == len(self.block_tables)
        for i, (q_len, kv_len, table) in enumerate(zip(self.query_lens, self.kv_lens, self.block_tables)):
            if self.is_query(i):
                assert sum(n for _, n in self.reads[i]) == kv_len and q_len >= 1, f"query {i}: kv_len {kv_len}"
                for t, n in self.reads[i]:
                    assert len(t) * self.block_size >= n, f"block table too short for {n} tokens"
                continue
            assert 1 <= q_len <= kv_len, f"query_len {q_len} must be in [1, kv_len {kv_len}]"
            assert len(table) * self.block_size >= kv_len, f"block table too short for {kv_len} tokens"
        if self.masks is not None:
            assert all(m in MASKS for m in self.masks) and len(self.masks) == len(self.query_lens)
            assert self.frames is not None and all(f > 0 for m, f in zip(self.masks, self.frames) if m == "block_causal")

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def is_query(self, i: int) -> bool:
        return self.reads is not None and self.reads[i] is not None

    def mask(self, i: int) -> str:
        return "causal" if self.masks is None else self.masks[i]

    @property
    def plain(self) -> bool:
        """Only causal appends (what every backend serves)."""
        return self.reads is None and (self.masks is None or all(m == "causal" for m in self.masks))

    def tensors(self, device: torch.device) -> PagedIndex:
        """The batch as index tensors on ``device`` (computed once per step, shared by all layers)."""
        return PagedIndex.build(self, device)


@dataclass(frozen=True)
class PagedIndex:
    """Index tensors of a PagedBatch.

    tables:   [S, max_blocks]  block ids, padded with 0 (a query's row is all 0)
    kv_lens:  [S]              tokens in each append's KV after the step (a query's cached keys)
    slots:    [W]              pool slot each written row goes to (the appends' rows, in batch order)
    written:  [W] or None      batch rows that are written (None: every row)
    """

    batch: PagedBatch
    tables: torch.Tensor
    kv_lens: torch.Tensor
    slots: torch.Tensor
    written: torch.Tensor | None

    @staticmethod
    def build(batch: PagedBatch, device: torch.device) -> PagedIndex:
        width = max(max((len(t) for t in batch.block_tables), default=1), 1)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in batch.block_tables], dtype=torch.long)  # [S, W]
        q_lens = torch.tensor(batch.query_lens, dtype=torch.long)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.long)
        seq_of = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens)  # [T]
        first_new = torch.cumsum(q_lens, 0) - q_lens  # [S] batch row of each sequence's first new token
        positions = kv_lens[seq_of] - q_lens[seq_of] + torch.arange(len(seq_of)) - first_new[seq_of]  # [T]
        written = None
        if batch.reads is not None:
            keep = torch.tensor([not batch.is_query(i) for i in range(len(q_lens))])[seq_of]  # [T]
            written = keep.nonzero().reshape(-1)
            seq_of, positions = seq_of[written], positions[written]
            written = written.to(device)
        slots = _slots(tables, seq_of, positions, batch.block_size)
        return PagedIndex(batch, tables.to(device), kv_lens.to(device), slots.to(device), written)

    def padded_blocks(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks of append sequences ``rows``, padded to the longest: ids [B * W] (padding reads block 0), key mask [B, W * bs]."""
        bs = self.batch.block_size
        width = max(-(-self.batch.kv_lens[i] // bs) for i in rows)
        blocks = self.tables[rows, :width]  # [B, W]
        positions = torch.arange(width * bs, device=self.tables.device)  # [W * bs]
        mask = positions[None, :] < self.kv_lens[rows][:, None]  # [B, W * bs]
        return blocks.reshape(-1), mask


def _all_decodes(batch: PagedBatch) -> bool:
    """Only one-row causal appends (a plain decode step)."""
    return batch.plain and all(n == 1 for n in batch.query_lens)


def _slots(tables: torch.Tensor, seqs: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pool slot of ``positions`` of sequences ``seqs`` (same shapes) through block ``tables`` [S, W]."""
    return tables[seqs, positions // block_size] * block_size + positions % block_size


MAX_BATCHED_KEYS = 1 << 16  # key rows gathered for one batched SDPA call (bounds the scratch buffers)


def _batch_appends(others: list[tuple], block_size: int, device: torch.device) -> tuple[list[tuple], list[tuple]]:
    """Multi-row appends with the same rows and blocks (K candidate steps of one CEM request, equal prefills)
    as batched calls ``(batch rows [B*n], B, n, block ids [B*W], mask [B, 1, n, W*bs] or None)``; the rest alone."""
    groups: dict[tuple, list[tuple]] = {}
    singles = []
    for item in others:
        start, end, blocks, allowed, from_pool = item
        if from_pool and not isinstance(allowed, str):
            groups.setdefault((end - start, _count(blocks), allowed is None), []).append(item)
        else:
            singles.append(item)
    batched = []
    for (n, width, unmasked), items in groups.items():
        if len(items) == 1:
            singles.extend(items)
            continue
        per_call = max(1, MAX_BATCHED_KEYS // (width * block_size))
        for lo in range(0, len(items), per_call):
            part = items[lo : lo + per_call]
            rows = torch.cat([torch.arange(s, e, device=device) for s, e, *_ in part])  # [B*n]
            blocks = torch.cat([_ids(b, device) for _, _, b, _, _ in part])  # [B*W]
            keys = width * block_size
            mask = None if unmasked else torch.stack([_key_mask(a, n, keys, device) for _, _, _, a, _ in part])[:, None]
            batched.append((rows, len(part), n, blocks, mask))
    return singles, batched


def _key_mask(allowed: torch.Tensor | int, n: int, keys: int, device: torch.device) -> torch.Tensor:
    """bool [n, keys]: ``allowed`` itself, or for an int the first ``allowed`` keys visible to every row."""
    if isinstance(allowed, int):
        return (torch.arange(keys, device=device) < allowed)[None, :].expand(n, keys)
    return allowed


def _count(blocks: torch.Tensor | tuple[int, int]) -> int:
    return blocks[1] if isinstance(blocks, tuple) else blocks.numel()


def _ids(blocks: torch.Tensor | tuple[int, int], device: torch.device) -> torch.Tensor:
    if isinstance(blocks, tuple):
        return torch.arange(blocks[0], blocks[0] + blocks[1], device=device)
    return blocks


def _blocks(table: list[int], device: torch.device) -> torch.Tensor | tuple[int, int]:
    """A block table as a ``(first, count)`` span when its ids are consecutive, else an id tensor."""
    if table and table[-1] - table[0] == len(table) - 1 and table == list(range(table[0], table[0] + len(table))):
        return table[0], len(table)
    return torch.tensor(table, dtype=torch.long, device=device)


def chunk_mask(kind: str, n: int, frame: int, device: torch.device) -> torch.Tensor | None:
    """bool [n, n] among a chunk's rows (True = may attend); None when every row sees every row (full, or a
    block-causal chunk of one frame)."""
    if kind == "full" or (kind == "block_causal" and n <= frame):
        return None
    if kind == "block_causal":
        f = torch.arange(n, device=device) // frame
        return f[:, None] >= f[None, :]
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def mask_bias(dtype: torch.dtype) -> float:
    """A finite bias that hides a key in ``dtype`` without overflowing when added to a score."""
    return torch.finfo(dtype).min / 2


class PagedAttentionBackend(ABC):
    """Makes the attention context of one model call over a paged pool. One per engine."""

    @abstractmethod
    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        """k_cache, v_cache: [L, N, block_size, Hkv, Dh]; ``batch`` describes the step's tokens."""

    def supports(self, batch: PagedBatch) -> bool:
        """Whether this backend computes ``batch`` itself (the engine falls back to the PyTorch path otherwise)."""
        return True

    def graph_decode(self, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int, max_blocks: int):
        """A decode context over static buffers for ``size`` rows, for CUDA-graph capture (``graph_attention``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot capture decode graphs")


class TorchPagedAttention(AttentionContext):
    """Paged attention in plain PyTorch: correct for any block tables, masks and mix of appends and queries.

    Every layer writes the appended rows' k/v to their slots, then gathers
    each sequence's blocks (whole blocks, indices precomputed once per step)
    into scratch buffers reused by every layer. One-row appends run as one
    padded SDPA call with an additive key bias and the query heads of each KV
    head folded into the query axis (no K/V expansion for GQA); multi-row
    appends of the same rows and blocks (a CEM step's K candidates) run as
    one batched SDPA call; every other sequence runs in its own SDPA call with
    a bool mask (prefix visible, the chunk under its mask kind), or none when
    it sees every key: a full-mask append gathers its blocks and drops the
    unwritten tail, a full-mask query gathers exactly its contexts' written
    slots and its own rows after them (an unmasked SDPA call is ~25% faster
    than a masked one on the CPU). A batch of decodes only skips every row scatter.

    On the CPU a batch of decodes only reads its keys from the backend's
    ``DecodeMirror`` (``DECODE`` "mirror"): the dense copy the last step left,
    appended to, instead of a gather of every sequence's past in every layer.
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch, scratch: Scratch,
                 mirror: DecodeMirror | None = None):
        self.k_cache, self.v_cache, self.scratch = k_cache, v_cache, scratch
        device = k_cache.device
        self.mirror, self.plan = mirror, None
        if mirror is not None and DECODE == "mirror" and device.type == "cpu" and _all_decodes(batch):
            self.plan = mirror.prepare(k_cache, v_cache, batch.kv_lens, batch.block_tables, mask_bias(k_cache.dtype))
        index = batch.tensors(device)
        self.slot_mapping, self.written = index.slots, index.written  # [W], [W] or None
        starts = [0]
        for q_len in batch.query_lens:
            starts.append(starts[-1] + q_len)
        decodes = [i for i, q_len in enumerate(batch.query_lens) if q_len == 1 and not batch.is_query(i)]
        self.only_decodes = len(decodes) == len(batch.query_lens)
        self.decode_rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
        self.decode_blocks = self.decode_bias = None
        if decodes and self.plan is None:
            self.decode_blocks, mask = index.padded_blocks(decodes)  # [B * W], [B, W * bs]
            bias = torch.zeros(mask.shape, dtype=k_cache.dtype, device=device).masked_fill_(~mask, mask_bias(k_cache.dtype))
            self.decode_bias = bias[:, None, None, :]  # [B, 1, 1, W * bs]
        one_row = set(decodes)
        others = [self._plan(batch, index, i, starts[i], starts[i + 1]) for i in range(len(batch.query_lens))
                  if i not in one_row]
        self.others, self.batched = _batch_appends(others, batch.block_size, device)

    @staticmethod
    def _plan(batch: PagedBatch, index: PagedIndex, i: int, start: int, end: int) -> tuple:
        """(rows, blocks to gather, key mask, whether the chunk's own k/v come from the pool).

        An append's blocks are a ``(first, count)`` span when its table is consecutive ids (read as a view of
        the pool, nothing copied), else an id tensor; its mask is None when it sees every key it gathers, an
        int when it sees the first that many (its written keys; the tail of its last block is cut off).
        A full-mask query's "blocks" are the pool slots [P] of the keys it reads, and its mask is None.
        """
        n, device = end - start, index.tables.device
        inner = chunk_mask(batch.mask(i), n, batch.frames[i] if batch.frames else 0, device)  # [n, n] or None
        if not batch.is_query(i):
            bs, kv = batch.block_size, batch.kv_lens[i]
            prefix = kv - n
            if inner is not None and batch.mask(i) == "causal" and prefix == 0:
                return start, end, _blocks(batch.block_tables[i][: -(-n // bs)], device), "causal", True
            width = -(-kv // bs)
            blocks = _blocks(batch.block_tables[i][:width], device)
            if inner is None:  # the whole chunk and its prefix: no mask, the unwritten tail is cut off
                return start, end, blocks, None if width * bs == kv else kv, True
            allowed = torch.zeros(n, width * bs, dtype=torch.bool, device=device)
            allowed[:, :prefix] = True
            allowed[:, prefix : prefix + n] = True if inner is None else inner
            return start, end, blocks, allowed, True
        bs = batch.block_size
        if inner is None:  # full: the written slots of every context read, then the chunk's own rows; no mask
            offsets = torch.arange(bs, device=device)
            slots = [(torch.tensor(t[: -(-length // bs)], dtype=torch.long, device=device)[:, None] * bs
                      + offsets).reshape(-1)[:length] for t, length in batch.reads[i]]  # [length] each
            return start, end, torch.cat(slots) if slots else offsets[:0], None, False
        ids, valid = [], []
        for table, length in batch.reads[i]:
            width = -(-length // bs)
            ids.extend(table[:width])
            valid.append(torch.arange(width * bs, device=device) < length)
        blocks = torch.tensor(ids, dtype=torch.long, device=device)
        cached = torch.cat(valid) if valid else torch.zeros(0, dtype=torch.bool, device=device)  # [P]
        own = torch.ones(n, n, dtype=torch.bool, device=device) if inner is None else inner
        allowed = torch.cat([cached[None, :].expand(n, -1), own], dim=1)  # [n, P + n]
        return start, end, blocks, allowed, False

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]  # [N, bs, Hkv, Dh]
        k_new, v_new = (k, v) if self.written is None else (k[self.written], v[self.written])
        k_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, k_new.to(k_cache.dtype))
        v_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, v_new.to(v_cache.dtype))
        if self.plan is not None:
            keys, values = self.mirror.write(layer, self.plan, k, v)  # [B, width, Hkv, Dh]
            self.mirror.written(self.k_cache, self.v_cache)
            return decode_attention(q, keys, values, self.plan.bias, scale)
        if self.only_decodes:
            keys, values = self._gather(k_cache, v_cache, self.decode_blocks, len(self.decode_rows))
            return decode_attention(q, keys, values, self.decode_bias, scale)
        out = torch.empty_like(q)  # [T, Hq, Dh]
        if self.decode_blocks is not None:
            keys, values = self._gather(k_cache, v_cache, self.decode_blocks, len(self.decode_rows))
            out[self.decode_rows] = decode_attention(q[self.decode_rows], keys, values, self.decode_bias, scale)
        for rows, b, n, blocks, mask in self.batched:  # appends of equal shape: one SDPA call each
            keys, values = self._gather(k_cache, v_cache, blocks, b)  # [B, W * bs, Hkv, Dh]
            out[rows] = _attend_batch(q[rows].view(b, n, *q.shape[1:]), keys, values, mask, scale).flatten(0, 1)
        for start, end, blocks, allowed, from_pool in self.others:
            if not from_pool and allowed is None:  # a full query: its slots [P], then its own rows
                keys, values = self._gather_slots(k_cache, v_cache, blocks, k[start:end], v[start:end])
                out[start:end] = _attend(q[start:end], keys, values, None, scale)
                continue
            keys, values = self._gather(k_cache, v_cache, blocks, 1)  # [1, W * bs, Hkv, Dh]
            keys, values = keys[0], values[0]
            if not from_pool:  # a query: its own rows' k/v are not in the pool
                keys = torch.cat([keys, k[start:end].to(keys.dtype)])  # [P + n, Hkv, Dh]
                values = torch.cat([values, v[start:end].to(values.dtype)])
            elif isinstance(allowed, str):  # causal, no prefix
                keys, values = keys[: end - start], values[: end - start]
            elif isinstance(allowed, int):  # full: every written key, the block tail cut off
                keys, values, allowed = keys[:allowed], values[:allowed], None
            out[start:end] = _attend(q[start:end], keys, values, allowed, scale)
        return out

    def _gather_slots(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k_own: torch.Tensor,
                      v_own: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [P + n, Hkv, Dh]: the pool's ``slots`` [P], then the chunk's own rows [n] (scratch buffers)."""
        p, n, (hkv, dh) = slots.numel(), k_own.shape[0], k_own.shape[1:]
        keys = self.scratch.get("qk", (p + n, hkv, dh), k_cache.dtype, k_cache.device)
        values = self.scratch.get("qv", (p + n, hkv, dh), v_cache.dtype, v_cache.device)
        if p:
            torch.index_select(k_cache.view(-1, hkv * dh), 0, slots, out=keys[:p].view(p, hkv * dh))
            torch.index_select(v_cache.view(-1, hkv * dh), 0, slots, out=values[:p].view(p, hkv * dh))
        keys[p:], values[p:] = k_own, v_own
        return keys, values

    def _gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor | tuple[int, int], rows: int):
        """K and V of ``blocks`` [B * W] as [B, W * bs, Hkv, Dh] views of the scratch buffers (of the pool itself
        for a ``(first, count)`` span of consecutive blocks)."""
        n, bs, hkv, dh = k_cache.shape
        if isinstance(blocks, tuple):
            first, count = blocks
            shape = (rows, count // rows * bs, hkv, dh)
            return k_cache[first : first + count].view(shape), v_cache[first : first + count].view(shape)
        shape = (rows, blocks.numel() // rows * bs, hkv, dh)
        keys = self.scratch.get("k", shape, k_cache.dtype, k_cache.device)
        values = self.scratch.get("v", shape, v_cache.dtype, v_cache.device)
        if not blocks.numel():  # a query over contexts that hold nothing yet (BAGEL's cfg_text of a text prompt)
            return keys, values
        torch.index_select(k_cache.view(n, -1), 0, blocks, out=keys.view(blocks.numel(), -1))
        torch.index_select(v_cache.view(n, -1), 0, blocks, out=values.view(blocks.numel(), -1))
        return keys, values


class Scratch:
    """Named buffers reused across layers and steps (a fresh large allocation costs more than the copy)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per sequence: q [B, Hq, Dh] over keys, values [B, L, Hkv, Dh] with additive key mask [B, 1, 1, L]."""
    b, hq, dh = q.shape
    hkv = keys.shape[2]
    out = F.scaled_dot_product_attention(
        q.reshape(b, hkv, hq // hkv, dh).to(keys.dtype),  # [B, Hkv, G, Dh]: query head h uses KV head h // G
        keys.transpose(1, 2),  # [B, Hkv, L, Dh]
        values.transpose(1, 2),
        attn_mask=bias,
        scale=scale,
    )
    return out.reshape(b, hq, dh).to(q.dtype)  # [B, Hq, Dh]


def _attend_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """q [B, n, Hq, Dh] over k, v [B, L, Hkv, Dh] under ``mask`` (bool [B, 1, n, L]) or none: [B, n, Hq, Dh]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).to(k.dtype),  # [B, Hq, n, Dh]
        k.transpose(1, 2),  # [B, Hkv, L, Dh]
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2).to(q.dtype)  # [B, n, Hq, Dh]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | str, scale: float) -> torch.Tensor:
    """q [n, Hq, Dh] over k, v [L, Hkv, Dh] under ``allowed`` (bool [n, L]) or "causal" (L == n).

    The inputs go to SDPA as 4-D tensors: PyTorch's CPU flash kernel takes only
    those (3-D ones fall back to the unfused math path, ~5x slower here).
    """
    causal = isinstance(allowed, str)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None].to(k.dtype),  # [1, Hq, n, Dh]
        k.transpose(0, 1)[None],  # [1, Hkv, L, Dh]
        v.transpose(0, 1)[None],
        attn_mask=None if causal else allowed,
        is_causal=causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[0].transpose(0, 1).to(q.dtype)  # [n, Hq, Dh]
