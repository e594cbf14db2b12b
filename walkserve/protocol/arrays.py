"""ArrayData <-> TensorMsg, for the torch-free side (conductor, frontend)."""

from __future__ import annotations

from walkserve.core.array import ArrayData
from walkserve.protocol.messages import TensorMsg


def array_to_msg(a: ArrayData) -> TensorMsg:
    return TensorMsg(a.dtype, tuple(a.shape), data=a.data, nbytes=a.nbytes)


def msg_to_array(m: TensorMsg) -> ArrayData:
    if m.shm is not None:
        raise ValueError("a shared-memory tensor reached a torch-free process; send it inline")
    return ArrayData(m.dtype, tuple(m.shape), m.data or b"")


def wire_value(v):
    """A request/walk value as it travels: ArrayData becomes an inline TensorMsg."""
    return array_to_msg(v) if isinstance(v, ArrayData) else v


def plain_value(v):
    """A travelled value for the state machine / client: TensorMsg becomes ArrayData."""
    return msg_to_array(v) if isinstance(v, TensorMsg) else v


def array_rows(m: TensorMsg) -> list[ArrayData]:
    """The rows of an inline TensorMsg (dim 0), each as an ArrayData."""
    if m.shm is not None:
        raise ValueError("a shared-memory tensor reached a torch-free process; send it inline")
    return ArrayData.rows(m.dtype, tuple(m.shape), m.data or b"")


def event_values(stacked: TensorMsg | None, values: list) -> list:
    """The per-request values of a ClientOuts/Events message."""
    return array_rows(stacked) if stacked is not None else [plain_value(v) for v in values]
