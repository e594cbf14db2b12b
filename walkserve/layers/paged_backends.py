"""The paged-attention backends by name, and the pick among them (``make_paged_backend``).

    torch       TorchPagedBackend (here): plain PyTorch, any device; the reference and the fallback
    flashinfer  FlashInferBackend (``flashinfer_attention``): CUDA, fp16/bf16 pools; imported only when chosen

The registry sits above the backends it chooses among, so ``paged_attention``
(the batch description and the PyTorch kernels) imports none of them.
"""

from __future__ import annotations

import torch

from walkserve.core.errors import ConfigError
from walkserve.layers.attention import AttentionContext
from walkserve.layers.decode_mirror import DecodeMirror
from walkserve.layers.graph_attention import TorchGraphDecode
from walkserve.layers.paged_attention import (
    PagedAttentionBackend,
    PagedBatch,
    Scratch,
    TorchPagedAttention,
)


class TorchPagedBackend(PagedAttentionBackend):
    """The pure-PyTorch backend (CPU, or any device as a reference); owns the gather scratch buffers and the
    decode mirror (the dense keys of the last decode batch, carried across steps)."""

    def __init__(self) -> None:
        self.scratch = Scratch()
        self.mirror = DecodeMirror()

    def context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch) -> AttentionContext:
        return TorchPagedAttention(k_cache, v_cache, batch, self.scratch, self.mirror)

    def graph_decode(self, k_cache: torch.Tensor, v_cache: torch.Tensor, size: int, max_blocks: int) -> TorchGraphDecode:
        return TorchGraphDecode(k_cache, v_cache, size, max_blocks)


def _make_torch(device: torch.device) -> PagedAttentionBackend:
    return TorchPagedBackend()


def _make_flashinfer(device: torch.device) -> PagedAttentionBackend:
    from walkserve.layers.flashinfer_attention import FlashInferBackend  # lazy: CUDA installs only

    return FlashInferBackend(device)


PAGED_BACKENDS = {"torch": _make_torch, "flashinfer": _make_flashinfer}


FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
FLASHINFER_HEAD_DIM_MULTIPLE = 64  # FA2's bf16/fp16 tiles load head dims in steps of 64 (64, 128, 256)


def flashinfer_available(device: torch.device, dtype: torch.dtype | None = None, head_dim: int | None = None) -> bool:
    """True when FlashInfer can serve a pool of ``dtype`` and ``head_dim`` on ``device`` (CUDA, fp16/bf16, a head
    dim that is a multiple of 64, package importable)."""
    if device.type != "cuda" or (dtype is not None and dtype not in FLASHINFER_DTYPES):
        return False
    if head_dim is not None and head_dim % FLASHINFER_HEAD_DIM_MULTIPLE:
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def make_paged_backend(name: str, device: torch.device | str, dtype: torch.dtype | None = None,
                       head_dim: int | None = None) -> PagedAttentionBackend:
    """Pick a paged-attention backend: ``"torch"``, ``"flashinfer"`` or ``"auto"``.

    ``auto`` takes FlashInfer when the device is CUDA, the pool ``dtype`` is
    fp16/bf16, ``head_dim`` a multiple of 64 and ``flashinfer`` imports, else
    the PyTorch path. Heavy backends are imported only here.
    """
    device = torch.device(device)
    if name == "auto":
        name = "flashinfer" if flashinfer_available(device, dtype, head_dim) else "torch"
    if name not in PAGED_BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; choose one of {sorted(PAGED_BACKENDS)} or 'auto'")
    if name == "flashinfer" and not flashinfer_available(device, dtype, head_dim):
        raise ConfigError(
            f"attention backend 'flashinfer' needs a CUDA device, an fp16/bf16 KV pool, a head dim that is a multiple "
            f"of {FLASHINFER_HEAD_DIM_MULTIPLE} and the flashinfer package (device {device}, dtype {dtype}, "
            f"head dim {head_dim})"
        )
    return PAGED_BACKENDS[name](device)
