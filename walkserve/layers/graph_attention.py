"""Decode attention over static buffers: what a CUDA graph of a decode step captures.

A captured graph replays the same kernels on the same addresses, so every
per-step input of attention lives in a buffer allocated once per batch-size
bucket and refreshed in place before each replay:

    slots       [B]              pool slot each row's new k/v goes to
    tables      [B, max_blocks]  block ids of each row's context (PyTorch path)
    kv_lens     [B]              keys in each row's context after the step (PyTorch path)

``prepare(batch)`` (outside the graph) fills them from a ``PagedBatch`` of
exactly B one-row causal appends (the graph runner pads a smaller batch with
rows that write to and read from a spare block of the pool); ``forward`` is
the captured part. FlashInfer's version (``flashinfer_attention``) keeps its
index buffers in its decode wrapper instead of ``tables``/``kv_lens``.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from walkserve.layers.attention import AttentionContext
from walkserve.layers.paged_attention import PagedBatch, decode_attention, mask_bias


class GraphDecodeAttention(AttentionContext):
    """A decode step of ``size`` rows whose inputs sit in static buffers."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int, max_blocks: int):
        self.k_cache, self.v_cache, self.size, self.max_blocks = k_cache, v_cache, size, max_blocks
        self.block_size = k_cache.shape[2]
        self.slots = torch.zeros(size, dtype=torch.long, device=k_cache.device)

    def check(self, batch: PagedBatch) -> None:
        assert len(batch.query_lens) == self.size and all(n == 1 for n in batch.query_lens), batch.query_lens
        assert batch.plain, "a graph decode takes causal appends only"
        assert all(-(-n // self.block_size) <= self.max_blocks for n in batch.kv_lens), "a context outgrew the graph"

    def copy_slots(self, batch: PagedBatch) -> None:
        self.check(batch)
        bs = self.block_size
        slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(batch.block_tables, batch.kv_lens)]
        self.slots.copy_(torch.tensor(slots, dtype=torch.long), non_blocking=True)

    @abstractmethod
    def prepare(self, batch: PagedBatch) -> None:
        """Refresh every static buffer for ``batch`` (called outside the graph, before warm-up, capture, replay)."""

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, Hq, Dh] over the rows' contexts (their new k/v already in the pool) -> [B, Hq, Dh]."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        self.k_cache[layer].view(-1, hkv, dh).index_copy_(0, self.slots, k.to(self.k_cache.dtype))
        self.v_cache[layer].view(-1, hkv, dh).index_copy_(0, self.slots, v.to(self.v_cache.dtype))
        return self.attend(layer, q, scale)


class TorchGraphDecode(GraphDecodeAttention):
    """The PyTorch decode over fixed-width block tables: every row gathers ``max_blocks`` blocks, masked by length."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int, max_blocks: int):
        super().__init__(k_cache, v_cache, size, max_blocks)
        device = k_cache.device
        self.tables = torch.zeros(size, max_blocks, dtype=torch.long, device=device)  # [B, W]
        self.kv_lens = torch.ones(size, dtype=torch.long, device=device)  # [B]
        self.key_pos = torch.arange(max_blocks * self.block_size, device=device)  # [W * bs]

    def prepare(self, batch: PagedBatch) -> None:
        self.copy_slots(batch)
        width = self.max_blocks
        rows = [t[:width] + [0] * (width - min(len(t), width)) for t in batch.block_tables]
        self.tables.copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
        self.kv_lens.copy_(torch.tensor(batch.kv_lens, dtype=torch.long), non_blocking=True)

    def attend(self, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]  # [N, bs, Hkv, Dh]
        n, bs, hkv, dh = k_cache.shape
        shape = (self.size, self.max_blocks * bs, hkv, dh)
        keys = k_cache.view(n, -1).index_select(0, self.tables.view(-1)).view(shape)  # [B, W * bs, Hkv, Dh]
        values = v_cache.view(n, -1).index_select(0, self.tables.view(-1)).view(shape)
        hidden = self.key_pos[None, :] >= self.kv_lens[:, None]  # [B, W * bs]
        bias = torch.zeros(hidden.shape, dtype=k_cache.dtype, device=q.device).masked_fill(hidden, mask_bias(k_cache.dtype))
        return decode_attention(q, keys, values, bias[:, None, None, :], scale)  # [B, Hq, Dh]
