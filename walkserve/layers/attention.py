"""The model -> attention boundary.

Model code computes q, k, v (after rotary embedding and any q/k norm) and
hands them to an AttentionContext, which owns where keys and values live
(a paged KV pool, a dense cache, nothing) and how attention is computed.

    q: [T, Hq, Dh]   k, v: [T, Hkv, Dh]   ->   out: [T, Hq, Dh]

T is the number of tokens of the whole batch (ragged, no padding); the
context knows which tokens belong to which sequence and at which positions.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from walkserve.core.errors import ConfigError


class AttentionContext(ABC):
    """Per-forward attention state shared by every layer of one model call."""

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Store this layer's k/v for the batch's tokens, attend, return [T, Hq, Dh]."""


class DenseCausalAttention(AttentionContext):
    """One sequence, no cache: plain causal attention over the tokens given. For tests and references."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hq, hkv = q.shape[1], k.shape[1]
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        # [H, T, D]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale
        )
        return out.transpose(0, 1)


# ---------------------------------------------------------------------------
# Paged attention: keys and values live in a block pool shared by many sequences.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PagedBatch:
    """Which tokens of which sequences one model call computes (plain ints, built per step).

    Sequence ``i`` contributes ``query_lens[i]`` new tokens (concatenated in
    order in q/k/v); after they are written its KV holds ``kv_lens[i]``
    tokens, so the new ones sit at positions ``kv_lens[i] - query_lens[i]``
    … ``kv_lens[i] - 1``. ``block_tables[i]`` maps its positions to pool
    blocks (``position // block_size`` indexes the table). A decode is a
    sequence with one new token; a prefill chunk has several and attends
    causally to its cached prefix and to itself.
    """

    query_lens: list[int]
    kv_lens: list[int]
    block_tables: list[list[int]]
    block_size: int

    def __post_init__(self) -> None:
        assert len(self.query_lens) == len(self.kv_lens) == len(self.block_tables)
        for q_len, kv_len, table in zip(self.query_lens, self.kv_lens, self.block_tables):
            assert 1 <= q_len <= kv_len, f"query_len {q_len} must be in [1, kv_len {kv_len}]"
            assert len(table) * self.block_size >= kv_len, f"block table too short for {kv_len} tokens"

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def tensors(self, device: torch.device) -> PagedIndex:
        """The batch as index tensors on ``device`` (computed once per step, shared by all layers)."""
        return PagedIndex.build(self, device)


@dataclass(frozen=True)
class PagedIndex:
    """Index tensors of a PagedBatch.

    tables:   [S, max_blocks]  block ids, padded with 0
    kv_lens:  [S]              tokens in each sequence's KV after the step
    slots:    [T]              pool slot each new token is written to
    """

    batch: PagedBatch
    tables: torch.Tensor
    kv_lens: torch.Tensor
    slots: torch.Tensor

    @staticmethod
    def build(batch: PagedBatch, device: torch.device) -> PagedIndex:
        width = max(len(t) for t in batch.block_tables)
        tables = torch.zeros(len(batch.block_tables), width, dtype=torch.long)
        for i, table in enumerate(batch.block_tables):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.long)
        q_lens = torch.tensor(batch.query_lens, dtype=torch.long)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.long)
        seq_of = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens)  # [T]
        first_new = torch.cumsum(q_lens, 0) - q_lens  # [S] batch row of each sequence's first new token
        positions = kv_lens[seq_of] - q_lens[seq_of] + torch.arange(len(seq_of)) - first_new[seq_of]  # [T]
        slots = _slots(tables, seq_of, positions, batch.block_size)
        return PagedIndex(batch, tables.to(device), kv_lens.to(device), slots.to(device))

    def padded_slots(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [B, Lmax] of every KV position of sequences ``rows`` (padding reads slot 0), key mask [B, Lmax]."""
        device = self.tables.device
        width = max((self.batch.kv_lens[i] for i in rows), default=0)
        seqs = torch.tensor(rows, dtype=torch.long, device=device)  # [B]
        positions = torch.arange(width, device=device).expand(len(rows), width)  # [B, Lmax]
        mask = positions < self.kv_lens[seqs].unsqueeze(1)  # [B, Lmax]
        slots = _slots(self.tables, seqs.unsqueeze(1).expand_as(positions), positions, self.batch.block_size)
        return slots.masked_fill(~mask, 0), mask


def _slots(tables: torch.Tensor, seqs: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pool slot of ``positions`` of sequences ``seqs`` (same shapes) through block ``tables`` [S, W]."""
    return tables[seqs, positions // block_size] * block_size + positions % block_size


class PagedAttentionBackend(ABC):
    """Makes the attention context of one model call over a paged pool. One per engine."""

    @abstractmethod
    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        """k_cache, v_cache: [L, N, block_size, Hkv, Dh]; ``batch`` describes the step's tokens."""


class TorchPagedAttention(AttentionContext):
    """Paged attention in plain PyTorch: correct for any block tables and any mix, on any device.

    Every layer writes the new tokens' k/v to their slots, then gathers each
    sequence's whole KV through slot indices precomputed once per step, into
    scratch buffers reused by every layer. Decodes (one new token) run as one
    padded, masked SDPA call with the query heads of each KV head folded into
    the query axis (no K/V expansion for GQA); each prefill chunk runs in its
    own SDPA call with a causal mask aligned to the sequence's end.
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch, scratch: Scratch):
        self.k_cache, self.v_cache, self.scratch = k_cache, v_cache, scratch
        device = k_cache.device
        index = batch.tensors(device)
        self.slot_mapping = index.slots  # [T]
        starts = [0]
        for q_len in batch.query_lens:
            starts.append(starts[-1] + q_len)
        decodes = [i for i, q_len in enumerate(batch.query_lens) if q_len == 1]
        self.decode_rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
        self.decode_index, mask = index.padded_slots(decodes)  # [B, Lmax]
        self.decode_mask = mask[:, None, None, :]  # [B, 1, 1, Lmax]
        self.prefills = [
            (starts[i], starts[i + 1], index.padded_slots([i])[0][0])
            for i, q_len in enumerate(batch.query_lens)
            if q_len > 1
        ]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        k_flat = self.k_cache[layer].view(-1, hkv, dh)  # [N * bs, Hkv, Dh]
        v_flat = self.v_cache[layer].view(-1, hkv, dh)
        k_flat.index_copy_(0, self.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, self.slot_mapping, v.to(v_flat.dtype))
        out = torch.empty_like(q)  # [T, Hq, Dh]
        if self.decode_rows.numel():
            keys, values = self._gather(k_flat, v_flat, self.decode_index)  # [B, Lmax, Hkv, Dh]
            out[self.decode_rows] = _decode(q[self.decode_rows], keys, values, self.decode_mask, scale)
        for start, end, slots in self.prefills:
            keys, values = self._gather(k_flat, v_flat, slots)  # [L, Hkv, Dh]
            out[start:end] = _attend(q[start:end], keys, values, scale)
        return out

    def _gather(self, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor):
        shape = (*slots.shape, *k_flat.shape[1:])
        keys = self.scratch.get("k", shape, k_flat.dtype, k_flat.device)
        values = self.scratch.get("v", shape, v_flat.dtype, v_flat.device)
        torch.index_select(k_flat, 0, slots.reshape(-1), out=keys.view(-1, *k_flat.shape[1:]))
        torch.index_select(v_flat, 0, slots.reshape(-1), out=values.view(-1, *v_flat.shape[1:]))
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


def _decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per sequence: q [B, Hq, Dh] over keys, values [B, Lmax, Hkv, Dh] with key mask [B, 1, 1, Lmax]."""
    b, hq, dh = q.shape
    hkv = keys.shape[2]
    out = F.scaled_dot_product_attention(
        q.reshape(b, hkv, hq // hkv, dh).to(keys.dtype),  # [B, Hkv, G, Dh]: query head h uses KV head h // G
        keys.transpose(1, 2),  # [B, Hkv, Lmax, Dh]
        values.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
    )
    return out.reshape(b, hq, dh).to(q.dtype)  # [B, Hq, Dh]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q [n, Hq, Dh] (the last n positions) over k, v [L, Hkv, Dh]; returns [n, Hq, Dh]."""
    n, length = q.shape[0], k.shape[0]
    mask = None
    if length > n:
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(diagonal=length - n)  # [n, L]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).to(k.dtype),  # [Hq, n, Dh]
        k.transpose(0, 1),  # [Hkv, L, Dh]
        v.transpose(0, 1),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1).to(q.dtype)


class TorchPagedBackend(PagedAttentionBackend):
    """The pure-PyTorch backend (CPU, or any device as a reference); owns the gather scratch buffers."""

    def __init__(self) -> None:
        self.scratch = Scratch()

    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        return TorchPagedAttention(k_cache, v_cache, batch, self.scratch)


def _make_torch(device: torch.device) -> PagedAttentionBackend:
    return TorchPagedBackend()


def _make_flashinfer(device: torch.device) -> PagedAttentionBackend:
    from walkserve.layers.flashinfer_attention import FlashInferBackend  # lazy: CUDA installs only

    return FlashInferBackend(device)


PAGED_BACKENDS = {"torch": _make_torch, "flashinfer": _make_flashinfer}


FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


def flashinfer_available(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """True when FlashInfer can serve a pool of ``dtype`` on ``device`` (CUDA, fp16/bf16, package importable)."""
    if device.type != "cuda" or (dtype is not None and dtype not in FLASHINFER_DTYPES):
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def make_paged_backend(name: str, device: torch.device | str, dtype: torch.dtype | None = None) -> PagedAttentionBackend:
    """Pick a paged-attention backend: ``"torch"``, ``"flashinfer"`` or ``"auto"``.

    ``auto`` takes FlashInfer when the device is CUDA, the pool ``dtype`` is
    fp16/bf16 and ``flashinfer`` imports, else the PyTorch path. Heavy
    backends are imported only here.
    """
    device = torch.device(device)
    if name == "auto":
        name = "flashinfer" if flashinfer_available(device, dtype) else "torch"
    if name not in PAGED_BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; choose one of {sorted(PAGED_BACKENDS)} or 'auto'")
    if name == "flashinfer" and not flashinfer_available(device, dtype):
        raise ConfigError(
            f"attention backend 'flashinfer' needs a CUDA device, an fp16/bf16 KV pool and the flashinfer "
            f"package (device {device}, dtype {dtype})"
        )
    return PAGED_BACKENDS[name](device)
