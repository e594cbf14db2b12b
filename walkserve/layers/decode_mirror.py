"""DecodeMirror: a decode batch's keys and values kept dense from one step to the next.

The gathered decode path copies every sequence's whole past out of the paged
pool into a dense scratch, in every layer of every step. The mirror keeps that
dense copy alive instead: a step writes each row's new key and value into the
pool *and* into the mirror, and the next step attends over the mirror as it
is. Only a row the mirror does not hold yet (a new sequence, a changed
batch) is copied from the pool, for all layers at once.

    mirror k, v: [L, rows, capacity, Hkv, Dh]     row i = batch row i of the last decode step
    row i holds positions 0 .. kv_lens[i] - 1 of its sequence (the rest: zeros or stale keys, masked)

A row is reused when the pool cannot have changed under it: nothing wrote the
pool since the mirror's last write (the pool tensors' version counters,
which every in-place write bumps, are where the mirror left them), the row's
block table covers its cached keys with the same blocks as last step, and it
holds exactly one token more now. Otherwise the row is rebuilt from the pool,
so the mirror only ever saves copies, it never changes a result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_BYTES = 1 << 30  # a batch whose mirror would be larger gathers from the pool instead
MARGIN = 128  # spare token capacity per row at a rebuild (a rebuild is due when a row outgrows it)


@dataclass(frozen=True)
class MirrorPlan:
    """One step over the mirror: where each row's new key goes, and the key width and mask to attend with."""

    slots: torch.Tensor  # [B] row * capacity + position of each row's new token
    width: int  # keys attended: the longest row's kv_len
    bias: torch.Tensor  # [B, 1, 1, width] additive key mask


class DecodeMirror:
    """Dense K/V of the last decode batch, carried across steps (one per backend, CPU only)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # [L, B, C, Hkv, Dh]
        self.v: torch.Tensor | None = None
        self.rows: dict[tuple[tuple[int, ...], int], int] = {}  # (blocks covering the keys, kv_len) -> row
        self.stamp: tuple | None = None  # (pool identity, versions) after the last layer of the last step wrote
        self.layers_written = 0  # layers the current step has written
        self.rebuilds = 0  # rows copied from the pool, over the mirror's life (for tests and stats)

    def prepare(self, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens: list[int], tables: list[list[int]],
                bias_value: float) -> MirrorPlan | None:
        """Make row i hold the first ``kv_lens[i] - 1`` keys of sequence i (the step appends one each).

        ``k_cache``, ``v_cache``: the pool [L, N, bs, Hkv, Dh]. Returns None when the mirror
        cannot serve the batch (too large, or a pool whose writes are not counted).
        """
        num_layers, _, bs, hkv, dh = k_cache.shape
        rows, width = len(kv_lens), max(kv_lens)
        capacity = -(-(width + MARGIN) // bs) * bs
        if 2 * k_cache[:, :1, :1].numel() * rows * capacity * k_cache.element_size() > MAX_BYTES:
            return None
        try:
            fresh = self.stamp != _stamp(k_cache, v_cache)
        except RuntimeError:  # an inference-mode pool keeps no version counter: nothing to trust
            return None
        self.stamp, self.layers_written = None, 0  # valid again only once this step has written every layer
        cached = [n - 1 for n in kv_lens]
        keys = [(tuple(t[: -(-n // bs)]), n) for t, n in zip(tables, cached)]
        source = [None if fresh else self.rows.get(key) for key in keys]  # row of the mirror that holds it
        old = self.k.shape if self.k is not None else None
        if source != list(range(rows)) or old[1] < rows or old[2] < width:
            self._rebuild(k_cache, v_cache, (num_layers, rows, capacity, hkv, dh), source, keys)
        self.rows = {(tuple(t[: -(-n // bs)]), n): i for i, (t, n) in enumerate(zip(tables, kv_lens))}
        capacity = self.k.shape[2]
        positions = torch.tensor(cached)
        slots = torch.arange(rows) * capacity + positions  # [B]
        bias = torch.zeros(rows, width, dtype=k_cache.dtype)
        bias.masked_fill_(torch.arange(width)[None, :] > positions[:, None], bias_value)  # keys past each row's own
        return MirrorPlan(slots, width, bias[:, None, None, :])

    def _rebuild(self, k_cache: torch.Tensor, v_cache: torch.Tensor, shape: tuple[int, ...],
                 source: list[int | None], keys: list[tuple[tuple[int, ...], int]]) -> None:
        """Rows the old mirror holds stay or are copied from it, the rest come from the pool. The old tensors
        are reused when they are large enough and no row moves; new ones are zeroed (masked keys are still
        multiplied: stale keys are harmless, uninitialised memory could hold NaN)."""
        old = self.k.shape if self.k is not None else None
        kept = [(i, r) for i, r in enumerate(source) if r is not None]
        in_place = old is not None and old[1] >= shape[1] and old[2] >= shape[2] and all(i == r for i, r in kept)
        if in_place:
            k, v, kept = self.k, self.v, []
        else:
            k = torch.zeros(shape, dtype=k_cache.dtype)
            v = torch.zeros(shape, dtype=v_cache.dtype)
        if kept:
            dst, src = torch.tensor([i for i, _ in kept]), torch.tensor([r for _, r in kept])
            n = max(keys[i][1] for i, _ in kept)
            k[:, dst, :n] = self.k[:, src, :n]
            v[:, dst, :n] = self.v[:, src, :n]
        bs = k_cache.shape[2]
        for i, r in enumerate(source):
            blocks, n = keys[i]
            if r is None and blocks:
                ids = torch.tensor(blocks)
                k[:, i, : len(blocks) * bs] = k_cache[:, ids].flatten(1, 2)  # [L, nb * bs, Hkv, Dh]
                v[:, i, : len(blocks) * bs] = v_cache[:, ids].flatten(1, 2)
                self.rebuilds += 1
        self.k, self.v = k, v

    def write(self, layer: int, plan: MirrorPlan, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the step's new k, v [B, Hkv, Dh] of ``layer`` in; returns that layer's keys, values [B, width, Hkv, Dh]."""
        mk, mv = self.k[layer], self.v[layer]  # [B, C, Hkv, Dh]
        mk.view(-1, *mk.shape[2:]).index_copy_(0, plan.slots, k.to(mk.dtype))
        mv.view(-1, *mv.shape[2:]).index_copy_(0, plan.slots, v.to(mv.dtype))
        rows = plan.slots.shape[0]
        return mk[:rows, : plan.width], mv[:rows, : plan.width]

    def written(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """A layer has written its new keys to the pool and the mirror; after the last one, the pool's
        versions are the mirror's own (``k_cache``, ``v_cache``: the whole pool)."""
        self.layers_written += 1
        if self.layers_written == k_cache.shape[0]:
            self.stamp = _stamp(k_cache, v_cache)


def _stamp(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    return k_cache.data_ptr(), v_cache.data_ptr(), tuple(k_cache.shape), k_cache._version, v_cache._version
