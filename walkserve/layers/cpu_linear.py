"""``linear``: F.linear with faster CPU paths (oneDNN for float32, see its docstring).

Which float32 kernel runs is ``KERNEL`` (the knob ``WALKSERVE_CPU_LINEAR``; ``use_kernel`` switches it
for a block, as the benchmarks do to compare kernels in one process):

    onednn   oneDNN's linear on the weight as stored (the default; no extra memory)
    packed   oneDNN's linear on a copy of each weight pre-packed in its blocked layout, built at first
             use and rebuilt when the weight changes: faster still, but every float32 linear weight
             is held twice
    mkl      ``F.linear`` (MKL), with the chunked path below for decode-sized batches (the previous path)
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from walkserve.core import env

CHUNK_MIN_ROWS = 4  # below this many input rows the plain kernels (gemv) are as fast or faster
FLOAT32_CHUNK_MAX_ROWS = 64  # float32 gains only at decode-sized M; prefill-sized M stays on F.linear
CHUNK_ELEMS = 1 << 19  # weight elements per chunk: 2 MiB of float32, stays in cache
_LOW_PRECISION = (torch.bfloat16, torch.float16)
_scratch = threading.local()
KERNELS = ("onednn", "packed", "mkl")
KERNEL = env.WALKSERVE_CPU_LINEAR.get()
if KERNEL not in KERNELS:
    raise ValueError(f"WALKSERVE_CPU_LINEAR={KERNEL!r}: choose one of {', '.join(KERNELS)}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x [..., K], weight [N, K], bias)``, computed faster on the CPU.

    float32 on the CPU goes to oneDNN (``KERNEL`` "onednn" or "packed"): on
    the 2-core AMD EPYC (AVX-512) development machine MKL's sgemm ran a
    16-row decode batch 1.2-4x slower than oneDNN at 2 threads (the 32000 x
    512 LM head: 11.5 ms against 5.4 ms, 3.0 ms on a packed weight), and
    prefill-sized batches 5-15% slower. With ``KERNEL`` "mkl" (or no oneDNN)
    the previous paths below run.

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
    if _onednn(x, weight):
        rows = x.reshape(-1, x.shape[-1])  # [M, K]
        w = _packed(weight) if KERNEL == "packed" and _versioned(weight) else weight
        out = torch.ops.mkldnn._linear_pointwise(rows, w, bias, "none", [], "")  # [M, N]
        return out.reshape(*x.shape[:-1], weight.shape[0])
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


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether oneDNN computes this float32 CPU linear (inference only: its op records no gradient)."""
    if KERNEL == "mkl" or not _HAVE_ONEDNN or weight.device.type != "cpu" or weight.dim() != 2 or x.dim() == 0:
        return False
    if weight.dtype != torch.float32 or x.dtype != torch.float32:
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


_HAVE_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# id(weight) -> (the weight, weakly; its data pointer and version when packed; the packed copy)
_PACKED: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}


def _versioned(weight: torch.Tensor) -> bool:
    """A parameter whose writes are counted (not one made under inference mode): its packed copy can be cached."""
    return isinstance(weight, torch.nn.Parameter) and not weight.is_inference()


def _packed(weight: torch.nn.Parameter) -> torch.Tensor:
    """oneDNN's pre-packed copy of ``weight``, rebuilt when the weight is written or replaced."""
    entry = _PACKED.get(id(weight))
    if entry is not None and entry[0]() is weight and entry[1:3] == (weight.data_ptr(), weight._version):
        return entry[3]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    key = id(weight)
    _PACKED[key] = (weakref.ref(weight, lambda _: _PACKED.pop(key, None)), weight.data_ptr(), weight._version, packed)
    return packed


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    """Run the block with float32 CPU linears on kernel ``name`` (one of ``KERNELS``)."""
    global KERNEL
    assert name in KERNELS, name
    before, KERNEL = KERNEL, name
    try:
        yield
    finally:
        KERNEL = before


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
