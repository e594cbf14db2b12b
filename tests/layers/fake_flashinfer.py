"""A CPU stand-in for the parts of ``flashinfer`` that walkserve calls, with FlashInfer's documented semantics.

The wrappers take the same constructor, ``plan`` and ``run`` arguments as
flashinfer 0.6 (the names and order of the parameters walkserve passes), check
them as the real ones would (int32 CSR arrays, 1 <= last_page_len <=
page_size, a flat custom mask of sum(q_len * kv_len) bools, a fixed batch size
and caller-owned index buffers in CUDA-graph mode) and compute attention in
float32 with plain torch:

    paged    sequence i: pages kv_indices[kv_indptr[i]:kv_indptr[i+1]], keys
             (pages - 1) * page_size + last_page_len[i]; causal aligned to the
             end of the keys; custom mask row-major [q_len, kv_len]
    ragged   q rows qo_indptr[i]:.., keys kv_indptr[i]:.. of the k/v given
    lse      natural-log log-sum-exp per (row, head); ``merge_state`` merges with
             the same convention (the real kernels' base never leaves FlashInfer)

In CUDA-graph mode ``plan`` copies into the buffers and ``run`` reads the
buffers, so a caller that forgets to re-plan before a replay reads stale data
here as it would there. ``calls`` counts plans and runs per wrapper.
"""

from __future__ import annotations

import itertools

import torch

# The other keyword arguments of flashinfer 0.6's plan methods (the stand-in refuses any name not among them).
PREFILL_OPTIONS = {"head_dim_vo", "packed_custom_mask", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left",
                   "logits_soft_cap", "rope_scale", "rope_theta", "kv_data_type", "o_data_type", "non_blocking",
                   "fixed_split_size", "disable_split_kv"}
DECODE_OPTIONS = {"pos_encoding_mode", "window_left", "logits_soft_cap", "kv_data_type", "o_data_type", "data_type",
                  "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens", "fixed_split_size",
                  "disable_split_kv"}


def _known(options: dict, names: set[str]) -> None:
    unknown = set(options) - names
    assert not unknown, f"flashinfer takes no argument {sorted(unknown)}"


def _ints(t: torch.Tensor, name: str) -> list[int]:
    assert t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}"
    return t.tolist()


def _attend(q, keys, values, allowed, scale):
    """q [n, Hq, D], keys/values [L, Hkv, D], allowed bool [n, L] -> out [n, Hq, D], lse [n, Hq] (float32)."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale  # [Hq, n, L]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, n]
    out = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v)
    return out.to(q.dtype), lse.transpose(0, 1).contiguous()


def _mask(causal: bool, custom: list[bool] | None, offset: int, n: int, kv: int) -> torch.Tensor:
    if custom is not None:
        return torch.tensor(custom[offset : offset + n * kv], dtype=torch.bool).view(n, kv)
    if causal:
        return torch.ones(n, kv, dtype=torch.bool).tril(diagonal=kv - n)
    return torch.ones(n, kv, dtype=torch.bool)


class _Wrapper:
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", backend: str = "auto"):
        assert kv_layout == "NHD" and backend in ("auto", "fa2", "fa3")
        self.workspace, self.calls, self.planned = float_workspace_buffer, {"plan": 0, "run": 0}, None

    def _checked(self, q: torch.Tensor, heads: int, dtype) -> None:
        assert self.planned is not None, "run before plan"
        assert q.dim() == 3 and q.shape[1] == heads, f"q {tuple(q.shape)} vs {heads} heads"
        assert q.dtype == dtype, f"q dtype {q.dtype} != planned {dtype}"
        self.calls["run"] += 1


def _pages(kv_indptr, last, page_size):
    assert all(1 <= x <= page_size for x in last), f"last_page_len {last} outside [1, {page_size}]"
    assert all(b > a for a, b in itertools.pairwise(kv_indptr)), "every sequence needs a page"
    return [(b - a - 1) * page_size + x for (a, b), x in zip(itertools.pairwise(kv_indptr), last)]


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto"):
        super().__init__(float_workspace_buffer, kv_layout, backend)
        assert not use_cuda_graph, "walkserve captures only decode wrappers"

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, custom_mask=None, causal=False, sm_scale=None, q_data_type="float16",
             **options):
        _known(options, PREFILL_OPTIONS)
        qo, kv_indptr = _ints(qo_indptr, "qo_indptr"), _ints(paged_kv_indptr, "paged_kv_indptr")
        indices, last = _ints(paged_kv_indices, "paged_kv_indices"), _ints(paged_kv_last_page_len, "last_page_len")
        assert len(qo) == len(kv_indptr) == len(last) + 1 and kv_indptr[-1] == len(indices)
        kv_lens = _pages(kv_indptr, last, page_size)
        q_lens = [b - a for a, b in itertools.pairwise(qo)]
        assert all(n >= 1 for n in q_lens)
        mask = None
        if custom_mask is not None:
            assert custom_mask.dtype == torch.bool and custom_mask.dim() == 1
            assert custom_mask.numel() == sum(n * k for n, k in zip(q_lens, kv_lens)), "custom mask length"
            mask = custom_mask.tolist()
        self.planned = (qo, kv_indptr, indices, kv_lens, mask, causal, sm_scale or head_dim_qk**-0.5,
                        num_qo_heads, num_kv_heads, q_data_type, page_size)
        self.calls["plan"] += 1

    def run(self, q, paged_kv_cache, return_lse=False):
        qo, kv_indptr, indices, kv_lens, mask, causal, scale, hq, hkv, dtype, bs = self.planned or (None,) * 11
        self._checked(q, hq, dtype)
        k_cache, v_cache = paged_kv_cache
        assert k_cache.shape[1] == bs and k_cache.shape[2] == hkv and q.shape[0] == qo[-1]
        outs, lses, offset = [], [], 0
        for i, kv in enumerate(kv_lens):
            pages = torch.tensor(indices[kv_indptr[i] : kv_indptr[i + 1]])
            keys = k_cache[pages].reshape(-1, hkv, k_cache.shape[3])[:kv]
            values = v_cache[pages].reshape(-1, hkv, v_cache.shape[3])[:kv]
            n = qo[i + 1] - qo[i]
            o, s = _attend(q[qo[i] : qo[i + 1]], keys, values, _mask(causal, mask, offset, n, kv), scale)
            offset += n * kv
            outs.append(o)
            lses.append(s)
        result = torch.cat(outs)
        return (result, torch.cat(lses)) if return_lse else result


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
        super().__init__(float_workspace_buffer, kv_layout, backend)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, custom_mask=None, causal=False,
             sm_scale=None, q_data_type="float16", **options):
        _known(options, PREFILL_OPTIONS)
        qo, kv = _ints(qo_indptr, "qo_indptr"), _ints(kv_indptr, "kv_indptr")
        pairs = [(b - a, d - c) for a, b, c, d in zip(qo, qo[1:], kv, kv[1:])]
        mask = None
        if custom_mask is not None:
            assert custom_mask.numel() == sum(n * k for n, k in pairs), "custom mask length"
            mask = custom_mask.tolist()
        self.planned = (qo, kv, mask, causal, sm_scale or head_dim_qk**-0.5, num_qo_heads, num_kv_heads, q_data_type)
        self.calls["plan"] += 1

    def run(self, q, k, v, return_lse=False):
        qo, kv, mask, causal, scale, hq, hkv, dtype = self.planned or (None,) * 8
        self._checked(q, hq, dtype)
        assert k.shape[1] == hkv and k.dtype == dtype and k.shape[0] == kv[-1]
        outs, lses, offset = [], [], 0
        for i in range(len(qo) - 1):
            n, m = qo[i + 1] - qo[i], kv[i + 1] - kv[i]
            o, s = _attend(q[qo[i] : qo[i + 1]], k[kv[i] : kv[i + 1]], v[kv[i] : kv[i + 1]],
                           _mask(causal, mask, offset, n, m), scale)
            offset += n * m
            outs.append(o)
            lses.append(s)
        result = torch.cat(outs)
        return (result, torch.cat(lses)) if return_lse else result


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, backend="auto", **options):
        _known(options, {"use_tensor_cores", "jit_args"})
        super().__init__(float_workspace_buffer, kv_layout, backend)
        self.graph = use_cuda_graph
        if use_cuda_graph:
            for buf in (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer):
                assert torch.is_tensor(buf) and buf.dtype == torch.int32, "cuda-graph mode needs int32 buffers"
            assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
        self.bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             q_data_type="float16", sm_scale=None, **options):
        _known(options, DECODE_OPTIONS)
        kv_indptr, idx, last = _ints(indptr, "indptr"), _ints(indices, "indices"), _ints(last_page_len, "last_page_len")
        assert len(kv_indptr) == len(last) + 1 and kv_indptr[-1] == len(idx)
        _pages(kv_indptr, last, page_size)
        if self.graph:
            ptr_buf, idx_buf, last_buf = self.bufs
            assert len(last) == len(last_buf), f"batch size {len(last)} != the graph's {len(last_buf)}"
            assert len(idx) <= len(idx_buf), "indices exceed the buffer"
            ptr_buf.copy_(indptr)
            idx_buf[: len(idx)].copy_(indices)
            last_buf.copy_(last_page_len)
        else:
            self.bufs = (indptr.clone(), indices.clone(), last_page_len.clone())
        self.planned = (sm_scale or head_dim**-0.5, num_qo_heads, num_kv_heads, q_data_type, page_size)
        self.calls["plan"] += 1

    def run(self, q, paged_kv_cache, return_lse=False):
        scale, hq, hkv, dtype, bs = self.planned or (None,) * 5
        self._checked(q, hq, dtype)
        ptr, idx, last = (b.tolist() for b in self.bufs)  # read at run time: graph replays see the buffers
        kv_lens = _pages(ptr, last, bs)
        assert q.shape[0] == len(kv_lens)
        k_cache, v_cache = paged_kv_cache
        outs = []
        for i, kv in enumerate(kv_lens):
            pages = torch.tensor(idx[ptr[i] : ptr[i + 1]])
            keys = k_cache[pages].reshape(-1, hkv, k_cache.shape[3])[:kv]
            values = v_cache[pages].reshape(-1, hkv, v_cache.shape[3])[:kv]
            outs.append(_attend(q[i : i + 1], keys, values, torch.ones(1, kv, dtype=torch.bool), scale)[0])
        return torch.cat(outs)


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """Merge two partial attentions over disjoint keys: v [n, H, D], s [n, H] (log-sum-exp, float32)."""
    assert s_a.dtype == s_b.dtype == torch.float32 and v_a.shape == v_b.shape and s_a.shape == v_a.shape[:2]
    s = torch.logaddexp(s_a, s_b)  # [n, H]
    w_a, w_b = torch.exp(s_a - s)[..., None], torch.exp(s_b - s)[..., None]
    return (v_a.float() * w_a + v_b.float() * w_b).to(v_a.dtype), s
