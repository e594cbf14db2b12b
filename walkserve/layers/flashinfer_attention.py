"""Paged attention through FlashInfer's batch wrappers (CUDA only; imported lazily).

The pool layout ``k[layer]: [num_blocks, block_size, Hkv, Dh]`` is
FlashInfer's "NHD" paged layout, so the kernels read the pool in place. A
batch is described in FlashInfer's CSR form:

    qo_indptr      [S+1]  new-token offsets of each sequence in q
    kv_indptr      [S+1]  offsets of each sequence's pages in kv_indices
    kv_indices     [P]    the block ids of every sequence, concatenated
    kv_last_len    [S]    tokens used in each sequence's last page (1..block_size)

A batch of only decodes goes to the decode wrapper, anything else to the
prefill wrapper with ``causal=True`` (FlashInfer aligns the causal mask to
the end of each sequence, so chunks attend to their cached prefix). Both are
planned once per step, at the first layer (which brings the softmax scale),
and reused by every layer.

Not supported yet (``supports`` says so, and the engine runs such a step on
the PyTorch path on the same device instead): query passes (rows that read
contexts and write nothing), and the ``full`` and ``block_causal`` chunk
masks. FlashInfer's prefill wrapper takes a custom mask (``custom_mask``) and
paged KV without appending, which is how the KV-context masks will map onto
it; until then only causal appends run here.

TODO(cuda-graphs): decode steps are not captured in CUDA graphs yet; that
needs fixed-size metadata buffers (``use_cuda_graph=True`` wrappers) and a
per-batch-size graph cache in the runner.
"""

from __future__ import annotations

import torch

from walkserve.layers.attention import AttentionContext
from walkserve.layers.paged_attention import PagedAttentionBackend, PagedBatch

WORKSPACE_BYTES = 128 << 20


class FlashInferBackend(PagedAttentionBackend):
    """Owns the workspace and the two wrappers; hands out one context per step."""

    def __init__(self, device: torch.device):
        import flashinfer

        self.device = device
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)

    def supports(self, batch: PagedBatch) -> bool:
        """Causal appends only (see the module docstring)."""
        return batch.plain

    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        if not batch.plain:
            raise NotImplementedError("FlashInfer backend: query passes and full/block_causal masks are not supported yet")
        return FlashInferPagedAttention(self, k_cache, v_cache, batch)


class FlashInferPagedAttention(AttentionContext):
    """One step's attention: writes k/v through the slot mapping, then runs the planned wrapper."""

    def __init__(self, backend: FlashInferBackend, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch):
        self.backend, self.k_cache, self.v_cache, self.batch = backend, k_cache, v_cache, batch
        self.slot_mapping = batch.tensors(k_cache.device).slots  # [T]
        self.is_decode = all(q == 1 for q in batch.query_lens)
        self._planned_scale: float | None = None

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        self.k_cache[layer].view(-1, hkv, dh).index_copy_(0, self.slot_mapping, k.to(self.k_cache.dtype))
        self.v_cache[layer].view(-1, hkv, dh).index_copy_(0, self.slot_mapping, v.to(self.v_cache.dtype))
        if self._planned_scale != scale:
            self._plan(q.shape[1], hkv, dh, q.dtype, scale)
        wrapper = self.backend.decode if self.is_decode else self.backend.prefill
        return wrapper.run(q.contiguous(), (self.k_cache[layer], self.v_cache[layer]))  # [T, Hq, Dh]

    def _plan(self, hq: int, hkv: int, dh: int, q_dtype: torch.dtype, scale: float) -> None:
        batch, bs, device = self.batch, self.batch.block_size, self.k_cache.device
        pages = [-(-kv // bs) for kv in batch.kv_lens]
        int32 = {"dtype": torch.int32, "device": device}
        kv_indptr = torch.tensor(_offsets(pages), **int32)
        kv_indices = torch.tensor([b for t, n in zip(batch.block_tables, pages) for b in t[:n]], **int32)
        last_len = torch.tensor([kv - (n - 1) * bs for kv, n in zip(batch.kv_lens, pages)], **int32)
        kv_dtype = self.k_cache.dtype
        if self.is_decode:
            self.backend.decode.plan(
                kv_indptr, kv_indices, last_len, hq, hkv, dh, bs,
                q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=scale,
            )  # fmt: skip
        else:
            qo_indptr = torch.tensor(_offsets(batch.query_lens), **int32)
            self.backend.prefill.plan(
                qo_indptr, kv_indptr, kv_indices, last_len, hq, hkv, dh, bs,
                causal=True, sm_scale=scale, q_data_type=q_dtype, kv_data_type=kv_dtype,
            )  # fmt: skip
        self._planned_scale = scale


def _offsets(sizes: list[int]) -> list[int]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + size)
    return out
