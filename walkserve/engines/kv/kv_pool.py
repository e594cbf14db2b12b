"""The paged KV pool: one K and one V tensor for every layer of a model.

    k, v: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]

``k[layer]`` is the "NHD" paged layout FlashInfer reads directly; a token
slot ``s`` is ``k[layer].view(-1, Hkv, Dh)[s]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.placement.memory import default_kv_bytes


@dataclass(frozen=True)
class KVPoolShape:
    """The geometry of a pool; derived sizes are properties."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def blocks_for_bytes(self, kv_bytes: int) -> int:
        return kv_bytes // self.bytes_per_block


class KVPool:
    """Preallocated K/V storage; the block manager decides which block holds what.

    ``spare=True`` adds one block past ``num_blocks`` that is never handed out
    (``sink``): padded rows of a CUDA-graph decode write to and read from it.
    """

    def __init__(self, shape: KVPoolShape, num_blocks: int, device: torch.device | str, spare: bool = False):
        if num_blocks < 1:
            raise ValueError(
                f"the KV pool needs at least one block ({shape.bytes_per_block} bytes each), got {num_blocks}"
            )
        self.shape = shape
        self.num_blocks = num_blocks
        self.sink: int | None = num_blocks if spare else None
        self.device = torch.device(device)
        dims = (shape.num_layers, num_blocks + int(spare), shape.block_size, shape.num_kv_heads, shape.head_dim)
        self.k = torch.zeros(dims, dtype=shape.dtype, device=self.device)  # k: [L, N, bs, Hkv, Dh]
        self.v = torch.zeros(dims, dtype=shape.dtype, device=self.device)  # v: [L, N, bs, Hkv, Dh]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write of a shared block)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


def pool_blocks(shape: KVPoolShape, device: torch.device, num_blocks: int | None, kv_bytes: int | None) -> int:
    """How many blocks a pool gets: ``num_blocks`` if given, else from ``kv_bytes``, else a device default."""
    if num_blocks is not None:
        return num_blocks
    if kv_bytes is None:
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
        kv_bytes = default_kv_bytes(str(device), free)
    return shape.blocks_for_bytes(kv_bytes)
