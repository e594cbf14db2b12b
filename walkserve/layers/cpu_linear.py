"""``linear``: F.linear with a faster CPU path for the few rows of a decode batch (see its docstring)."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

CHUNK_MIN_ROWS = 4  # below this many input rows the plain kernels (gemv) are as fast or faster
FLOAT32_CHUNK_MAX_ROWS = 64  # float32 gains only at decode-sized M; prefill-sized M stays on F.linear
CHUNK_ELEMS = 1 << 19  # weight elements per chunk: 2 MiB of float32, stays in cache
_LOW_PRECISION = (torch.bfloat16, torch.float16)
_scratch = threading.local()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x [..., K], weight [N, K], bias)``, computed faster on the CPU for a few rows (a decode batch).

    With at least ``CHUNK_MIN_ROWS`` rows, a CPU weight is multiplied a
    cache-sized chunk of output rows at a time (one ``mm`` per chunk):

    - float32, up to ``FLOAT32_CHUNK_MAX_ROWS`` rows: MKL streams a large
      weight poorly for small M; chunking it was ~20% faster at M = 4..32 on
      the 2-core AVX2 machine (and made no difference for prefill).
    - bf16/fp16 on a CPU without native kernels for them (no AVX512-BF16 /
      AMX): PyTorch's generic reduced-precision kernel runs at ~8 GFLOP/s;
      each chunk is converted to float32 in a reused buffer and multiplied
      by the float32 kernel instead (2-3x faster at M = 16, ~6x for prefill).
      bf16/fp16 products are exact in float32 and both accumulate in float32.

    Only the summation order differs from ``F.linear``; the result has x's dtype.
    """
    mode = _chunk_mode(x, weight)
    if mode is None:
        return F.linear(x, weight, bias)
    n, k = weight.shape
    rows = x.reshape(-1, k)  # [M, K]
    rows = rows.float() if mode == "upcast" else rows
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype)  # [M, N]
    step = max(1, CHUNK_ELEMS // k)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        chunk = weight[lo:hi]  # [n_chunk, K]
        if mode == "upcast":
            chunk = _float_buffer((hi - lo) * k).view(hi - lo, k).copy_(chunk)
        torch.mm(rows, chunk.t(), out=out[:, lo:hi])
    if bias is not None:
        out += bias
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def _chunk_mode(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """"chunk" (float32), "upcast" (bf16/fp16 without native kernels) or None (plain F.linear)."""
    if weight.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or x.dim() == 0:
        return None
    if x.numel() < CHUNK_MIN_ROWS * x.shape[-1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None  # the chunks write into ``out=``, which autograd does not record
    if weight.dtype == torch.float32:
        small = x.numel() <= FLOAT32_CHUNK_MAX_ROWS * x.shape[-1]
        return "chunk" if small and weight.numel() > 2 * CHUNK_ELEMS and weight.is_contiguous() else None
    if weight.dtype in _LOW_PRECISION and not native_low_precision(weight.dtype):
        return "upcast"
    return None


def native_low_precision(dtype: torch.dtype) -> bool:
    """True when this CPU has matmul instructions for ``dtype`` (bf16: AVX512-BF16 or AMX; fp16: AMX-FP16)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported") if dtype == torch.bfloat16 else (
        "_is_amx_fp16_supported",)
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def _float_buffer(numel: int) -> torch.Tensor:
    """A float32 buffer of at least ``numel`` elements, one per thread (and per inference mode), reused.

    A tensor made under ``torch.inference_mode`` cannot be written outside it, so
    each mode keeps its own buffer.
    """
    attr = "buf_inference" if torch.is_inference_mode_enabled() else "buf"
    buf = getattr(_scratch, attr, None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, CHUNK_ELEMS), dtype=torch.float32)
        setattr(_scratch, attr, buf)
    return buf[:numel]
