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


class DenseAttention(AttentionContext):
    """No paging: attention over this call's tokens, plus an optional cached past per layer, under an explicit mask.

    The reference every cached or paged path is tested against, and the
    attention of model-level offline loops (encoders, joint passes).

        mask:  None     every query sees every key (bidirectional)
               "causal" query i sees keys up to past_len + i
               bool [Tq, Tk] (True = may attend), Tk = past_len + Tq
        past:  layer -> (k, v) [P, Hkv, Dh] keys/values that precede this call's (not written to)
        keep:  record each layer's keys/values (past + new) in ``self.kv`` for a later call

    A query row that may attend to nothing gets zeros, never NaN.
    """

    def __init__(self, mask: torch.Tensor | str | None = "causal",
                 past: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None, keep: bool = False):
        if isinstance(mask, str) and mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or a bool tensor, got {mask!r}")
        self.mask, self.past, self.keep = mask, past or {}, keep
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if layer in self.past:
            pk, pv = self.past[layer]
            k, v = torch.cat([pk.to(k.dtype), k]), torch.cat([pv.to(v.dtype), v])  # [P + T, Hkv, Dh]
        if self.keep:
            self.kv[layer] = (k, v)
        tq, tk = q.shape[0], k.shape[0]
        allowed = self.mask
        if isinstance(allowed, str):  # causal, aligned to the end of the keys
            allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
        if allowed is not None and tuple(allowed.shape) != (tq, tk):
            raise ValueError(f"mask of shape {tuple(allowed.shape)} does not match {tq} queries over {tk} keys")
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None].to(k.dtype),  # [1, Hq, Tq, Dh]
            k.transpose(0, 1)[None],  # [1, Hkv, Tk, Dh]
            v.transpose(0, 1)[None],
            attn_mask=None if allowed is None else allowed.to(q.device),
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )[0].transpose(0, 1)  # [Tq, Hq, Dh]
        if allowed is not None:  # rows that see no key: zeros (SDPA gives NaN there)
            out = out.masked_fill(~allowed.to(q.device).any(-1)[:, None, None], 0.0)
        return out.to(q.dtype)


class DenseCausalAttention(DenseAttention):
    """One sequence, no cache: plain causal attention over the tokens given. For tests and references."""

    def __init__(self) -> None:
        super().__init__("causal")


def block_causal_mask(frames: int, frame_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool [N, N], N = frames * frame_tokens: a token sees every token of its own and earlier frames."""
    frame = torch.arange(frames * frame_tokens, device=device) // frame_tokens  # [N]
    return frame[:, None] >= frame[None, :]


def block_diagonal_mask(lengths: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """bool [N, N], N = sum(lengths): packed sequences that attend only within themselves (varlen)."""
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    return seq[:, None] == seq[None, :]


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
        tables = torch.tensor([t + [0] * (width - len(t)) for t in batch.block_tables], dtype=torch.long)  # [S, W]
        q_lens = torch.tensor(batch.query_lens, dtype=torch.long)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.long)
        seq_of = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens)  # [T]
        first_new = torch.cumsum(q_lens, 0) - q_lens  # [S] batch row of each sequence's first new token
        positions = kv_lens[seq_of] - q_lens[seq_of] + torch.arange(len(seq_of)) - first_new[seq_of]  # [T]
        slots = _slots(tables, seq_of, positions, batch.block_size)
        return PagedIndex(batch, tables.to(device), kv_lens.to(device), slots.to(device))

    def padded_blocks(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks of sequences ``rows``, padded to the longest: ids [B * W] (padding reads block 0), key mask [B, W * bs].

        Gathering whole blocks (``bs`` slots per index) costs far less than
        gathering slot by slot; the mask hides the padding and each block's
        unwritten tail.
        """
        bs = self.batch.block_size
        width = max(-(-self.batch.kv_lens[i] // bs) for i in rows)
        blocks = self.tables[rows, :width]  # [B, W]
        positions = torch.arange(width * bs, device=self.tables.device)  # [W * bs]
        mask = positions[None, :] < self.kv_lens[rows][:, None]  # [B, W * bs]
        return blocks.reshape(-1), mask


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
    sequence's blocks (whole blocks, indices precomputed once per step) into
    scratch buffers reused by every layer. Decodes (one new token) run as one
    padded SDPA call with an additive key mask and the query heads of each KV
    head folded into the query axis (no K/V expansion for GQA); each prefill
    chunk runs in its own SDPA call with a causal mask aligned to the
    sequence's end. A batch of decodes only skips every row scatter.
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
        self.only_decodes = len(decodes) == len(batch.query_lens)
        self.decode_rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
        self.decode_blocks = self.decode_bias = None
        if decodes:
            self.decode_blocks, mask = index.padded_blocks(decodes)  # [B * W], [B, W * bs]
            bias = torch.zeros(mask.shape, dtype=k_cache.dtype, device=device).masked_fill_(~mask, float("-inf"))
            self.decode_bias = bias[:, None, None, :]  # [B, 1, 1, W * bs]
        self.prefills = [
            (starts[i], starts[i + 1], batch.kv_lens[i], index.padded_blocks([i])[0])
            for i, q_len in enumerate(batch.query_lens)
            if q_len > 1
        ]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]  # [N, bs, Hkv, Dh]
        k_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, v.to(v_cache.dtype))
        if self.only_decodes:
            keys, values = self._gather(k_cache, v_cache, self.decode_blocks, len(self.decode_rows))
            return _decode(q, keys, values, self.decode_bias, scale)
        out = torch.empty_like(q)  # [T, Hq, Dh]
        if self.decode_blocks is not None:
            keys, values = self._gather(k_cache, v_cache, self.decode_blocks, len(self.decode_rows))
            out[self.decode_rows] = _decode(q[self.decode_rows], keys, values, self.decode_bias, scale)
        for start, end, kv_len, blocks in self.prefills:
            keys, values = self._gather(k_cache, v_cache, blocks, 1)  # [1, W * bs, Hkv, Dh]
            out[start:end] = _attend(q[start:end], keys[0], values[0], kv_len, scale)
        return out

    def _gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor, rows: int):
        """K and V of ``blocks`` [B * W] as [B, W * bs, Hkv, Dh] views of the scratch buffers."""
        n, bs, hkv, dh = k_cache.shape
        shape = (rows, blocks.numel() // rows * bs, hkv, dh)
        keys = self.scratch.get("k", shape, k_cache.dtype, k_cache.device)
        values = self.scratch.get("v", shape, v_cache.dtype, v_cache.device)
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


def _decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
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


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int, scale: float) -> torch.Tensor:
    """Causal attention of q [n, Hq, Dh] (positions kv_len - n .. kv_len - 1) over the first kv_len of k, v [L, Hkv, Dh].

    The inputs go to SDPA as 4-D tensors: PyTorch's CPU flash kernel takes only
    those (3-D ones fall back to the unfused math path, ~5x slower here).
    """
    n = q.shape[0]
    k, v = k[:kv_len], v[:kv_len]
    mask = None
    if kv_len > n:  # a cached prefix: query i sees keys up to kv_len - n + i
        mask = torch.ones(n, kv_len, dtype=torch.bool, device=q.device).tril(diagonal=kv_len - n)  # [n, L]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None].to(k.dtype),  # [1, Hq, n, Dh]
        k.transpose(0, 1)[None],  # [1, Hkv, L, Dh]
        v.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[0].transpose(0, 1).to(q.dtype)  # [n, Hq, Dh]


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
