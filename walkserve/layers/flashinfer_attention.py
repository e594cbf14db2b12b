"""Paged attention through FlashInfer's batch wrappers (CUDA only; imported lazily).

The pool layout ``k[layer]: [num_blocks, block_size, Hkv, Dh]`` is
FlashInfer's "NHD" paged layout, so the kernels read the pool in place. Every
operation and mask of the KV-context contract runs here (``flashinfer_plan``
says how a step becomes wrapper calls):

    causal appends, all one row      BatchDecodeWithPagedKVCacheWrapper (tensor cores)
    any other appends                BatchPrefillWithPagedKVCacheWrapper: causal=True,
                                     causal=False (all ``full``), or a custom mask
                                     (``block_causal``, or a mix of kinds)
    queries (write nothing)          the same paged prefill over the contexts they read
                                     (return_lse) + BatchPrefillWithRaggedKVCacheWrapper
                                     over their own rows, merged with ``merge_state``

New rows are written through the slot mapping (``index_copy_``, the write of
the PyTorch path, so both backends fill the pool the same way) before the
kernels read it. Wrappers are planned once per step, at the first layer (which
brings the softmax scale), and reused by every layer. The FA2 kernels are used
throughout (``backend="fa2"``): one JIT module per (dtype, head dim) serves
decode, prefill and every mask. The PyTorch path (``TorchPagedAttention``)
stays the reference these are tested against.

CUDA graphs: ``graph_decode`` gives the static context the decode graph runner
captures (``engines/kv/cuda_graphs.py``): a decode wrapper built with
``use_cuda_graph=True`` over fixed index buffers, re-planned before each replay.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from walkserve.layers.attention import AttentionContext
from walkserve.layers.flashinfer_plan import PagedPass, RaggedPass, StepPlan, plan_step
from walkserve.layers.graph_attention import GraphDecodeAttention
from walkserve.layers.paged_attention import PagedAttentionBackend, PagedBatch

WORKSPACE_BYTES = 128 << 20
KERNELS = "fa2"


class FlashInferBackend(PagedAttentionBackend):
    """Owns the workspace and the wrappers (created on first use); hands out one context per step.

    ``module``: the ``flashinfer`` module (tests pass a stand-in that runs on the CPU).
    """

    def __init__(self, device: torch.device, module: ModuleType | None = None):
        self.fi = module or importlib.import_module("flashinfer")
        self.device = torch.device(device)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrappers: dict[str, object] = {}

    def wrapper(self, name: str):
        """The step wrappers, one per role: ``decode``, ``prefill`` (appends), ``cached`` (queries), ``ragged``."""
        if name not in self._wrappers:
            fi = self.fi
            if name == "decode":
                made = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True, backend=KERNELS)
            elif name == "ragged":
                made = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=KERNELS)
            else:
                made = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=KERNELS)
            self._wrappers[name] = made
        return self._wrappers[name]

    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        return FlashInferPagedAttention(self, k_cache, v_cache, batch)

    def graph_decode(self, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int, max_blocks: int) -> GraphDecodeAttention:
        return FlashInferGraphDecode(self, k_cache, v_cache, size, max_blocks)


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


class FlashInferPagedAttention(AttentionContext):
    """One step's attention: writes k/v through the slot mapping, then runs the planned passes."""

    def __init__(self, backend: FlashInferBackend, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch):
        self.backend, self.k_cache, self.v_cache, self.batch = backend, k_cache, v_cache, batch
        index = batch.tensors(k_cache.device)
        self.slot_mapping, self.written = index.slots, index.written  # [W], [W] or None
        self.plan: StepPlan = plan_step(batch)
        device = k_cache.device
        rows = lambda p: None if p is None else torch.tensor(p.rows, dtype=torch.long, device=device)  # noqa: E731
        self.append_rows, self.cached_rows = rows(self.plan.appends), rows(self.plan.cached)
        self.own_rows = rows(self.plan.own)
        self.merge = torch.tensor(self.plan.merge, dtype=torch.long, device=device)
        self.only_appends = self.plan.own is None and len(self.plan.appends.rows) == batch.num_tokens
        self._planned_scale: float | None = None

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hkv, dh = k.shape[1], k.shape[2]
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]  # [N, bs, Hkv, Dh]
        k_new, v_new = (k, v) if self.written is None else (k[self.written], v[self.written])
        k_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, k_new.to(k_cache.dtype))
        v_cache.view(-1, hkv, dh).index_copy_(0, self.slot_mapping, v_new.to(v_cache.dtype))
        if self._planned_scale != scale:
            self._plan_all(q.shape[1], hkv, dh, scale)
        q_dtype, q = q.dtype, q.to(k_cache.dtype)
        cache = (k_cache, v_cache)
        plan, wrapper = self.plan, self.backend.wrapper
        if self.only_appends:
            return wrapper(_append_role(plan.appends)).run(q.contiguous(), cache).to(q_dtype)  # [T, Hq, Dh]
        out = torch.empty_like(q)  # [T, Hq, Dh]
        if plan.appends is not None:
            out[self.append_rows] = wrapper(_append_role(plan.appends)).run(q[self.append_rows].contiguous(), cache)
        own = self.own_rows
        o, lse = wrapper("ragged").run(q[own].contiguous(), k[own].to(q.dtype).contiguous(),
                                       v[own].to(q.dtype).contiguous(), return_lse=True)  # [R, Hq, Dh], [R, Hq]
        if plan.cached is not None:
            oc, lsec = wrapper("cached").run(q[self.cached_rows].contiguous(), cache, return_lse=True)
            merged, _ = self.backend.fi.merge_state(oc, lsec, o[self.merge].contiguous(), lse[self.merge].contiguous())
            o = o.index_copy(0, self.merge, merged.to(o.dtype))
        out[own] = o
        return out.to(q_dtype)

    def _plan_all(self, hq: int, hkv: int, dh: int, scale: float) -> None:
        dtype, bs, plan = self.k_cache.dtype, self.batch.block_size, self.plan
        common = {"q_data_type": dtype, "kv_data_type": dtype, "sm_scale": scale}
        if plan.appends is not None:
            plan_paged(self.backend.wrapper(_append_role(plan.appends)), plan.appends, hq, hkv, dh, bs, common,
                       self.k_cache.device)
        if plan.cached is not None:
            plan_paged(self.backend.wrapper("cached"), plan.cached, hq, hkv, dh, bs, common, self.k_cache.device)
        if plan.own is not None:
            plan_ragged(self.backend.wrapper("ragged"), plan.own, hq, hkv, dh, common, self.k_cache.device)
        self._planned_scale = scale


def _append_role(p: PagedPass) -> str:
    return "decode" if p.decode else "prefill"


def plan_paged(wrapper, p: PagedPass, hq: int, hkv: int, dh: int, bs: int, common: dict, device: torch.device) -> None:
    """Plan a paged pass on its wrapper (decode or prefill, as ``p.decode`` says)."""
    kv_indptr, kv_indices, last = (_int32(x, device) for x in (p.kv_indptr, p.kv_indices, p.last_page_len))
    if p.decode:
        wrapper.plan(kv_indptr, kv_indices, last, hq, hkv, dh, bs, **common)
        return
    mask = None if p.mask is None else p.mask.to(device)
    wrapper.plan(_int32(p.qo_indptr, device), kv_indptr, kv_indices, last, hq, hkv, dh, bs,
                 custom_mask=mask, causal=p.causal, **common)


def plan_ragged(wrapper, p: RaggedPass, hq: int, hkv: int, dh: int, common: dict, device: torch.device) -> None:
    indptr = _int32(p.indptr, device)
    mask = None if p.mask is None else p.mask.to(device)
    wrapper.plan(indptr, indptr, hq, hkv, dh, custom_mask=mask, causal=p.causal, **common)


class FlashInferGraphDecode(GraphDecodeAttention):
    """A decode of exactly ``size`` one-row appends over fixed buffers, capturable in a CUDA graph.

    ``prepare(batch)`` (outside the graph) copies the slot mapping into its
    static buffer and re-plans the wrapper, whose index buffers it owns; the
    captured ``forward`` writes the new k/v and runs the planned kernel.
    """

    def __init__(self, backend: FlashInferBackend, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int,
                 max_blocks: int):
        super().__init__(k_cache, v_cache, size, max_blocks)
        device = k_cache.device
        self.indptr = torch.zeros(size + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(size * max_blocks, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(size, dtype=torch.int32, device=device)
        self.wrapper = backend.fi.BatchDecodeWithPagedKVCacheWrapper(
            backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True, backend=KERNELS,
            paged_kv_indptr_buffer=self.indptr, paged_kv_indices_buffer=self.indices,
            paged_kv_last_page_len_buffer=self.last_page_len,
        )  # fmt: skip
        self.heads: tuple[int, int, int] | None = None
        self.scale: float | None = None
        self._pending: PagedPass | None = None

    def prepare(self, batch: PagedBatch) -> None:
        self.copy_slots(batch)
        self._pending = plan_step(batch).appends
        if self.scale is not None:
            self._replan()

    def _replan(self) -> None:
        hq, hkv, dh = self.heads
        common = {"q_data_type": self.k_cache.dtype, "kv_data_type": self.k_cache.dtype, "sm_scale": self.scale}
        plan_paged(self.wrapper, self._pending, hq, hkv, dh, self.block_size, common, self.k_cache.device)

    def attend(self, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        if self.scale is None:  # the first (eager, warm-up) call plans; capture and replays reuse the plan
            self.heads, self.scale = (q.shape[1], self.k_cache.shape[3], self.k_cache.shape[4]), scale
            self._replan()
        out = self.wrapper.run(q.to(self.k_cache.dtype), (self.k_cache[layer], self.v_cache[layer]))  # [B, Hq, Dh]
        return out.to(q.dtype)
