"""torch tensor <-> TensorMsg: inline bytes when small or remote, a shared-memory segment otherwise."""

from __future__ import annotations

import itertools

import torch

from walkserve.core import env
from walkserve.protocol.messages import TensorMsg
from walkserve.transport import shm
from walkserve.transport.dtypes import NAME_TO_TORCH as _NAME_TO_TORCH
from walkserve.transport.dtypes import TORCH_TO_NAME as _NP_TO_NAME

_SMALL = {k: v for k, v in _NP_TO_NAME.items() if k not in (torch.bfloat16, torch.bool)}


class TensorCodec:
    """Packs tensors for one sender. ``prefix`` is ``ws-<run id>-<sender>``; names get a counter."""

    def __init__(self, run_id: str, sender: str, inline_bytes: int | None = None, use_shm: bool = True):
        self.prefix = f"{shm.PREFIX}{run_id}-{sender}"
        self.inline_bytes = env.WALKSERVE_SHM_INLINE_BYTES.get() if inline_bytes is None else inline_bytes
        self.use_shm = use_shm and shm.available()
        self._n = itertools.count()
        self.small = 64 if self.inline_bytes >= 64 * 8 else 0  # elements always sent inline
        self.shm_sent = 0

    def pack(self, t: torch.Tensor, allow_shm: bool = True) -> TensorMsg:
        name = _SMALL.get(t.dtype)
        if name is not None and t.numel() <= self.small and t.is_cpu and t.is_contiguous():
            data = t.detach().numpy().tobytes()  # the common case: a token or a few values
            return TensorMsg(name, tuple(t.shape), data=data, nbytes=len(data))
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
        name = _NP_TO_NAME[t.dtype]
        raw = t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t.to(torch.uint8)
        nbytes = t.numel() * t.element_size()
        if allow_shm and self.use_shm and nbytes > self.inline_bytes:
            seg = f"{self.prefix}-{next(self._n)}"
            shm.write_segment(seg, memoryview(raw.numpy()).cast("B"))
            self.shm_sent += 1
            return TensorMsg(name, tuple(t.shape), shm=seg, nbytes=nbytes)
        return TensorMsg(name, tuple(t.shape), data=raw.numpy().tobytes() if nbytes else b"", nbytes=nbytes)


def stack_rows(values: list) -> torch.Tensor | None:
    """The values as rows of one tensor when all are tensors of one dtype and shape (else None)."""
    first = values[0]
    if not isinstance(first, torch.Tensor):
        return None
    dtype = first.dtype
    try:
        stacked = torch.stack(values)  # refuses a value that is not a tensor, or of another shape or device
    except (TypeError, RuntimeError):
        return None
    for v in values:  # stack would promote mixed dtypes: such values travel one by one
        if v.dtype != dtype:
            return None
    return stacked


def unpack(msg: TensorMsg) -> torch.Tensor:
    """TensorMsg -> tensor. A shared-memory segment is mapped without a copy and unlinked."""
    dtype = _NAME_TO_TORCH[msg.dtype]
    if msg.shm is not None:
        if msg.nbytes == 0:
            shm.read_segment(msg.shm, 0).close()
            return torch.empty(msg.shape, dtype=dtype)
        buf = shm.read_segment(msg.shm, msg.nbytes)
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=msg.nbytes)
    else:
        if not msg.data:
            return torch.empty(msg.shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(msg.data), dtype=torch.uint8)
    if dtype == torch.bool:
        return flat.to(torch.bool).reshape(msg.shape)
    return flat.view(dtype).reshape(msg.shape)

